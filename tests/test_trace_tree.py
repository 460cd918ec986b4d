"""One scripted daemon turn, traced whole: planning, two tool calls (one approved), a
sub-agent, a background job and a peer ask, as the span tree an operator sees.

Two daemons in this process (A, whose model does all of it, and B, the peer A asks),
each with its own tracer exporting to one in-memory exporter, each with its fake LLM
on 127.0.0.1; the turn is sent and approved over a real WebSocket connection. Nothing
sleeps; every wait is on a frame, under an absolute time limit.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import trio
from agent_tools import EchoTool, call, toolset, with_tools
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_peer import ask, to_b
from test_traces import by_name, context, observer, parent_of, peers

from navi_trio.api.peer_link import WsPeerLink
from navi_trio.profiles import ConfigSource, parse_config
from navi_trio.settings import default_config_path
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.peer import PeerTool
from navi_trio.tools.spawn_agent import SpawnAgentTool

TIMEOUT = 60
SECRET = "the-users-private-words-5678"
PLAN = """Complexity: simple
Milestones:
- Everything asked is done
Steps:
1. Do all of it — SELF
"""
POLICY = {
    "rules": [
        {"tool": "note", "decision": "ask"},
        {"tool": "peer", "decision": "allow"},
        {"tool": "echo", "decision": "allow"},
        {"tool": "spawn_agent", "decision": "allow"},
    ]
}


class NoteTool:
    """A tool the policy asks about: it runs once the owner approves."""

    name = "note"
    description = "takes a note"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.success("noted")


def a_config(peers: dict[str, Any]) -> ConfigSource:
    """The shipped config, its default profile offering the turn's tools, and `peers`."""
    path = default_config_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    data["profiles"]["traced"] = with_tools(["echo", "note", "spawn_agent", "peer"], policy=POLICY)
    data["default_profile"] = "traced"
    data["peers"] = peers
    return ConfigSource(path, initial=parse_config(data, path))


def attrs_of(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def one(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    [span] = [s for s in spans if s.name == name]
    return span


async def test_a_scripted_turn_is_one_span_tree_across_both_daemons(
    tmp_path: Path, monkeypatch: Any
) -> None:
    exporter = InMemorySpanExporter()
    a_replies = [
        {"text": "A few things to do.\nREFLECT: yes"},  # planning: the analysis
        {"text": PLAN},  # the plan
        call("echo", text="first"),
        call("note"),  # asks: the owner approves it
        call("spawn_agent", task="Dig"),
        {"text": "the sub-agent's report", "prompt_tokens": 40, "completion_tokens": 4},
        call("echo", text="later", background=True),
        ask("What is 6*7?"),
        {"text": "all done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with peers(
            tmp_path, exporter, monkeypatch, replies=a_replies, observer=observer(exporter),
            config=lambda b: a_config(to_b(b)),
            tools=toolset(EchoTool(), NoteTool(), SpawnAgentTool(), PeerTool(WsPeerLink())),
            backgroundable_tools=("echo",),
        ) as (a, b):  # fmt: skip
            async with a.connect("alice") as alice:
                created = await alice.request({"type": "message", "content": SECRET})
                sid = created["session_id"]
                request = await alice.until_type("approval_request", session_id=sid)
                asked_at = time.time_ns()  # the span waits at least from here on
                await alice.request(
                    {"type": "approve", "session_id": sid, "call_id": request["call_id"]}
                )
                end = await alice.until_end(sid)
                assert end["text"] == "all done", end
                await alice.until_type("task_update", session_id=sid, status="completed")
    spans = exporter.get_finished_spans()
    names = sorted(s.name for s in spans)
    [turn] = [s for s in by_name(spans, "navi.turn") if s.parent is None]
    assert attrs_of(turn)["navi.turn.reason"] == "complete"

    def under(span: ReadableSpan) -> list[str]:
        return sorted(s.name for s in spans if parent_of(s, spans) is span)

    # The planning phases, the LLM calls, the tool calls and the sub-agent: the turn's.
    plans = by_name(spans, "navi.plan ")
    assert plans and all(parent_of(p, spans) is turn for p in plans), names
    tools = ["execute_tool echo"] * 2 + ["execute_tool note", "execute_tool peer"]
    tools.append("execute_tool spawn_agent")
    assert [n for n in under(turn) if n.startswith("execute_tool")] == sorted(tools), names
    [agent] = by_name(spans, "invoke_agent ")
    assert parent_of(agent, spans) is turn
    assert attrs_of(agent)["navi.agent.completed"] is True
    [sub_chat] = [s for s in by_name(spans, "chat ") if parent_of(s, spans) is agent]
    assert attrs_of(sub_chat)["gen_ai.usage.input_tokens"] == 40
    a_chats = [s for s in by_name(spans, "chat ") if parent_of(s, spans) is turn]
    purposes = {attrs_of(s)["navi.llm.purpose"] for s in a_chats}
    assert "plan" in purposes and "answer" in purposes, purposes
    for chat in (*a_chats, sub_chat):
        assert attrs_of(chat)["gen_ai.request.model"] == "qwen3:8b"
    for tool in (s for s in spans if s.name.startswith("execute_tool")):
        assert attrs_of(tool)["navi.tool.status"] == "ok", (tool.name, attrs_of(tool))
    # The approval: a child of its call, spanning the owner's wait.
    note = one(spans, "execute_tool note")
    approval = one(spans, "navi.approval")
    assert parent_of(approval, spans) is note
    assert attrs_of(approval)["navi.approval.approved"] is True
    assert approval.start_time is not None and approval.end_time is not None
    assert approval.start_time <= asked_at <= approval.end_time
    # The background job: a trace of its own, linked to the turn that started it.
    job = one(spans, "navi.job echo")
    assert job.parent is None and context(job).trace_id != context(turn).trace_id
    assert [link.context.span_id for link in job.links] == [context(turn).span_id]
    assert attrs_of(job)["navi.job.status"] == "completed"
    assert attrs_of(job)["navi.tool.background"] is True
    # The peer ask: B's turn, and B's LLM call under it, are in A's trace.
    peer = one(spans, "execute_tool peer")
    [b_turn] = [s for s in by_name(spans, "navi.turn") if s is not turn]
    assert parent_of(b_turn, spans) is peer and b_turn.parent is not None
    assert b_turn.parent.is_remote
    assert [n for n in under(b_turn) if n.startswith("chat ")] == ["chat qwen3:8b"]
    in_a_trace = [s for s in spans if context(s).trace_id == context(turn).trace_id]
    assert b_turn in in_a_trace and job not in in_a_trace
    # No content and no token, anywhere.
    exported = repr([(s.name, attrs_of(s)) for s in spans])
    for secret in (SECRET, b.tokens["alice"], a.tokens["alice"], "all done", "forty-two"):
        assert secret not in exported
