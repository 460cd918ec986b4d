"""The daemon's /metrics, /healthz and /readyz, over real HTTP on the daemon's own port.

A daemon as `navi serve` makes it (its `DaemonMetrics` observing the core, the server
serving them), the fake LLM over real HTTP, real WebSocket clients on 127.0.0.1. The
page is parsed with prometheus_client's own parser, so each figure is read as Prometheus
would read it. Every test has an absolute time limit; nothing sleeps.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio
from agent_tools import call, toolset, with_tools
from api_ws import Daemon, open_daemon
from prometheus_client.parser import text_string_to_metric_families

from navi_trio.api.metrics import DaemonMetrics
from navi_trio.cli.doctor import readiness, readiness_line
from navi_trio.core.turn import LLMCallDone, Observer, Observers
from navi_trio.events import AgentEvent, StreamEnd, TextDelta
from navi_trio.tools.base import ToolContext, ToolResult

TIMEOUT = 30


class Gate:
    """A tool that waits until the test lets it go, or fails when asked to."""

    name = "gate"
    description = "waits for the test"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.go = trio.Event()

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if args.get("fail"):
            return ToolResult.fail("asked to fail")
        self.entered.set()
        await self.go.wait()
        return ToolResult.success("let go")


@asynccontextmanager
async def daemon(
    tmp_path: Path, replies: list[dict[str, Any]], gate: Gate, **settings: Any
) -> AsyncIterator[tuple[Daemon, DaemonMetrics]]:
    metrics = DaemonMetrics()
    profile = with_tools(["gate"], planning_first_message=False)
    async with open_daemon(
        tmp_path, metrics=metrics, replies=replies, tools=toolset(gate),
        profiles={"general": profile}, **settings,
    ) as d:  # fmt: skip
        yield d, metrics


async def get(d: Daemon, path: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(f"http://127.0.0.1:{d.port}{path}", headers=headers)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape: (name, sorted labels) -> value."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


async def scrape(d: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await get(d, "/metrics", d.tokens["root"])
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return samples(response.text)


async def test_each_metric_moves_with_what_the_daemon_does(tmp_path: Path) -> None:
    gate = Gate()
    replies = [
        {**call("gate", fail=True), "prompt_tokens": 100, "completion_tokens": 7},
        {"text": "first done", "prompt_tokens": 120, "completion_tokens": 3},
        {**call("gate"), "prompt_tokens": 50, "completion_tokens": 5},
        {"text": "never sent: the turn is stopped in the gate"},
    ]
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, replies, gate) as (d, _):
            before = await scrape(d)
            assert before[("navi_runs_active", ())] == 0
            assert ("navi_runs_total", (("reason", "complete"),)) not in before
            async with d.connect("alice") as alice:
                created = await alice.request({"type": "message", "content": "one"})
                sid = created["session_id"]
                await alice.until_end(sid)
                await alice.request({"type": "message", "session_id": sid, "content": "two"})
                await gate.entered.wait()
                during = await scrape(d)
                stopped = await alice.request({"type": "stop", "session_id": sid})
                assert stopped.get("stopped") is True, stopped
                end = await alice.until_end(sid)
                assert end["reason"] == "stopped", end
                # The run said its end and still lets its lease go: it counts as active
                # until the session is idle.
                actor = d.harness.runtime.sessions.actor(sid)
                assert actor is not None
                await actor.idle.wait()
                after = await scrape(d)
    model = (("model", "qwen3:8b"),)
    assert during[("navi_runs_active", ())] == 1
    assert during[("navi_sessions_live", ())] == 1
    assert during[("navi_ws_connections", ())] == 1
    assert after[("navi_runs_total", (("reason", "complete"),))] == 1
    assert after[("navi_runs_total", (("reason", "stopped"),))] == 1
    assert after[("navi_runs_active", ())] == 0
    # The tokens are the sums of what the fake LLM reported, by direction.
    assert after[("navi_llm_tokens_total", (("direction", "in"), *model))] == 270
    assert after[("navi_llm_tokens_total", (("direction", "out"), *model))] == 15
    assert after[("navi_llm_request_seconds_count", model)] == 3
    assert after[("navi_llm_first_chunk_seconds_count", model)] == 3
    assert after[("navi_tool_calls_total", (("status", "failed"), ("tool", "gate")))] == 1
    assert after[("navi_tool_calls_total", (("status", "stopped"), ("tool", "gate")))] == 1
    assert after[("navi_tool_seconds_count", (("tool", "gate"),))] == 2
    assert after[("navi_stop_seconds_count", ())] == 1
    assert after[("navi_ws_frames_sent_total", ())] > during[("navi_ws_frames_sent_total", ())]
    assert after[("process_resident_memory_bytes", ())] > 0
    # Every write of the run (its messages, its end) was timed to its commit.
    assert (
        after[("navi_store_write_seconds_count", ())]
        > before[("navi_store_write_seconds_count", ())]
    )


class Recorder:
    """An observer that keeps the type of each event it is called for."""

    def __init__(self, deltas: bool) -> None:
        self.deltas = deltas
        self.kinds: list[type[AgentEvent]] = []

    def llm_call(self, done: LLMCallDone) -> None:
        pass

    def event(self, session_id: str, event: AgentEvent) -> None:
        self.kinds.append(type(event))

    def stopped(self, seconds: float) -> None:
        pass


async def _observed(tmp_path: Path, observer: Observer) -> None:
    """One turn of a streamed answer (three deltas) under `observer`."""
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, observer=observer, replies=[{"text": "one two three"}],
            profiles={"general": with_tools([], planning_first_message=False)},
        ) as d, d.connect("alice") as alice:  # fmt: skip
            created = await alice.request({"type": "message", "content": "go"})
            await alice.until_end(created["session_id"])


async def test_an_observer_that_ignores_deltas_is_not_called_for_them(tmp_path: Path) -> None:
    """A stream costs an observer that says ``deltas = False`` no call per token, alone
    or beside one that wants them (which still gets every delta); both see the rest."""
    alone = Recorder(deltas=False)
    await _observed(tmp_path / "alone", alone)
    quiet, loud = Recorder(deltas=False), Recorder(deltas=True)
    await _observed(tmp_path / "both", Observers(quiet, loud))
    assert loud.kinds.count(TextDelta) == 3, loud.kinds
    for recorder in (alone, quiet):
        assert TextDelta not in recorder.kinds, recorder.kinds
        assert StreamEnd in recorder.kinds
    assert quiet.kinds == [k for k in loud.kinds if k is not TextDelta]


async def test_metrics_need_an_admins_token_or_the_metrics_token(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, [], Gate(), metrics_token="scrape-me") as (d, _):
            nobody = await get(d, "/metrics")
            assert nobody.status_code == 401 and "Bearer" in nobody.headers["www-authenticate"]
            assert "navi_" not in nobody.text
            user = await get(d, "/metrics", d.tokens["alice"])
            assert user.status_code == 401 and "admins" in user.text, user.text
            wrong = await get(d, "/metrics", "navi_not_a_token")
            assert wrong.status_code == 401 and "navi_" not in wrong.text.replace("navi_not", "")
            scraper = await get(d, "/metrics", "scrape-me")
            assert scraper.status_code == 200 and "navi_runs_active" in scraper.text
            admin = await get(d, "/metrics", d.tokens["root"])
            assert admin.status_code == 200


async def test_health_and_readiness(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, [], Gate()) as (d, _):
            alive = await get(d, "/healthz")
            assert (alive.status_code, alive.text) == (200, "ok\n")
            ready = await get(d, "/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json()["checks"]["store"] == {"ok": True}
            assert ready.json()["checks"]["llm"]["ok"] is True
        # An LLM endpoint nobody answers at: not ready, and the check says where.
        async with daemon(tmp_path / "b", [], Gate(), llm_url="http://127.0.0.1:9") as (d, _):
            ready = await get(d, "/readyz")
            assert ready.status_code == 503, ready.text
            llm = ready.json()["checks"]["llm"]
            assert llm["ok"] is False and "127.0.0.1:9" in llm["detail"], llm
            assert ready.json()["checks"]["store"]["ok"] is True


async def test_a_private_server_serves_no_metrics(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d:
            response = await get(d, "/metrics", d.tokens["root"])
            assert response.status_code == 404 and "navi serve" in response.text


async def test_navi_doctor_shows_the_daemons_readiness(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, [], Gate()) as (d, _):
            ready = await readiness(d.url)
        async with daemon(tmp_path / "b", [], Gate(), llm_url="http://127.0.0.1:9") as (d, _):
            down = await readiness(d.url)
        gone = await readiness(d.url)  # nothing listens there any more
    assert readiness_line(ready) == "ready: llm ok, store ok"
    assert readiness_line(down).startswith("NOT READY: llm FAILED (http://127.0.0.1:9")
    assert readiness_line(down).endswith(", store ok")
    assert readiness_line(gone).startswith("readiness unknown: http://127.0.0.1:")


SUFFIX = r"_(total|bucket|count|sum)$"
DASHBOARD = Path(__file__).resolve().parent.parent / "docs/pages/grafana/navi-dashboard.json"


async def test_the_grafana_dashboard_asks_only_for_metrics_the_daemon_serves(
    tmp_path: Path,
) -> None:
    """Each expression of the shipped dashboard names series a daemon really exports
    (a renamed metric would leave a panel empty without an error anywhere)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    wanted = {name for e in exprs for name in re.findall(r"\b(?:navi|process)_[a-z_]+", e)}
    gate = Gate()
    replies = [{**call("gate", fail=True)}, {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, replies, gate) as (d, _), d.connect("alice") as alice:
            created = await alice.request({"type": "message", "content": "go"})
            await alice.until_end(created["session_id"])
            page = (await get(d, "/metrics", d.tokens["root"])).text
    served = set()
    for family in text_string_to_metric_families(page):
        served.add(family.name)
        served.update(s.name for s in family.samples)
    # A family with no sample yet (a counter no call has labelled) is served by its name.
    missing = {n for n in wanted if n not in served and re.sub(SUFFIX, "", n) not in served}
    assert len(exprs) >= 16 and wanted and not missing, sorted(missing)
