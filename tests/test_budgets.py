"""Budgets that fail closed (issue 23), over WebSocket.

A looping scripted model (every reply a tool call) is cut at each kind of budget:
tokens, wall time, tool calls, sub-agents; a tree of sub-agents (parallel ones and a
background one) spends no more than its parent turn may; a user's daily budget holds
across sessions and a daemon restart, and for twenty sessions started at once (their
calls held until all have asked: tests/budget_race.py). Real parts: the daemon on
127.0.0.1, WebSocket clients, SQLite in tmp_path, the fake LLM over HTTP. The
wall-time test runs on the autojump clock under a real-time limit (tests/realtime.py);
the others wait on events.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import call, toolset
from api_ws import Client, open_daemon
from budget_race import HeldEcho, race
from realtime import paced
from test_on_busy import messages_of, send

from navi_trio.errors import StoreError
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
            # All paired; the one the budget refused says which budget and how much.
            spent = "Error: not run: the turn budget of 3 tool calls is spent (3 used)"
            assert results == ["echo"] * 3 + [spent]
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
    slow = {"first_chunk_timeout": 1e5, "chunk_timeout": 1e5, "session_idle_sec": 1e5,
            "llm_connect_timeout": 1e5, "ws_hello_timeout_sec": 1e5,
            "message_accept_timeout_sec": 1e5}  # fmt: skip
    # Paced (tests/realtime.py): on a threshold of 0 the far deadlines (1e5 s) came
    # first on a busy machine.
    async with paced(autojump_clock, TIMEOUT):
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
            refused = "Error: not run: the turn budget of 25 seconds is spent"
            assert all(
                m["content"] in ("rested", "Error: stopped by the user")
                or m["content"].startswith(refused)
                for m in hist if m["role"] == "tool"
            )  # fmt: skip


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


RACE_SESSIONS = 20


@pytest.mark.parametrize(
    "day", [{"tokens": 3000, "tool_calls": 4}, {"tool_calls": 4}], ids=["tokens", "tool_calls"]
)
async def test_a_users_daily_budget_holds_for_twenty_sessions_started_at_once(
    tmp_path: Path, day: dict[str, int]
) -> None:
    """Each model call reserves its prompt and output cap in the store before it runs,
    each tool call takes its count there: however many sessions ask at once, no more
    than the day's budget is spent, and the runs refused say which budget and what is
    used and held."""
    echo = HeldEcho()
    answer = counted(call("echo"), prompt=400, completion=20)
    with trio.fail_after(TIMEOUT * 2):
        source = config(profile(["echo"], answer_max_tokens=500), role_budgets={"user": {
            "user_day": day}})  # fmt: skip
        async with open_daemon(
            tmp_path, replies=[answer], loop=True, tools=toolset(echo), config=source
        ) as d, d.connect("alice") as c:  # fmt: skip
            fake = d.harness.fake
            assert fake is not None
            ends = await race([c], fake, RACE_SESSIONS, echo)
            store = d.harness.runtime.store
            key = f"user:{d.ids['alice']}:{time.strftime('%Y-%m-%d', time.gmtime())}"
            usage = (await store.get_usage([key]))[key]
    assert len(ends) == RACE_SESSIONS
    assert {e["reason"] for e in ends.values()} == {"budget_exhausted"}
    assert 1 <= echo.calls <= 4 and usage["tool_calls"] == echo.calls
    answered = fake.completed * 420
    assert usage["tokens"] == answered
    if "tokens" in day:
        assert answered <= 3000
        refused = [
            f for f in c.frames
            if f["type"] == "budget_exhausted" and f["kind"] == "tokens" and f["held"] > 0
        ]  # fmt: skip
        assert refused, "no run was refused for what the others held"
        assert all(f["scope"] == "user_day" and f["limit"] == 3000 for f in refused)
        assert "held by calls under way" in refused[0]["message"]
    else:
        assert fake.completed >= RACE_SESSIONS  # all asked at once: only the tools were cut


async def test_spending_the_store_failed_to_record_is_written_at_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first model call's spending is refused by the store (and its hold stays):
    the run goes on, and the next write (before the tool call) records both, so the
    session's and the day's counters miss nothing."""
    echo = Echo()
    replies = [counted(call("echo")), counted({"text": "done"})]
    source = config(
        profile(["echo"], budgets={"session": {"tokens": 100_000}}),
        role_budgets={"user": {"user_day": {"tokens": 100_000}}},
    )
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(echo), config=source
        ) as d, d.connect("alice") as c:  # fmt: skip
            store = d.harness.runtime.store
            real = store.settle_usage
            refused: list[dict[str, Any]] = []

            async def fails_once(adds: Any, *, release: Any = ()) -> Any:
                if not refused and any(a.get("tokens") for a in adds.values()):
                    refused.append(adds)
                    raise StoreError("settle usage: the disk is on fire")
                return await real(adds, release=release)

            monkeypatch.setattr(store, "settle_usage", fails_once)
            sid, end = await run_to_the_end(c, "loop")
            assert end["reason"] == "complete" and echo.calls == 1
            assert refused and refused[0][f"session:{sid}"]["tokens"] == 110
            day = f"user:{d.ids['alice']}:{time.strftime('%Y-%m-%d', time.gmtime())}"
            usage = await store.get_usage([f"session:{sid}", day])
            holds = await store.run_raw_for_tests(
                "holds", lambda db: db.execute("SELECT count(*) FROM usage_holds").fetchone()
            )
    for key in (f"session:{sid}", day):
        assert (usage[key]["tokens"], usage[key]["tool_calls"]) == (220, 1)
    assert holds[0] == 0  # the first call's hold went with the late write


async def test_parallel_sub_agents_never_pass_a_shared_token_budget() -> None:
    """Three sub-agents of one turn (their budgets are the turn's `child`ren) ask for a
    model call at once, each with a 400-token prompt and a 50-token cap, under the
    turn's 1000 tokens: each reservation holds its prompt and cap, so only two get a
    call, and together they spend no more than the turn may."""
    from navi_trio.core.turn.budgets import Budget, Meter
    from navi_trio.errors import BudgetExhaustedError
    from navi_trio.profiles import BudgetConfig, BudgetLimits

    turn = BudgetLimits(tokens=1000)
    parent = Budget(None, [Meter("turn", turn)], budgets=BudgetConfig(turn=turn),
                    wall_owner=True)  # fmt: skip
    children = [parent.child(BudgetLimits(), background=False) for _ in range(3)]
    caps: list[int] = []
    refused: list[BudgetExhaustedError] = []
    asked = trio.Event()

    async def call_model(budget: Budget) -> None:
        cap = None
        try:
            cap = await budget.before_llm(400, 50)
            caps.append(cap)
        except BudgetExhaustedError as exc:
            refused.append(exc)
        if len(caps) + len(refused) == len(children):
            asked.set()
        await asked.wait()  # every call is under way before any reports its use
        if cap is not None:
            budget.charge_tokens(400 + cap)

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            for child in children:
                nursery.start_soon(call_model, child)
    assert (caps, len(refused)) == ([50, 50], 1)
    assert parent.meters[0].spent("tokens") == 900 <= 1000
    assert "turn budget of 1000 tokens" in str(refused[0])


async def test_a_model_calls_output_cap_is_cut_to_what_the_budget_has_left() -> None:
    from navi_trio.core.turn.budgets import Budget, Meter
    from navi_trio.errors import BudgetExhaustedError
    from navi_trio.profiles import BudgetConfig, BudgetLimits

    turn = BudgetLimits(tokens=1000)
    budget = Budget(None, [Meter("turn", turn)], budgets=BudgetConfig(turn=turn),
                    wall_owner=True)  # fmt: skip
    with trio.fail_after(TIMEOUT):
        assert await budget.before_llm(400, 500) == 500  # room for the whole cap
        budget.charge_tokens(400 + 500)
        assert await budget.before_llm(60, 500) == 40  # 100 left, 60 of them the prompt
        budget.charge_tokens(100)
        with pytest.raises(BudgetExhaustedError, match="turn budget of 1000 tokens"):
            await budget.before_llm(1, 500)


class Together:
    """Each call waits until `n` calls have started: they ran side by side."""

    name = "together"
    description = "waits for the others"
    parameters = OBJECT

    def __init__(self, n: int) -> None:
        self.n = n
        self.started = 0
        self.all_in = trio.Event()

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.started += 1
        if self.started >= self.n:
            self.all_in.set()
        await self.all_in.wait()
        return ToolResult.success("together")


async def test_a_parallel_batch_over_the_budget_runs_what_fits_and_says_why_not_the_rest(
    tmp_path: Path,
) -> None:
    tool = Together(3)
    batch = {"tool_calls": [{"name": "together", "arguments": {}}] * 5}
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=[batch, {"text": "never"}], tools=toolset(tool),
            profiles=profile(["together"], budgets={"turn": {"tool_calls": 3}},
                             parallel_tool_calls=True),
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid, end = await run_to_the_end(c, "all at once")
            assert end["reason"] == "budget_exhausted"
            hist = await d.harness.runtime.store.load_messages(sid)
    spent = "the turn budget of 3 tool calls is spent (3 used)"
    results = [m["content"] for m in hist if m["role"] == "tool"]
    assert results == ["together"] * 3 + [f"Error: not run: {spent}"] * 2
    frames = [f for f in messages_of(c, sid, "tool_result") if not f["ok"]]
    assert [f["error"] for f in frames] == [f"not run: {spent}"] * 2
    assert not any(f.get("stopped") for f in messages_of(c, sid, "tool_result"))
    assert tool.started == 3


async def test_a_prompt_that_leaves_no_token_for_the_answer_is_refused() -> None:
    """A model call needs room for at least one answer token: a prompt that takes all the
    tokens left is refused before it is sent, one token less gets a cap of 1."""
    from navi_trio.core.turn.budgets import Budget, Meter
    from navi_trio.errors import BudgetExhaustedError
    from navi_trio.profiles import BudgetConfig, BudgetLimits

    turn = BudgetLimits(tokens=1000)
    budget = Budget(None, [Meter("turn", turn)], budgets=BudgetConfig(turn=turn), wall_owner=True)
    assert await budget.before_llm(999, 50) == 1
    budget.release()
    with pytest.raises(BudgetExhaustedError):
        await budget.before_llm(1000, 50)
