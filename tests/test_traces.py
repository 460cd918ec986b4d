"""A daemon's OpenTelemetry traces: the span tree of a turn, and what never goes in it.

A daemon with its metrics and a `TraceObserver` fanned out (as `navi serve` makes it when
tracing is configured), the fake LLM over real HTTP, a real WebSocket client; the spans go
to the SDK's in-memory exporter. Every test has an absolute time limit; nothing sleeps.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import trio
from agent_tools import call, toolset, with_tools
from api_ws import open_daemon
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_metrics import Gate

from navi_trio.api.metrics import DaemonMetrics
from navi_trio.api.traces import CONTENT_BYTES, TraceObserver, WithTraceIds
from navi_trio.cli.daemon import _JsonLines
from navi_trio.core.turn import Observers
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
from navi_trio.tools.base import ToolContext, ToolResult

TIMEOUT = 30
SECRET_TEXT = "the-users-private-words-1234"


def tracer() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


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
