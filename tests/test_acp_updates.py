"""navi's session frames as ACP updates, checked against the protocol's published schema.

tests/acp_schema/schema.json is the Agent Client Protocol's JSON schema (protocol v1) as
published in github.com/agentclientprotocol/agent-client-protocol (schema/v1/schema.json
at b7f00054, Apache-2.0). Every payload the mapping makes is validated against its
definition there (``SessionNotification``, ``RequestPermissionRequest`` …), besides the
values a test expects.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import trio
import trio.testing

from navi_trio.acp import updates as up
from navi_trio.acp.jsonrpc import LineReader, LineTooLong

SCHEMA = Path(__file__).with_name("acp_schema") / "schema.json"
CWD = "/home/ann/project"


@cache
def _defs() -> dict[str, Any]:
    defs: dict[str, Any] = json.loads(SCHEMA.read_text(encoding="utf-8"))["$defs"]
    return defs


def valid(definition: str, value: Any) -> None:
    """`value` as the schema's `definition`, or a ValidationError saying where not."""
    schema = {"$ref": f"#/$defs/{definition}", "$defs": _defs()}
    jsonschema.Draft202012Validator(schema).validate(value)


def notified(update: dict[str, Any]) -> dict[str, Any]:
    valid("SessionNotification", {"sessionId": "s-1", "update": update})
    return update


def of(frames: list[dict[str, Any]], cwd: str = CWD) -> list[dict[str, Any]]:
    mapper = up.Updates(cwd)
    return [notified(u) for f in frames for u in mapper.of(f)]


def test_text_and_thinking_are_message_and_thought_chunks() -> None:
    got = of([
        {"type": "thinking_delta", "text": "hmm"},
        {"type": "text_delta", "text": "Hello"},
        {"type": "text_delta", "text": "inner", "is_subagent": True},
    ])  # fmt: skip
    assert got == [
        {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Hello"}},
    ]


def test_a_filesystem_write_is_an_edit_with_its_location_and_diff() -> None:
    args = {"action": "write", "path": "src/a.py", "content": "x = 1\n"}
    start, running, done = of([
        {"type": "tool_started", "call_id": "c1", "name": "filesystem", "arguments": args},
        {"type": "tool_result", "call_id": "c1", "name": "filesystem", "ok": True,
         "output": "wrote 6 characters"},
    ])  # fmt: skip
    assert start["sessionUpdate"] == "tool_call" and start["kind"] == "edit"
    assert start["locations"] == [{"path": f"{CWD}/src/a.py"}]
    assert start["rawInput"] == args and start["title"] == "write src/a.py"
    assert running == {"sessionUpdate": "tool_call_update", "toolCallId": "c1",
                       "status": "in_progress"}  # fmt: skip
    assert done["status"] == "completed"
    assert done["content"][1] == {
        "type": "diff", "path": f"{CWD}/src/a.py", "oldText": None, "newText": "x = 1\n"
    }  # fmt: skip


def test_an_edit_diffs_its_old_and_new_text_and_a_failure_has_none() -> None:
    args = {"action": "edit", "path": "/abs/b.txt", "old": "one", "new": "two"}
    _, _, done = of([
        {"type": "tool_started", "call_id": "c1", "name": "filesystem", "arguments": args},
        {"type": "tool_result", "call_id": "c1", "name": "filesystem", "ok": True},
    ])  # fmt: skip
    assert done["content"] == [
        {"type": "diff", "path": "/abs/b.txt", "oldText": "one", "newText": "two"}
    ]
    _, _, failed = of([
        {"type": "tool_started", "call_id": "c2", "name": "filesystem", "arguments": args},
        {"type": "tool_result", "call_id": "c2", "name": "filesystem", "ok": False,
         "error": "'old' text not found"},
    ])  # fmt: skip
    assert failed["status"] == "failed"
    assert [c["type"] for c in failed["content"]] == ["content"]


@pytest.mark.parametrize(
    ("name", "args", "kind"),
    [
        ("filesystem", {"action": "read", "path": "a"}, "read"),
        ("filesystem", {"action": "list"}, "search"),
        ("filesystem", {"action": "delete", "path": "a"}, "delete"),
        ("terminal", {"action": "run", "command": "ls"}, "execute"),
        ("spawn_agent", {"task": "look"}, "think"),
        ("peer", {}, "fetch"),
        ("mcp__web__fetch", {}, "fetch"),
        ("mcp__db__query", {}, "other"),
    ],
)
def test_each_tool_has_the_kind_that_fits(name: str, args: dict[str, Any], kind: str) -> None:
    (start, _) = of([{"type": "tool_started", "call_id": "c", "name": name, "arguments": args}])
    assert start["kind"] == kind


def test_live_output_sub_agents_and_background_jobs_are_tool_calls() -> None:
    got = of([
        {"type": "tool_event", "call_id": "c1", "name": "terminal",
         "data": {"stream": "output", "text": "line 1\n"}},
        {"type": "subagent_started", "agent_id": "a1", "profile_id": "researcher",
         "task": "find it"},
        {"type": "subagent_finished", "agent_id": "a1", "completed": True, "text": "found"},
        {"type": "task_update", "task_id": "t1", "tool": "terminal", "status": "running",
         "args_summary": "make"},
        {"type": "task_update", "task_id": "t1", "tool": "terminal", "status": "completed",
         "result_excerpt": "ok"},
    ])  # fmt: skip
    assert [(u["sessionUpdate"], u["toolCallId"], u.get("status")) for u in got] == [
        ("tool_call_update", "c1", None),
        ("tool_call", "agent-a1", "in_progress"),
        ("tool_call_update", "agent-a1", "completed"),
        ("tool_call", "task-t1", "in_progress"),
        ("tool_call_update", "task-t1", "completed"),
    ]
    assert got[0]["content"][0]["content"]["text"] == "line 1\n"
    assert got[1]["title"] == "sub-agent researcher: find it"


def test_the_plan_and_the_todo_list_are_plans_with_their_status() -> None:
    plan, todo = of([
        {"type": "plan", "text": "the plan", "steps": [
            {"index": 1, "description": "read"}, {"index": 2, "description": "write"}]},
        {"type": "todo_updated", "steps": [
            {"index": 1, "text": "read", "status": "done"},
            {"index": 2, "text": "write", "status": "in_progress"},
            {"index": 3, "text": "test", "status": "pending"}]},
    ])  # fmt: skip
    assert [(e["content"], e["status"]) for e in plan["entries"]] == [
        ("read", "pending"), ("write", "pending")
    ]  # fmt: skip
    assert [e["status"] for e in todo["entries"]] == ["completed", "in_progress", "pending"]


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        ({"reason": "complete"}, "end_turn"),
        ({"reason": "stopped", "stopped": True}, "cancelled"),
        ({"reason": "max_iterations"}, "max_turn_requests"),
        ({"reason": "budget_exhausted"}, "max_turn_requests"),
        ({"reason": "complete", "done_reason": "length"}, "max_tokens"),
    ],
)
def test_the_stop_reason_fits_how_the_run_ended(end: dict[str, Any], reason: str) -> None:
    answer = {"stopReason": up.stop_reason(end)}
    valid("PromptResponse", answer)
    assert answer["stopReason"] == reason


def test_usage_goes_with_the_answer() -> None:
    answer = {"stopReason": "end_turn", "usage": up.usage({"prompt_tokens": 10,
                                                          "completion_tokens": 5})}  # fmt: skip
    valid("PromptResponse", answer)
    assert answer["usage"] == {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15}


def test_a_history_replays_as_user_and_agent_chunks_and_tool_calls() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "write it"},
        {"role": "assistant", "content": "on it", "tool_calls": [{"id": "c1", "function": {
            "name": "filesystem", "arguments": {"action": "write", "path": "a", "content": "z"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "wrote 1 character"},
        {"role": "assistant", "content": "done"},
    ]  # fmt: skip
    got = [notified(u) for u in up.history(CWD, messages)]
    assert [u["sessionUpdate"] for u in got] == [
        "user_message_chunk", "agent_message_chunk", "tool_call", "tool_call_update",
        "agent_message_chunk",
    ]  # fmt: skip
    assert got[2]["kind"] == "edit" and got[3]["status"] == "completed"


def test_the_agent_s_own_payloads_are_valid() -> None:
    from navi_trio.acp.agent import PERMISSION_OPTIONS

    valid("RequestPermissionRequest", {
        "sessionId": "s-1", "options": PERMISSION_OPTIONS,
        "toolCall": {"toolCallId": "c1", "title": "$ ls", "kind": "execute", "status": "pending",
                     "content": [up.text_content("terminal run: ls")]},
    })  # fmt: skip


def test_live_output_shows_everything_so_far_and_keeps_its_tail() -> None:
    def event(text: str) -> dict[str, Any]:
        return {"type": "tool_event", "call_id": "c", "name": "terminal", "data": {"text": text}}

    first, second = of([event("line 1"), event("line 2\nline 3")])
    assert second["content"][0]["content"]["text"] == "line 1\nline 2\nline 3"
    (*_, last) = of([event("x" * up.TEXT_MAX), event("tail")])
    text = last["content"][0]["content"]["text"]
    assert len(text) == up.TEXT_MAX and text.endswith("x\ntail")


def test_a_long_text_is_cut() -> None:
    (chunk,) = of([{"type": "tool_event", "call_id": "c", "name": "t",
                    "data": {"text": "x" * (up.TEXT_MAX + 10)}}])  # fmt: skip
    assert len(chunk["content"][0]["content"]["text"]) == up.TEXT_MAX


def test_a_long_result_and_a_long_write_are_cut_too() -> None:
    big = "x" * (up.TEXT_MAX + 10)
    args = {"action": "write", "path": "a.txt", "content": big}
    *_, done = of([
        {"type": "tool_started", "call_id": "c1", "name": "filesystem", "arguments": args},
        {"type": "tool_result", "call_id": "c1", "name": "filesystem", "ok": True, "output": big},
    ])  # fmt: skip
    result, change = done["content"]
    assert len(result["content"]["text"]) == up.TEXT_MAX
    assert len(change["newText"]) == up.TEXT_MAX and change["newText"].endswith("…")
    assert len(done["rawOutput"]["output"]) == up.TEXT_MAX


async def test_a_line_over_the_limit_is_skipped_and_the_next_one_read() -> None:
    send, receive = trio.testing.memory_stream_pair()
    reader = LineReader(receive, limit=100)
    await send.send_all(b"x" * 250 + b"\n" + b'{"ok": 1}\n')
    with trio.fail_after(5):
        with pytest.raises(LineTooLong):
            await reader.line()
        assert await reader.line() == b'{"ok": 1}'
        await send.aclose()
        assert await reader.line() is None


async def test_requests_past_the_bound_are_refused_and_a_notification_still_gets_through() -> None:
    from navi_trio.acp import jsonrpc

    release, cancelled = trio.Event(), trio.Event()

    async def slow(params: dict[str, Any]) -> Any:
        await release.wait()
        return {"done": True}

    async def cancel(params: dict[str, Any]) -> None:
        cancelled.set()

    to_agent, agent_in = trio.testing.memory_stream_pair()
    agent_out, from_agent = trio.testing.memory_stream_pair()
    peer = jsonrpc.Peer(LineReader(agent_in), agent_out, {"slow": slow}, {"cancel": cancel})
    lines = [{"jsonrpc": "2.0", "id": n, "method": "slow"} for n in range(jsonrpc.MAX_RUNNING + 1)]
    lines.append({"jsonrpc": "2.0", "method": "cancel", "params": {}})
    replies = LineReader(from_agent)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.serve, lambda: None, 1.0)
            await to_agent.send_all(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
            refused = json.loads(await replies.line() or b"")
            await cancelled.wait()
            release.set()
            answered = [json.loads(await replies.line() or b"") for _ in range(jsonrpc.MAX_RUNNING)]
            await to_agent.aclose()
    assert (
        refused["id"] == jsonrpc.MAX_RUNNING and "requests at once" in refused["error"]["message"]
    )
    assert sorted(r["id"] for r in answered) == list(range(jsonrpc.MAX_RUNNING))


async def test_our_requests_waiting_for_the_editor_are_bounded() -> None:
    from navi_trio.acp import jsonrpc

    _, agent_in = trio.testing.memory_stream_pair()
    agent_out, _from_agent = trio.testing.memory_stream_pair()
    peer = jsonrpc.Peer(LineReader(agent_in), agent_out, {}, {})
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for _ in range(jsonrpc.MAX_WAITING):  # the editor answers none of them
                nursery.start_soon(peer.request, "session/request_permission", {})
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(jsonrpc.RpcError, match="more than 64 requests to the editor"):
                await peer.request("session/request_permission", {})
            nursery.cancel_scope.cancel()
