"""Double-texting over WebSocket (issue 23): a message to a busy session with on_busy
enqueue, reject, interrupt or steer, and a profile's default.

Real parts: the daemon on 127.0.0.1 port 0, real WebSocket clients, the SQLite store in
tmp_path, the fake LLM over real HTTP. Nothing here times out: the runs wait on gates
the tests open, or on a prefill that never ends, so every wait is an event; each test
has an absolute `trio.fail_after`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from agent_tools import BlockTool, GateTool, call, toolset, with_tools
from api_ws import Client, open_daemon

from navi_trio.events import StreamEnd
from navi_trio.tools.spawn_agent import SpawnAgentTool

TIMEOUT = 20
NO_PLAN = {"planning_first_message": False}


def profiles(*tools: str, **flags: Any) -> dict[str, Any]:
    return {"general": with_tools(tools, **NO_PLAN, **flags)}


def messages_of(c: Client, sid: str, type_: str) -> list[dict[str, Any]]:
    return [f for f in c.frames if f["type"] == type_ and f.get("session_id") == sid]


async def send(c: Client, content: str, **fields: Any) -> dict[str, Any]:
    """A message frame; its ok or error (past a new session's `session` frame)."""
    reply = await c.request({"type": "message", "content": content, **fields})
    if reply["type"] == "session":
        reply = await c.until(lambda f: f.get("id") == reply["id"] and f["type"] != "session")
    return reply


async def start_gated(c: Client, gate: GateTool, text: str = "work") -> str:
    """A first message whose run waits in the gate tool; its session id."""
    ok = await send(c, text)
    assert ok["type"] == "ok" and ok["queued"] is False and "on_busy" not in ok, ok
    await gate.entered.wait()
    return str(ok["session_id"])


async def history(c: Client, sid: str) -> list[dict[str, Any]]:
    reply = await c.request({"type": "sessions", "action": "history", "session_id": sid})
    return list(reply["messages"])


async def test_reject_answers_session_busy_naming_the_run_and_stores_nothing(
    tmp_path: Path,
) -> None:
    gate = GateTool()
    replies = [call("gate"), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate), profiles=profiles("gate")
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid = await start_gated(c, gate)
            control = d.harness.runtime.sessions.actor(sid)._control  # type: ignore[union-attr]
            assert control is not None
            err = await send(c, "again", **{"session_id": sid, "on_busy": "reject"})
            assert err["type"] == "error" and err["code"] == "session_busy", err
            assert err["run_id"] == control.run_id and control.run_id in err["message"]
            gate.gate.set()
            end = await c.until_end(sid)
            assert end["text"] == "done"
            texts = [m["content"] for m in await history(c, sid) if m["role"] == "user"]
            assert texts == ["work"]  # the rejected one is nowhere
            assert await d.harness.runtime.store.queued_sessions() == []
            assert not messages_of(c, sid, "message_queued")


async def test_a_profiles_default_applies_and_a_message_overrides_it(tmp_path: Path) -> None:
    gate = GateTool()
    replies = [call("gate"), {"text": "first"}, {"text": "second"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate),
            profiles=profiles("gate", on_busy="reject"),
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid = await start_gated(c, gate)
            err = await send(c, "b", **{"session_id": sid})
            assert err["type"] == "error" and err["code"] == "session_busy", err
            ok = await send(c, "c", **{"session_id": sid, "on_busy": "enqueue"})
            assert ok["type"] == "ok" and ok["queued"] is True and ok["on_busy"] == "enqueue"
            gate.gate.set()
            assert (await c.until_end(sid))["text"] == "first"
            assert (await c.until_end(sid))["text"] == "second"
            texts = [m["content"] for m in await history(c, sid) if m["role"] == "user"]
            assert texts == ["work", "c"]


async def test_a_bad_on_busy_is_a_bad_frame_naming_the_choices(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d, d.connect("alice") as c:
            err = await send(c, "x", **{"on_busy": "shove"})
            assert err["code"] == "bad_frame", err
            assert "on_busy" in err["message"] and "steer" in err["message"]


async def test_interrupt_stops_the_run_and_runs_next_ahead_of_the_queue(tmp_path: Path) -> None:
    block = BlockTool()
    replies = [call("block"), {"text": "interrupting answer"}, {"text": "queued answer"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(block), profiles=profiles("block")
        ) as d, d.connect("alice") as c:  # fmt: skip
            ok = await send(c, "work", **{})
            sid = ok["session_id"]
            await block.started.wait()
            queued = await send(c, "later", **{"session_id": sid})
            assert queued["queued"] is True and queued["on_busy"] == "enqueue"
            ok = await send(c, "now!", **{"session_id": sid, "on_busy": "interrupt"})
            assert ok["type"] == "ok" and ok["queued"] is True and ok["on_busy"] == "interrupt"
            first = await c.until_end(sid)
            assert first["reason"] == "stopped" and block.cancelled
            assert (await c.until_end(sid))["text"] == "interrupting answer"
            assert (await c.until_end(sid))["text"] == "queued answer"
            hist = await history(c, sid)
            assert [m["content"] for m in hist if m["role"] == "user"] == ["work", "now!", "later"]
            stopped = [m for m in hist if m["role"] == "tool"]
            assert stopped and stopped[0]["content"].endswith("stopped by the user")
            queued_frames = messages_of(c, sid, "message_queued")
            assert [(f["text"], f["position"]) for f in queued_frames] == [
                ("later", 1), ("now!", 1)
            ]  # fmt: skip


async def test_interrupt_during_a_sub_agent_stops_it_and_runs_the_message(
    tmp_path: Path,
) -> None:
    block = BlockTool()
    replies = [
        call("spawn_agent", task="dig"),  # the parent
        call("block"),  # the sub-agent blocks in its tool
        {"text": "new answer"},  # the interrupting message's run
    ]
    flags = {"tools": {"agent": ["spawn_agent"], "subagent": ["block"]}, **NO_PLAN}
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(block, SpawnAgentTool()),
            profiles={"general": flags},
        ) as d, d.connect("alice") as c:  # fmt: skip
            ok = await send(c, "delegate", **{})
            sid = ok["session_id"]
            await block.started.wait()
            ok = await send(c, "stop that", **{"session_id": sid,
                 "on_busy": "interrupt"}
            )  # fmt: skip
            assert ok["on_busy"] == "interrupt"
            first = await c.until_end(sid)
            assert first["reason"] == "stopped" and block.cancelled
            finished = [f for f in messages_of(c, sid, "subagent_finished")]
            assert len(finished) == 1 and finished[0]["completed"] is False
            assert (await c.until_end(sid))["text"] == "new answer"
            users = [m["content"] for m in await history(c, sid) if m["role"] == "user"]
            assert users == ["delegate", "stop that"]


def roles(body: dict[str, Any]) -> list[str]:
    """The roles of a request's messages, its system notes left out."""
    return [m["role"] for m in body["messages"] if m["role"] != "system"]


def user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


async def test_steer_during_a_tool_joins_the_turn_after_the_round(tmp_path: Path) -> None:
    gate = GateTool()
    replies = [call("gate"), {"text": "steered answer"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate), profiles=profiles("gate")
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid = await start_gated(c, gate)
            ok = await send(c, "use tabs", **{"session_id": sid, "on_busy": "steer"})
            assert ok["type"] == "ok" and ok["queued"] is False and ok["on_busy"] == "steer"
            assert "mode" not in ok, ok  # it joins a run that has its own
            gate.gate.set()
            end = await c.until_end(sid)
            assert end["text"] == "steered answer"
            (steered,) = messages_of(c, sid, "steered")
            assert steered["text"] == "use tabs" and steered["seq"] < end["seq"]
            # One run: the steer joined it, before the second LLM call, after the tool.
            assert not messages_of(c, sid, "message_queued")
            second = d.harness.fake.chat_requests[-1]["body"]  # type: ignore[union-attr]
            assert roles(second)[-3:] == ["assistant", "tool", "user"]
            assert user_texts(second) == ["work", "use tabs"]
            hist = await history(c, sid)
            assert [m["role"] for m in hist] == ["user", "assistant", "tool", "user", "assistant"]
            assert hist[3]["content"] == "use tabs" and hist[3]["steered"] is True
            assert await d.harness.runtime.store.queued_sessions() == []


async def test_steer_during_prefill_restarts_the_request_with_it(tmp_path: Path) -> None:
    replies = [{"text": "never", "delay_first": 1e5}, {"text": "with the steer"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, profiles=profiles()
        ) as d, d.connect("alice") as c:  # fmt: skip
            fake = d.harness.fake
            assert fake is not None
            ok = await send(c, "write a poem", **{})
            sid = ok["session_id"]
            await fake.wait_requests(1)  # the model is prefilling: no chunk yet
            ok = await send(c, "about trio", **{"session_id": sid,
                 "on_busy": "steer"}
            )  # fmt: skip
            assert ok["on_busy"] == "steer"
            end = await c.until_end(sid)
            assert end["text"] == "with the steer" and end["reason"] == "complete"
            await fake.wait_disconnects(1)  # the first request was dropped
            assert len(fake.chat_requests) == 2
            assert user_texts(fake.chat_requests[1]["body"]) == ["write a poem", "about trio"]
            (steered,) = messages_of(c, sid, "steered")
            assert steered["text"] == "about trio"
            assert not messages_of(c, sid, "text_delta") or all(
                f["text"] != "never" for f in messages_of(c, sid, "text_delta")
            )
            hist = await history(c, sid)
            assert [(m["role"], m["content"]) for m in hist] == [
                ("user", "write a poem"), ("user", "about trio"), ("assistant", "with the steer")
            ]  # fmt: skip


async def test_steer_during_a_parallel_batch_waits_for_the_whole_batch(tmp_path: Path) -> None:
    gate = GateTool()
    batch = {"tool_calls": [{"name": "gate", "arguments": {}}, {"name": "gate", "arguments": {}}]}
    replies = [batch, {"text": "after the batch"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate),
            profiles=profiles("gate", parallel_tool_calls=True),
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid = await start_gated(c, gate)
            ok = await send(c, "careful", **{"session_id": sid, "on_busy": "steer"})
            assert ok["on_busy"] == "steer"
            assert len(d.harness.fake.chat_requests) == 1  # type: ignore[union-attr]
            gate.gate.set()
            end = await c.until_end(sid)
            assert end["text"] == "after the batch"
            second = d.harness.fake.chat_requests[1]["body"]  # type: ignore[union-attr]
            assert roles(second)[-4:] == ["assistant", "tool", "tool", "user"]
            assert user_texts(second)[-1] == "careful"
            hist = await history(c, sid)
            assert [m["role"] for m in hist] == [
                "user", "assistant", "tool", "tool", "user", "assistant"
            ]  # fmt: skip


async def test_a_steer_the_turn_never_took_runs_next_as_its_own_turn(tmp_path: Path) -> None:
    # The answer is streaming (its first chunk came): the steer waits for a next call
    # that never comes; the user stops the run; the steered message then runs next.
    replies = [{"text": "long answer", "stall": True}, {"text": "answer to the steer"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, profiles=profiles()
        ) as d, d.connect("alice") as c:  # fmt: skip
            ok = await send(c, "talk", **{})
            sid = ok["session_id"]
            await c.until_type("text_delta", session_id=sid)
            ok = await send(c, "shorter", **{"session_id": sid, "on_busy": "steer"})
            assert ok["on_busy"] == "steer"
            stop = await c.request({"type": "stop", "session_id": sid})
            assert stop["stopped"] is True
            assert (await c.until_end(sid))["reason"] == "stopped"
            queued = await c.until_type("message_queued", session_id=sid)
            assert (queued["text"], queued["position"]) == ("shorter", 1)
            assert (await c.until_end(sid))["text"] == "answer to the steer"
            assert not messages_of(c, sid, "steered")
            hist = await history(c, sid)
            assert [m["content"] for m in hist if m["role"] == "user"] == ["talk", "shorter"]
            assert "steered" not in hist[-2]


async def test_a_steered_message_is_bounded_and_a_longer_one_is_refused(tmp_path: Path) -> None:
    gate = GateTool()
    replies = [call("gate"), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate), profiles=profiles("gate"),
            steer_max_chars=100,
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid = await start_gated(c, gate)
            err = await send(c, "x" * 101, session_id=sid, on_busy="steer")
            assert err["type"] == "error" and err["code"] == "limit", err
            assert "NAVI_STEER_MAX_CHARS" in err["message"]
            ok = await send(c, "y" * 100, session_id=sid, on_busy="steer")
            assert ok["on_busy"] == "steer"
            gate.gate.set()
            await c.until_end(sid)
            users = [m["content"] for m in await history(c, sid) if m["role"] == "user"]
            assert users == ["work", "y" * 100]
            assert await d.harness.runtime.store.queued_sessions() == []


async def test_a_message_queued_after_the_runs_end_was_said_has_no_run_before_it(
    tmp_path: Path,
) -> None:
    """A run publishes its end, then still saves and settles: a message that comes in
    then is queued behind it, but no run's end comes before it any more, so its place
    is 0. (A 1 there left `navi chat` waiting forever for an end that had come.)"""
    gate = GateTool()
    replies = [call("gate"), {"text": "first"}, {"text": "second"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate), profiles=profiles("gate")
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid = await start_gated(c, gate)
            actor = d.harness.runtime.sessions.actor(sid)
            assert actor is not None and actor.busy
            # What the run does as it ends, while it still holds the session.
            actor.publish(StreamEnd(reason="complete"))
            await c.until_end(sid)
            ok = await send(c, "after its end", **{"session_id": sid})
            assert ok["type"] == "ok" and ok["queued"] is True, ok
            (queued,) = messages_of(c, sid, "message_queued")
            assert (queued["text"], queued["position"]) == ("after its end", 0)
            gate.gate.set()
            assert (await c.until_end(sid))["text"] == "first"
            assert (await c.until_end(sid))["text"] == "second"


async def test_steers_the_turn_never_took_run_next_in_their_order_ahead_of_the_queue(
    tmp_path: Path,
) -> None:
    replies = [{"text": "long answer", "stall": True}, *({"text": t} for t in ("1", "2", "3"))]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, profiles=profiles()
        ) as d, d.connect("alice") as c:  # fmt: skip
            ok = await send(c, "talk")
            sid = ok["session_id"]
            await c.until_type("text_delta", session_id=sid)
            for text, on_busy in (("queued", "enqueue"), ("first", "steer"), ("second", "steer")):
                ok = await send(c, text, **{"session_id": sid, "on_busy": on_busy})
                assert ok["on_busy"] == on_busy
            stop = await c.request({"type": "stop", "session_id": sid})
            assert stop["stopped"] is True
            assert (await c.until_end(sid))["reason"] == "stopped"
            ends = [(await c.until_end(sid))["text"] for _ in range(3)]
            assert ends == ["1", "2", "3"]
            hist = await history(c, sid)
            users = [m["content"] for m in hist if m["role"] == "user"]
            assert users == ["talk", "first", "second", "queued"]
