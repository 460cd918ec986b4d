"""Budgets that fail closed (issue 23), over WebSocket.

A looping scripted model (every reply a tool call) is cut at each kind of budget:
tokens, wall time, tool calls, sub-agents; a tree of sub-agents (parallel ones and a
background one) spends no more than its parent turn may; a user's daily budget holds
across sessions and a daemon restart. Real parts: the daemon on 127.0.0.1, WebSocket
clients, SQLite in tmp_path, the fake LLM over HTTP. The wall-time test runs on the
autojump clock under a real-time limit (tests/realtime.py); the others wait on events.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
import trio.testing
from agent_tools import call, toolset
from api_ws import Client, open_daemon
from realtime import real_time_limit
from test_api_approvals import IDLE_SEC, _tick
from test_on_busy import messages_of, send

from navi_trio.profiles import ConfigSource, parse_config
from navi_trio.settings import default_config_path
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.spawn_agent import SpawnAgentTool

TIMEOUT = 30
OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


class Echo:
    """Answers at once and counts its calls (across a whole tree of sub-agents)."""

    name = "echo"
    description = "echoes"
    parameters = OBJECT

    def __init__(self) -> None:
        self.calls = 0

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.calls += 1
        return ToolResult.success("echo")


class Nap:
    """Sleeps 10 (virtual) seconds; keeps when each call started."""

    name = "nap"
    description = "naps"
    parameters = OBJECT

    def __init__(self) -> None:
        self.started: list[float] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.started.append(trio.current_time())
        await trio.sleep(10)
        return ToolResult.success("rested")


def profile(agent: list[str], subagent: list[str] | None = None, **flags: Any) -> dict[str, Any]:
    return {
        "general": {
            "tools": {"agent": agent, "subagent": subagent or []},
            "planning_first_message": False,
            "answer_max_tokens": 50,
            **flags,
        }
    }


def counted(reply: dict[str, Any], prompt: int = 100, completion: int = 10) -> dict[str, Any]:
    return {**reply, "prompt_tokens": prompt, "completion_tokens": completion}


def exhausted(c: Client, sid: str) -> dict[str, Any]:
    (event,) = [f for f in messages_of(c, sid, "budget_exhausted") if not f["is_subagent"]]
    return event


async def run_to_the_end(c: Client, text: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    ok = await send(c, text, **fields)
    assert ok["type"] == "ok", ok
    sid = str(ok["session_id"])
    return sid, await c.until_end(sid)


async def test_a_looping_model_is_cut_at_the_turns_token_budget(tmp_path: Path) -> None:
    echo = Echo()
    budgets = {"turn": {"tokens": 3000}}
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=[counted(call("echo"))], loop=True, tools=toolset(echo),
            profiles=profile(["echo"], budgets=budgets),
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid, end = await run_to_the_end(c, "loop")
            assert end["reason"] == "budget_exhausted" and end["stopped"] is False
            event = exhausted(c, sid)
            assert (event["scope"], event["kind"], event["limit"]) == ("turn", "tokens", 3000)
            assert "turn budget of 3000 tokens is spent" in event["message"]
            requests = d.harness.fake.chat_requests  # type: ignore[union-attr]
            spent = 110 * len(requests)  # what the model reported, in all
            assert 0 < spent <= 3000 and event["spent"] <= 3000
            # Each call's output cap was cut to what was left (never above the profile's).
            caps = [r["body"]["options"]["num_predict"] for r in requests]
            assert all(1 <= cap <= 50 for cap in caps)
            reports = [f for f in messages_of(c, sid, "budget") if not f["is_subagent"]]
            assert len(reports) == len(requests)  # one budget event a round
            (line,) = reports[-1]["budgets"]
            assert line == {"scope": "turn", "kind": "tokens", "spent": spent, "limit": 3000}


async def test_tool_calls_are_cut_at_the_budget_and_a_message_only_lowers_it(
    tmp_path: Path,
) -> None:
    echo = Echo()
    budgets = {"turn": {"tool_calls": 3}}
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=[call("echo")], loop=True, tools=toolset(echo),
            profiles=profile(["echo"], budgets=budgets),
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid, end = await run_to_the_end(c, "loop")
            assert end["reason"] == "budget_exhausted"
            event = exhausted(c, sid)
            assert (event["kind"], event["spent"], event["limit"]) == ("tool_calls", 3, 3)
            assert echo.calls == 3
            hist = await d.harness.runtime.store.load_messages(sid)
            results = [m["content"] for m in hist if m["role"] == "tool"]
            assert results == ["echo"] * 3 + ["Error: stopped by the user"]  # all paired
            # A message may lower the budget, never raise it.
            echo.calls = 0
            _, end = await run_to_the_end(
                c, "less", session_id=sid, budget={"turn": {"tool_calls": 1}}
            )
            assert end["reason"] == "budget_exhausted" and echo.calls == 1
            echo.calls = 0
            _, end = await run_to_the_end(
                c, "more", session_id=sid, budget={"turn": {"tool_calls": 100}}
            )
            assert end["reason"] == "budget_exhausted" and echo.calls == 3


async def test_a_looping_model_is_cut_at_the_turns_wall_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    budgets = {"turn": {"wall_sec": 25}}
    # A virtual second per IDLE_SEC of real work on threads, not one per pass of the run
    # loop: on a threshold of 0 the far deadlines (1e5 s) came first on a busy machine.
    autojump_clock.autojump_threshold = IDLE_SEC
    slow = {"first_chunk_timeout": 1e5, "chunk_timeout": 1e5, "session_idle_sec": 1e5,
            "llm_connect_timeout": 1e5, "ws_hello_timeout_sec": 1e5,
            "message_accept_timeout_sec": 1e5}  # fmt: skip
    with real_time_limit(TIMEOUT):
        async with trio.open_nursery() as ticker:
            await ticker.start(_tick)
            nap = Nap()
            async with open_daemon(
                tmp_path, replies=[call("nap")], loop=True, tools=toolset(nap),
                profiles=profile(["nap"], budgets=budgets), **slow,
            ) as d, d.connect("alice") as c:  # fmt: skip
                ok = await send(c, "loop")
                started = trio.current_time()  # the turn (and its clock) began before
                sid = str(ok["session_id"])
                end = await c.until_end(sid)
                assert end["reason"] == "budget_exhausted"
                event = exhausted(c, sid)
                assert (event["scope"], event["kind"], event["limit"]) == ("turn", "wall_sec", 25)
                # The virtual clock also runs while the store and the fake LLM answer on
                # their threads and sockets (an autojump per tick), so the exact moment
                # varies: never before the limit, and nothing starts after it (the turn's
                # clock began before its message's ok, `started`).
                assert event["spent"] >= 25
                # Far from the daemon's 1e5 s deadlines (on a threshold of 0: thousands).
                assert trio.current_time() < 1000
                assert len(nap.started) <= 3
                assert all(at < started + 25 for at in nap.started)
                hist = await d.harness.runtime.store.load_messages(sid)
                assert all(
                    m["content"] in ("rested", "Error: stopped by the user")
                    for m in hist if m["role"] == "tool"
                )  # fmt: skip
            ticker.cancel_scope.cancel()


async def test_sub_agents_are_cut_at_the_budget(tmp_path: Path) -> None:
    replies = [call("spawn_agent", task="dig"), {"text": "dug"}]
    budgets = {"turn": {"subagents": 2}}
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, loop=True, tools=toolset(SpawnAgentTool()),
            profiles=profile(["spawn_agent"], budgets=budgets),
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid, end = await run_to_the_end(c, "delegate forever")
            assert end["reason"] == "budget_exhausted"
            event = exhausted(c, sid)
            assert (event["kind"], event["spent"], event["limit"]) == ("subagents", 2, 2)
            assert len(messages_of(c, sid, "subagent_started")) == 2


async def test_a_tree_of_sub_agents_spends_no_more_than_its_parent_turn(tmp_path: Path) -> None:
    echo = Echo()
    batch = {"tool_calls": [
        {"name": "spawn_agent", "arguments": {"task": "a"}},
        {"name": "spawn_agent", "arguments": {"task": "b"}},
        {"name": "spawn_agent", "arguments": {"task": "c", "background": True}},
    ]}  # fmt: skip
    # The sub-agents' own budget is far above what the parent turn has left.
    budgets = {"turn": {"tool_calls": 6}, "subagent": {"tool_calls": 100}}
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=[batch, *[call("echo")] * 60],
            tools=toolset(echo, SpawnAgentTool()),
            profiles=profile(["spawn_agent", "echo"], ["echo"], budgets=budgets,
                             parallel_tool_calls=True),
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid, end = await run_to_the_end(c, "fan out")
            assert end["reason"] == "budget_exhausted"
            assert exhausted(c, sid)["kind"] == "tool_calls"
            job = await c.until(
                lambda f: f["type"] == "task_update" and f["tool"] == "spawn_agent"
                and f["status"] != "running"
            )  # fmt: skip
            assert "budget" in str(job.get("error") or job.get("result_excerpt"))
            # Three spawns and at most three echoes, whoever ran them: six in all.
            assert 1 <= echo.calls <= 3
            sub_ends = [f for f in messages_of(c, sid, "subagent_finished")]
            assert len(sub_ends) == 2 and not any(f["completed"] for f in sub_ends)
            assert all("budget ran out" in f["text"] for f in sub_ends)


async def test_a_users_daily_budget_holds_across_sessions_and_a_restart(tmp_path: Path) -> None:
    roles = {"user": {"user_day": {"tokens": 10000}}}
    answer = counted({"text": "an answer"}, prompt=5000)

    def daemon() -> Any:
        source = config(profile([]), role_budgets=roles)
        return open_daemon(tmp_path, replies=[answer], loop=True, config=source)

    with trio.fail_after(TIMEOUT):
        async with daemon() as d, d.connect("alice") as c:
            alice = d.tokens["alice"]
            _, first = await run_to_the_end(c, "one")
            _, second = await run_to_the_end(c, "two")  # a second session
            assert first["reason"] == second["reason"] == "complete"
            sid, third = await run_to_the_end(c, "three")  # a third: the day is spent
            assert third["reason"] == "budget_exhausted"
            event = exhausted(c, sid)
            assert (event["scope"], event["kind"], event["spent"]) == ("user_day", "tokens", 10020)
            assert len(d.harness.fake.chat_requests) == 2
        async with daemon() as d:
            d.tokens["alice"] = alice  # the same user as before the restart
            async with d.connect("alice") as c, d.connect("bob") as b:
                sid, end = await run_to_the_end(c, "after the restart")
                assert end["reason"] == "budget_exhausted"
                assert exhausted(c, sid)["spent"] == 10020
                _, other = await run_to_the_end(b, "bob has his own day")
                assert other["reason"] == "complete"
                assert len(d.harness.fake.chat_requests) == 1


def config(profiles: dict[str, Any], **top: Any) -> ConfigSource:
    """The shipped config with `profiles` merged in and top-level keys set (`top`)."""
    path = default_config_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    for pid, changes in profiles.items():
        data["profiles"][pid] = {**data["profiles"].get(pid, {}), **changes}
    data.update(top)
    return ConfigSource(path, initial=parse_config(data, path))
