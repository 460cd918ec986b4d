"""A daemon's OpenTelemetry traces: the span tree of a turn, and what never goes in it.

A daemon with its metrics and a `TraceObserver` fanned out (as `navi serve` makes it when
tracing is configured), the fake LLM over real HTTP, a real WebSocket client; the spans go
to the SDK's in-memory exporter. Every test has an absolute time limit; nothing sleeps.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from agent_tools import call, toolset, with_tools
from api_ws import Daemon, open_daemon
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext
from test_metrics import Gate
from test_peer import TOKEN_ENV, ask, to_b
from test_peer import config as peer_config

from navi_trio.api.metrics import DaemonMetrics
from navi_trio.api.traces import CONTENT_BYTES, OPEN_MAX, TraceObserver, WithTraceIds
from navi_trio.api.tracing import TRACESTATE_MAX_CHARS, content_recorded, trace_carrier
from navi_trio.cli.daemon import _JsonLines
from navi_trio.core.session import to_row
from navi_trio.core.turn import Observers, UserMessage
from navi_trio.events import (
    ApprovalDecided,
    ApprovalRequest,
    CompressionStarted,
    ContextCompressed,
    PlanPhase,
    StreamEnd,
    SubagentFinished,
    SubagentStarted,
    TaskUpdate,
    ToolResultEvent,
    ToolStarted,
)
from navi_trio.store import SQLiteStore
from navi_trio.store.base import HANDED_HOST, HANDED_PID
from navi_trio.testing import open_harness
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.spawn_agent import SpawnAgentTool

TIMEOUT = 30
SECRET_TEXT = "the-users-private-words-1234"


def tracer(
    exporter: InMemorySpanExporter | None = None,
) -> tuple[TracerProvider, InMemorySpanExporter]:
    """A provider of its own (a daemon's), exporting to `exporter` (one several share)."""
    exporter = exporter or InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def observer(exporter: InMemorySpanExporter) -> TraceObserver:
    return TraceObserver(tracer(exporter)[0].get_tracer("t"))


def context(span: ReadableSpan) -> SpanContext:
    found: SpanContext | None = span.context
    assert found is not None
    return found


def parent_of(span: ReadableSpan, spans: tuple[ReadableSpan, ...]) -> ReadableSpan | None:
    """The span `span` hangs under, among `spans`; None for a root."""
    if span.parent is None:
        return None
    [found] = [s for s in spans if context(s).span_id == span.parent.span_id]
    return found


class LoggingGate(Gate):
    """The gate, logging a line as it runs (inside the turn)."""

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        logging.getLogger("navi_trio.tests.traced").warning("the gate runs")
        return await super().execute(args, ctx)


async def run_turn(
    tmp_path: Path, observer: TraceObserver, gate: Gate | None = None
) -> tuple[DaemonMetrics, str]:
    gate = gate or Gate()
    gate.go.set()
    replies = [
        {**call("gate", fail=True), "prompt_tokens": 100, "completion_tokens": 7},
        {**call("gate"), "prompt_tokens": 110, "completion_tokens": 5},
        {"text": "all done", "prompt_tokens": 120, "completion_tokens": 3},
    ]
    metrics = DaemonMetrics()
    profile = with_tools(["gate"], planning_first_message=False)
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, metrics=metrics, observer=Observers(metrics, observer), replies=replies,
            tools=toolset(gate), profiles={"general": profile},
        ) as d:  # fmt: skip
            async with d.connect("alice") as alice:
                created = await alice.request({"type": "message", "content": SECRET_TEXT})
                await alice.until_end(created["session_id"])
            return metrics, d.tokens["alice"]


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


async def test_a_turn_is_one_trace_of_its_llm_calls_and_tools(tmp_path: Path) -> None:
    provider, exporter = tracer()
    _, token = await run_turn(tmp_path, TraceObserver(provider.get_tracer("t")))
    spans = exporter.get_finished_spans()
    [turn] = by_name(spans, "navi.turn")
    assert turn.parent is None
    assert turn.attributes is not None and turn.attributes["navi.turn.reason"] == "complete"
    chats = by_name(spans, "chat ")
    tools = by_name(spans, "execute_tool gate")
    assert len(chats) == 3 and len(tools) == 2, [s.name for s in spans]
    for child in (*chats, *tools):
        assert child.context is not None and turn.context is not None
        assert child.context.trace_id == turn.context.trace_id
        assert child.parent is not None and child.parent.span_id == turn.context.span_id
        assert child.start_time is not None and turn.start_time is not None
        assert child.end_time is not None and turn.end_time is not None
        assert turn.start_time <= child.start_time <= child.end_time <= turn.end_time
    first = min(chats, key=lambda s: s.start_time or 0)
    assert first.attributes is not None
    assert first.attributes["gen_ai.request.model"] == "qwen3:8b"
    assert first.attributes["gen_ai.usage.input_tokens"] == 100
    assert first.attributes["gen_ai.usage.output_tokens"] == 7
    assert "gen_ai.response.finish_reasons" in first.attributes
    assert "navi.llm.time_to_first_chunk" in first.attributes
    statuses = sorted(str((s.attributes or {})["navi.tool.status"]) for s in tools)
    assert statuses == ["failed", "ok"]
    # No content, no token: neither the user's words, the answer nor the tool's output.
    exported = repr([(s.name, dict(s.attributes or {})) for s in spans])
    for secret in (SECRET_TEXT, token, "all done", "let go", "asked to fail"):
        assert secret not in exported


async def test_content_is_recorded_only_when_asked_and_bounded(tmp_path: Path) -> None:
    provider, exporter = tracer()
    await run_turn(tmp_path, TraceObserver(provider.get_tracer("t"), content=True))
    spans = exporter.get_finished_spans()
    [turn] = by_name(spans, "navi.turn")
    assert (turn.attributes or {})["navi.turn.answer"] == "all done"


def test_content_is_recorded_only_when_navi_otel_content_is_1() -> None:
    assert content_recorded({"NAVI_OTEL_CONTENT": "1"})
    assert content_recorded({"NAVI_OTEL_CONTENT": " 1 "})
    for off in ({}, {"NAVI_OTEL_CONTENT": ""}, {"NAVI_OTEL_CONTENT": "0"}):
        assert not content_recorded(off)
    for other in ("true", "yes", "2"):
        assert not content_recorded({"NAVI_OTEL_CONTENT": other})


def test_the_remote_parents_waiting_for_a_turn_are_capped_oldest_dropped() -> None:
    # Each message's trace context waits for its session's next turn; a client sending
    # to many sessions that never run keeps at most OPEN_MAX of them.
    provider, exporter = tracer()
    obs = TraceObserver(provider.get_tracer("t"))
    for i in range(OPEN_MAX + 1):
        obs.continue_trace(f"s{i}", {"traceparent": f"00-{i + 1:032x}-{i + 1:016x}-01"})
    for sid in ("s0", "s1", f"s{OPEN_MAX}"):
        obs.event(sid, StreamEnd(text="answer"))
    turns = {
        (s.attributes or {})["navi.session_id"]: s
        for s in by_name(exporter.get_finished_spans(), "navi.turn")
    }
    assert turns["s0"].parent is None  # the oldest, dropped: a trace of its own
    for i in (1, OPEN_MAX):
        parent = turns[f"s{i}"].parent
        assert parent is not None and parent.is_remote and parent.trace_id == i + 1


def test_plan_subagent_approval_and_job_spans_hang_where_they_belong() -> None:
    # A unit test: the observer's calls as a session would publish them, in order.
    provider, exporter = tracer()
    obs = TraceObserver(provider.get_tracer("t"), content=True)
    sid = "s1"
    for event in (
        PlanPhase(phase="planning"),
        PlanPhase(phase="planning", status="done"),
        SubagentStarted(profile_id="researcher", task=SECRET_TEXT, agent_id="a1"),
        ToolStarted(call_id="c1", name="shell", arguments={"cmd": SECRET_TEXT}, agent_id="a1"),
        ToolResultEvent(call_id="c1", name="shell", ok=True, output="x" * 10_000, agent_id="a1"),
        SubagentFinished(completed=True, text=SECRET_TEXT, agent_id="a1"),
        ToolStarted(call_id="c2", name="write_file"),
        ApprovalRequest(call_id="c2", tool="write_file", summary=SECRET_TEXT, rule="writes"),
        ApprovalDecided(call_id="c2", approved=True),
        ToolResultEvent(call_id="c2", name="write_file", ok=True),
        CompressionStarted(reason="mid_turn", tokens_before=900),
        ContextCompressed(reason="mid_turn", tokens_before=900, tokens_after=300),
        TaskUpdate(task_id="j1", tool="shell", status="running", args_summary=SECRET_TEXT),
        StreamEnd(text="answer"),
    ):
        obs.event(sid, event)
    obs.event(sid, TaskUpdate(task_id="j1", tool="shell", status="completed"))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    turn = spans["navi.turn"]

    def parent(name: str) -> str:
        span = spans[name].parent
        assert span is not None
        [found] = [n for n, s in spans.items() if s.context and s.context.span_id == span.span_id]
        return found

    assert parent("navi.plan planning") == "navi.turn"
    assert parent("invoke_agent researcher") == "navi.turn"
    assert parent("execute_tool shell") == "invoke_agent researcher"
    assert parent("execute_tool write_file") == "navi.turn"
    assert parent("navi.approval") == "execute_tool write_file"
    assert parent("navi.compress") == "navi.turn"
    job = spans["navi.job shell"]
    assert job.parent is None and turn.context is not None
    assert [link.context.span_id for link in job.links] == [turn.context.span_id]
    assert (job.attributes or {})["navi.job.status"] == "completed"
    assert (spans["navi.approval"].attributes or {})["navi.approval.approved"] is True
    output = (spans["execute_tool shell"].attributes or {})["navi.tool.output"]
    assert output == "x" * CONTENT_BYTES  # content, when asked, is bounded in bytes
    # Arguments, tasks and summaries are never recorded, even with content on.
    exported = repr([(s.name, dict(s.attributes or {})) for s in spans.values()])
    assert SECRET_TEXT not in exported


async def test_each_line_logged_in_a_turn_names_its_trace_and_span(tmp_path: Path) -> None:
    provider, exporter = tracer()
    logger = logging.getLogger("navi_trio.tests.traced")
    json_out, plain_out = io.StringIO(), io.StringIO()
    as_json, plain = logging.StreamHandler(json_out), logging.StreamHandler(plain_out)
    as_json.setFormatter(WithTraceIds(_JsonLines()))
    plain.setFormatter(WithTraceIds(logging.Formatter("%(levelname)s %(message)s")))
    for handler in (as_json, plain):
        logger.addHandler(handler)
    try:
        await run_turn(tmp_path, TraceObserver(provider.get_tracer("t")), LoggingGate())
        logger.warning("after the turn")
    finally:
        for handler in (as_json, plain):
            logger.removeHandler(handler)
    [turn] = by_name(exporter.get_finished_spans(), "navi.turn")
    assert turn.context is not None
    trace_id, span_id = f"{turn.context.trace_id:032x}", f"{turn.context.span_id:016x}"
    lines = [json.loads(line) for line in json_out.getvalue().splitlines()]
    assert [line["message"] for line in lines] == ["the gate runs"] * 2 + ["after the turn"]
    for line in lines[:2]:
        assert (line["trace_id"], line["span_id"]) == (trace_id, span_id)
    assert "trace_id" not in lines[2]
    assert plain_out.getvalue().splitlines() == [
        f"WARNING the gate runs trace_id={trace_id} span_id={span_id}",
    ] * 2 + ["WARNING after the turn"]


@asynccontextmanager
async def peers(
    tmp_path: Path, exporter: InMemorySpanExporter, monkeypatch: Any, **a: Any
) -> AsyncIterator[tuple[Daemon, Daemon]]:
    """(A, B): B traced to `exporter`, answering once; A with `a` (its replies, observer,
    config: by default the asker profile, B as peer ``b``), its token for B set."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with open_daemon(
        tmp_path / "b", replies=[{"text": "B says forty-two"}],
        config=peer_config(default="plain"), observer=observer(exporter),
    ) as b:  # fmt: skip
        a.setdefault("replies", [ask("What is 6*7?"), {"text": "A is done"}])
        config = a.pop("config", None) or (lambda b: peer_config(to_b(b), default="asker"))
        async with open_daemon(tmp_path / "a", config=config(b), **a) as daemon_a:
            monkeypatch.setenv(TOKEN_ENV, b.tokens["alice"])
            yield daemon_a, b


async def test_a_peer_ask_carries_the_trace_so_one_trace_holds_both_daemons(
    tmp_path: Path, monkeypatch: Any
) -> None:
    exporter = InMemorySpanExporter()  # both daemons export here
    with trio.fail_after(TIMEOUT):
        async with peers(tmp_path, exporter, monkeypatch, observer=observer(exporter)) as (a, _):
            async with a.connect("alice") as alice:
                created = await alice.request({"type": "message", "content": "ask b"})
                end = await alice.until_end(created["session_id"])
                assert end["text"] == "A is done"
    spans = exporter.get_finished_spans()
    turns = by_name(spans, "navi.turn")
    [peer] = by_name(spans, "execute_tool peer")
    assert (peer.attributes or {})["navi.tool.status"] == "ok"
    [a_turn] = [t for t in turns if t.parent is None]
    [b_turn] = [t for t in turns if t is not a_turn]
    assert parent_of(peer, spans) is a_turn
    # B's turn is a child of A's peer call, across the wire: one trace.
    assert b_turn.parent is not None and b_turn.parent.is_remote
    assert parent_of(b_turn, spans) is peer
    assert context(b_turn).trace_id == context(a_turn).trace_id
    [b_chat] = [s for s in by_name(spans, "chat ") if parent_of(s, spans) is b_turn]
    assert context(b_chat).trace_id == context(a_turn).trace_id


async def test_a_daemon_that_does_not_trace_sends_no_trace_context(
    tmp_path: Path, monkeypatch: Any
) -> None:
    exporter = InMemorySpanExporter()  # B's only: A has its metrics, no tracer
    with trio.fail_after(TIMEOUT):
        async with peers(tmp_path, exporter, monkeypatch, metrics=DaemonMetrics()) as (a, _):
            async with a.connect("alice") as alice:
                created = await alice.request({"type": "message", "content": "ask b"})
                await alice.until_end(created["session_id"])
    [b_turn] = by_name(exporter.get_finished_spans(), "navi.turn")
    assert b_turn.parent is None  # a trace of B's own


async def test_a_background_peer_ask_leaves_its_ended_call_alone(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Its call's span ended with the turn's "started in the background" result: the
    peer's run is a trace of its own, and no second span is opened for the call."""
    exporter = InMemorySpanExporter()
    replies = [ask("What is 6*7?", background=True), {"text": "A is done"}]
    with trio.fail_after(TIMEOUT):
        async with peers(
            tmp_path, exporter, monkeypatch, replies=replies, observer=observer(exporter)
        ) as (a, _):
            async with a.connect("alice") as alice:
                created = await alice.request({"type": "message", "content": "ask b"})
                sid = created["session_id"]
                await alice.until_end(sid)
                await alice.until_type("task_update", session_id=sid, status="completed")
    spans = exporter.get_finished_spans()
    [peer] = by_name(spans, "execute_tool peer")
    [a_turn] = [t for t in by_name(spans, "navi.turn") if parent_of(peer, spans) is t]
    [b_turn] = [t for t in by_name(spans, "navi.turn") if t is not a_turn]
    assert b_turn.parent is None
    [job] = by_name(spans, "navi.job peer")
    assert [link.context.span_id for link in job.links] == [context(a_turn).span_id]


def test_a_trace_context_is_kept_only_when_well_formed_and_bounded() -> None:
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert trace_carrier(good, None) == {"traceparent": good}
    assert trace_carrier(good, "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE") == {
        "traceparent": good, "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
    }  # fmt: skip
    assert trace_carrier(good, "t@vendor=x") == {"traceparent": good, "tracestate": "t@vendor=x"}
    for bad in (
        None,
        7,
        ["x"],
        {"a": 1},
        "",
        good.upper(),
        good + "-",
        good[:-1],
        " " + good,
        "01" + good[2:],  # another version: not ours to read
        "00-" + "0" * 32 + good[35:],  # an all-zero trace id
        good[:36] + "0" * 16 + good[52:],  # an all-zero parent id
        good + "x" * 100_000,
    ):
        assert trace_carrier(bad, "a=b") is None, bad
    # A bad tracestate is left out; the traceparent stays.
    members = ",".join(f"k{i}=v" for i in range(33))
    for bad_state in (
        7,
        "",
        "=v",
        "K=v",
        "k=",
        "k=v=w",
        "k=\x00",
        "k=é",
        members,
        "k=" + "v" * TRACESTATE_MAX_CHARS,
    ):
        assert trace_carrier(good, bad_state) == {"traceparent": good}, bad_state


async def test_a_bad_trace_context_is_dropped_and_the_message_still_runs(
    tmp_path: Path,
) -> None:
    exporter = InMemorySpanExporter()
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sent: list[dict[str, Any]] = [
        {"traceparent": 12345},
        {"traceparent": "00-not-a-trace", "tracestate": "a=b"},
        {"traceparent": good + "x" * 10_000},
        {"tracestate": "a=b"},
        {"traceparent": good, "tracestate": {"not": "text"}},
    ]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=[{"text": "ran"}], loop=True, observer=observer(exporter),
            profiles={"general": with_tools([], planning_first_message=False)},
        ) as d, d.connect("alice") as alice:  # fmt: skip
            for fields in sent:
                ok = await alice.request({"type": "message", "content": "hi", **fields})
                assert ok["type"] != "error", ok
                end = await alice.until_end(ok["session_id"])
                assert end["reason"] == "complete"
    turns = by_name(exporter.get_finished_spans(), "navi.turn")
    assert len(turns) == len(sent)
    # Only the last one's traceparent was good: that turn continues it, without a state.
    assert [t.parent is None for t in turns] == [True] * 4 + [False]
    remote = turns[-1].parent
    assert remote is not None and f"{remote.trace_id:032x}" == good[3:35]
    assert f"{remote.span_id:016x}" == good[36:52] and not remote.trace_state


async def test_a_subagents_llm_calls_hang_under_its_span(tmp_path: Path) -> None:
    provider, exporter = tracer()
    replies = [
        call("spawn_agent", task="Dig"),
        {"text": "the sub-agent's report"},
        {"text": "done"},
    ]
    profile = with_tools(["spawn_agent"], planning_first_message=False)
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, observer=TraceObserver(provider.get_tracer("t")),
            tools=toolset(SpawnAgentTool()), profiles={"general": profile},
        ) as d, d.connect("alice") as alice:  # fmt: skip
            created = await alice.request({"type": "message", "content": "dig"})
            await alice.until_end(created["session_id"])
    spans = exporter.get_finished_spans()
    [turn] = by_name(spans, "navi.turn")
    [agent] = by_name(spans, "invoke_agent ")
    assert parent_of(agent, spans) is turn
    chats = sorted(by_name(spans, "chat "), key=lambda s: s.start_time or 0)
    assert [parent_of(c, spans) for c in chats] == [turn, agent, turn]
    assert agent.start_time is not None and agent.end_time is not None
    assert agent.start_time <= (chats[1].start_time or 0) <= (chats[1].end_time or 0)
    assert (chats[1].end_time or 0) <= agent.end_time


SENDER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def assert_continues(turn: ReadableSpan, traceparent: str) -> None:
    """`turn` is a child of the remote span `traceparent` names, in its trace."""
    remote = turn.parent
    assert remote is not None and remote.is_remote
    assert f"{context(turn).trace_id:032x}" == traceparent[3:35]
    assert f"{remote.span_id:016x}" == traceparent[36:52]


async def test_a_queued_message_keeps_its_trace_context(tmp_path: Path) -> None:
    """A message that waits behind a running turn continues its sender's trace when it runs."""
    exporter = InMemorySpanExporter()
    gate = Gate()
    replies = [call("gate"), {"text": "first"}, {"text": "second"}]
    profile = with_tools(["gate"], planning_first_message=False)
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate), observer=observer(exporter),
            profiles={"general": profile},
        ) as d, d.connect("alice") as alice:  # fmt: skip
            first = await alice.request({"type": "message", "content": "one"})
            sid = first["session_id"]
            await gate.entered.wait()
            queued = await alice.request({
                "type": "message", "content": "two", "session_id": sid,
                "on_busy": "enqueue", "traceparent": SENDER, "tracestate": "rojo=1",
            })  # fmt: skip
            assert queued["type"] != "error", queued
            gate.go.set()
            assert (await alice.until_end(sid))["text"] == "first"
            assert (await alice.until_end(sid))["text"] == "second"
    first_turn, second_turn = by_name(exporter.get_finished_spans(), "navi.turn")
    assert first_turn.parent is None
    assert_continues(second_turn, SENDER)
    assert second_turn.parent is not None and second_turn.parent.trace_state.get("rojo") == "1"


async def test_a_queued_message_run_after_a_restart_keeps_its_trace_context(
    tmp_path: Path,
) -> None:
    """The trace context travels in the queued row: the daemon that adopts it (here, after a
    graceful restart) continues the sender's trace; a row of an older daemon has none."""
    exporter = InMemorySpanExporter()
    gate = Gate()
    profiles = {"general": with_tools(["gate"], planning_first_message=False)}
    carrier = {"traceparent": SENDER, "tracestate": "rojo=1"}
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[call("gate")], tools=toolset(gate), profiles=profiles
        ) as h:
            s = await h.session("s1")
            s.send("hi")
            await gate.entered.wait()
            queued = UserMessage("queued at shutdown", trace=carrier)
            s.actor.send_message(queued)
            await queued.accepted.wait()
        replies = [{"text": "now"}]
        async with open_harness(
            tmp_path,
            replies=replies,
            tools=toolset(gate),
            profiles=profiles,
            observer=observer(exporter),
        ) as h2:
            h2.runtime.sessions.adopt = True
            await (await h2.session("s1")).idle()
    [turn] = by_name(exporter.get_finished_spans(), "navi.turn")
    assert_continues(turn, SENDER)
    assert turn.parent is not None and turn.parent.trace_state.get("rojo") == "1"


async def test_a_handed_row_keeps_its_trace_and_an_old_or_bad_one_runs_without(
    tmp_path: Path,
) -> None:
    """Rows queued for the daemon that runs the session (as `Cluster.hand_over` writes
    them): the one with a carrier continues it; a row of an older daemon (no carrier)
    runs as a trace of its own; a stored tracestate past the bound is left out."""
    exporter = InMemorySpanExporter()
    handed = to_row(UserMessage("handed", trace={"traceparent": SENDER, "tracestate": "rojo=1"}))
    old = {k: v for k, v in to_row(UserMessage("old")).items() if k != "trace"}
    state = ",".join(f"k{n}={'v' * 20}" for n in range(25))  # well formed, over 512 chars
    assert len(state) > TRACESTATE_MAX_CHARS
    big = {**to_row(UserMessage("big")), "trace": {"traceparent": SENDER, "tracestate": state}}
    no_plan = {"general": with_tools([], planning_first_message=False)}
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            await store.create_session("s1", profile_id="general")
            for key, row in (("k1", handed), ("k2", old), ("k3", big)):
                await store.enqueue("s1", key, row, pid=HANDED_PID, host=HANDED_HOST)
        replies = [{"text": f"ran {n}"} for n in range(3)]
        async with open_harness(
            tmp_path, replies=replies, profiles=no_plan, observer=observer(exporter)
        ) as h:
            h.runtime.sessions.adopt = True
            await (await h.session("s1")).idle()
            users = [m["content"] for m in await h.runtime.store.load_messages("s1")]
            assert users[::2] == ["handed", "old", "big"]
    first, second, third = by_name(exporter.get_finished_spans(), "navi.turn")
    assert_continues(first, SENDER)
    assert first.parent is not None and first.parent.trace_state.get("rojo") == "1"
    assert second.parent is None
    assert_continues(third, SENDER)
    assert third.parent is not None and not third.parent.trace_state
