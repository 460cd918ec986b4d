"""The daemon's Prometheus metrics, and what `/metrics` answers.

Counters and histograms move where things happen: the core's `Observer` calls and the
connections' writers. What is a state rather than a count (live sessions, running
turns, queue depth, jobs by state, approvals waiting, connections, deltas merged) is
read from the runtime when the endpoint is scraped, so nothing is kept twice. Only
`navi serve` makes one (prometheus_client is imported here only, so `navi run` never
loads it); each daemon has its own registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from navi_trio.core.turn import LLMCallDone
from navi_trio.events import (
    AgentEvent,
    ApprovalDecided,
    ApprovalRequest,
    StreamEnd,
    ToolResultEvent,
)

if TYPE_CHECKING:
    from navi_trio.api.services import DaemonCore

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds: an LLM call runs from well under a second to minutes (a local model's prefill).
LLM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
TOOL_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1, 5, 15, 60, 300, 1800)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)
STOP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


class Tally:
    """A count kept as a plain integer (``n += 1``: a prometheus `Counter` takes a lock
    each time), for an event as frequent as a frame."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class DaemonMetrics:
    """One daemon's metrics: the core's observer, and the page `/metrics` serves."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)
        self.runs = Counter(
            "navi_runs", "Top-level runs ended, by end reason", ["reason"], registry=r
        )
        self.llm_seconds = Histogram(
            "navi_llm_request_seconds",
            "LLM calls, from the request to the last chunk",
            ["model"],
            buckets=LLM_BUCKETS,
            registry=r,
        )
        self.llm_first = Histogram(
            "navi_llm_first_chunk_seconds",
            "LLM calls, from the request to the first chunk",
            ["model"],
            buckets=LLM_BUCKETS,
            registry=r,
        )
        self.llm_failed = Counter(
            "navi_llm_failed", "LLM calls that ended without an answer", ["model"], registry=r
        )
        self.tokens = Counter(
            "navi_llm_tokens",
            "Tokens the LLM reported, by model and direction",
            ["model", "direction"],
            registry=r,
        )
        self.tool_calls = Counter(
            "navi_tool_calls",
            "Tool calls ended, by tool and status",
            ["tool", "status"],
            registry=r,
        )
        self.tool_seconds = Histogram(
            "navi_tool_seconds",
            "Tool call durations",
            ["tool"],
            buckets=TOOL_BUCKETS,
            registry=r,
        )
        self.approvals = Counter(
            "navi_approvals",
            "Approvals asked, and answered by outcome",
            ["outcome"],
            registry=r,
        )
        self.stop_seconds = Histogram(
            "navi_stop_seconds",
            "From a stop asked to the turn's end",
            buckets=STOP_BUCKETS,
            registry=r,
        )
        # A plain count read at scrape (`_StateCollector`): it moves once a frame.
        self.frames_sent = Tally()
        self.store_write_seconds = Histogram(
            "navi_store_write_seconds",
            "Store writes, from the call to the commit",
            buckets=STORE_BUCKETS,
            registry=r,
        )
        self.frames_lagged = Counter(
            "navi_ws_subscriptions_lagged",
            "Times a client fell too far behind a session and missed frames (lagged)",
            registry=r,
        )
        # Given once the runtime and the server exist (`watch`).
        self._state: Callable[[], dict[str, float]] | None = None
        r.register(_StateCollector(self))

    # -- the core's Observer -----------------------------------------------------------

    def llm_call(self, done: LLMCallDone) -> None:
        model = done.model or "unknown"
        self.llm_seconds.labels(model).observe(done.seconds)
        if done.first_chunk_seconds is not None:
            self.llm_first.labels(model).observe(done.first_chunk_seconds)
        if done.failed:
            self.llm_failed.labels(model).inc()
        if done.prompt_tokens:
            self.tokens.labels(model, "in").inc(done.prompt_tokens)
        if done.completion_tokens:
            self.tokens.labels(model, "out").inc(done.completion_tokens)

    deltas = False  # nothing here counts tokens of a stream: deltas never come

    def event(self, session_id: str, event: AgentEvent) -> None:
        kind = type(event)
        if kind is ToolResultEvent:
            assert isinstance(event, ToolResultEvent)
            status = "stopped" if event.stopped else "ok" if event.ok else "failed"
            self.tool_calls.labels(event.name, status).inc()
            self.tool_seconds.labels(event.name).observe(event.duration_ms / 1000)
        elif kind is StreamEnd and not event.is_subagent:
            assert isinstance(event, StreamEnd)
            self.runs.labels(event.reason).inc()
        elif kind is ApprovalRequest:
            self.approvals.labels("asked").inc()
        elif kind is ApprovalDecided:
            assert isinstance(event, ApprovalDecided)
            self.approvals.labels("approved" if event.approved else "denied").inc()

    def stopped(self, seconds: float) -> None:
        self.stop_seconds.observe(seconds)

    # -- the api layer -------------------------------------------------------------------

    def watch(self, core: DaemonCore, connections: Callable[[], int]) -> None:
        """Read the daemon's state from `core` (and the server's open connections) at
        each scrape, and time its store's writes."""
        core.store.observe_writes(self.store_write_seconds.observe)

        def state() -> dict[str, float]:
            sessions, running, queued = core.sessions.counts()
            found: dict[str, float] = {
                "sessions": sessions,
                "runs": running,
                "queued": queued,
                "approvals_waiting": core.approvals.waiting_count(),
                "connections": connections(),
                "frames_merged": core.sessions.frames_merged.n,
            }
            for status, count in core.supervisor.states().items():
                found[f"jobs:{status}"] = count
            return found

        self._state = state

    def page(self) -> bytes:
        """The text a scrape gets."""
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """The gauges read at each scrape (`DaemonMetrics.watch`)."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        state = self.metrics._state() if self.metrics._state is not None else {}
        plain = {
            "sessions": ("navi_sessions_live", "Sessions with a live actor in this daemon"),
            "runs": ("navi_runs_active", "Turns running now in this daemon"),
            "queued": ("navi_queue_depth", "Messages waiting behind a running turn"),
            "approvals_waiting": ("navi_approvals_waiting", "Approvals waiting for an answer"),
            "connections": ("navi_ws_connections", "Open WebSocket connections"),
        }
        for key, (name, help_text) in plain.items():
            yield GaugeMetricFamily(name, help_text, value=state.get(key, 0))
        yield CounterMetricFamily(
            "navi_ws_frames_sent",
            "WebSocket frames written to clients",
            value=self.metrics.frames_sent.n,
        )
        yield CounterMetricFamily(
            "navi_frames_merged",
            "Text and thinking deltas merged into a waiting frame for a slow subscriber",
            value=state.get("frames_merged", 0),
        )
        jobs = GaugeMetricFamily(
            "navi_background_jobs", "Background jobs this daemon keeps, by state", labels=["state"]
        )
        for key, value in state.items():
            if key.startswith("jobs:"):
                jobs.add_metric([key.removeprefix("jobs:")], value)
        yield jobs

    def describe(self) -> Iterator[Metric]:
        return iter(())
