"""Sub-agents end to end (issue 4, "Sub-agents"): run_ephemeral, the spawn_agent tool's
profile and prompt resolution, session-aware tools, live event forwarding, ContextVar
restoration on every exit path, and Stop reaching a synchronous sub-agent.

Rules: the agent talks real HTTP to the fake LLM on 127.0.0.1 (port 0) through
`open_harness`; the store is a real SQLite file under tmp_path; real time (the store
works on a thread, so no autojump clock), every test under an absolute `fail_after`.
The only real waits are the sub-agent timeouts under test (0.5-1 s). The parent's
first message is a casual "hi", so no planning reply is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from bg_tools import Kit, call, calls, make_kit, of_type, profile, system_texts, tool_names

from navi_trio.core.turn import runvars
from navi_trio.core.turn.subagent import CONTEXT_TRANSFER_ACK
from navi_trio.core.turn.tool_executor import STOPPED_TEXT
from navi_trio.errors import LLMStatusError
from navi_trio.testing import Harness, open_harness
from navi_trio.tools.services import SpawnRequest

TIMEOUT = 30

PROFILES: dict[str, dict[str, Any]] = {
    # The parent session's profile (not the config's default, which is "general").
    "pa": profile(
        ["spawn_agent", "snapshot", "block", "switch_profile"],
        ["snapshot", "block"],
        system_prompt="PA-MAIN prompt",
        subagent_system_prompt="PA-SUB prompt",
        model="model-pa",
    ),
    # No sub-agent tool list: a sub-agent falls back to the agent list.
    "pb": profile(
        ["snapshot", "boom"],
        [],
        system_prompt="PB-MAIN prompt",
        subagent_system_prompt="PB-SUB prompt",
        model="model-pb",
    ),
    # The target of a mid-turn switch_profile.
    "pc": profile(
        ["spawn_agent"], ["snapshot"], subagent_system_prompt="PC-SUB prompt", model="model-pc"
    ),
    "planner": profile(
        ["snapshot"], ["snapshot"], subagent_planning_enabled=True, model="model-planner"
    ),
    "writer": profile(["spawn_agent"], ["filesystem", "scratchpad", "todo"]),
    "sub": profile(["snapshot"], ["snapshot", "block"], model="sub-model"),
    # A short limit of its own, which a sub-agent's default does not follow.
    "short": profile(["spawn_agent"], ["snapshot"], max_iterations=3),
    # The profile a parent session is in: its model and its sub-agents' session tools.
    "keeper": profile(["snapshot"], ["filesystem", "scratchpad", "todo"], model="model-keeper"),
}


def harness(tmp_path: Path, kit: Kit, replies: list[dict[str, Any]], **settings: Any) -> Any:
    return open_harness(tmp_path, replies=replies, profiles=PROFILES, tools=kit.tools(), **settings)


def spawn(**arguments: Any) -> dict[str, Any]:
    return calls(call("spawn_agent", **arguments))


def convo(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The non-system messages of a request, as (role, content)."""
    return [(m["role"], m["content"]) for m in body["messages"] if m["role"] != "system"]


def tool_contents(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


# --- run_ephemeral -------------------------------------------------------------------


async def test_run_ephemeral_returns_text_and_true_when_the_subagent_answers(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, [{"text": "the sub-agent's report"}]) as h:
            text, completed = await h.runtime.agent.run_ephemeral(
                SpawnRequest(task="Summarise X", profile_id="pa")
            )
            assert (text, completed) == ("the sub-agent's report", True)
            body = h.chat_requests[0]
            assert body["model"] == "model-pa"
            assert convo(body) == [("user", "Summarise X")]
            assert "PA-SUB prompt" in system_texts(body)[0]
            # Nothing of an ephemeral sub-agent is stored.
            assert await h.runtime.store.list_sessions() == []


async def test_run_ephemeral_returns_false_at_the_iteration_limit(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [calls(call("snapshot", label="1")), calls(call("snapshot", label="2"))]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            text, completed = await h.runtime.agent.run_ephemeral(
                SpawnRequest(task="Loop forever", profile_id="pa", max_iterations=2)
            )
            assert completed is False
            assert "2 iterations" in text
            assert len(h.chat_requests) == 2  # the limit, not the script, ended it
            assert [r["label"] for r in kit.snapshot.records] == ["1", "2"]


def iteration_notes(body: dict[str, Any]) -> list[str]:
    return [t for t in system_texts(body) if t.startswith("[Iteration ")]


async def test_a_subagent_given_no_max_iterations_gets_40(tmp_path: Path) -> None:
    """agent-loop spec: `run_ephemeral(user_message, profile_id, *, max_iterations=40,
    ...)`. A sub-agent not told its limit gets 40, not its profile's own (3 here), from
    spawn_agent and from a direct run_ephemeral alike."""
    kit = make_kit()
    replies = [spawn(task="Dig"), {"text": "sub done"}, {"text": "done"}, {"text": "direct"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            await h.turn("s1", "hi", profile_id="short")
            done = await h.runtime.agent.run_ephemeral(SpawnRequest(task="Dig", profile_id="short"))
            assert done == ("direct", True)
            parent, by_tool, _, direct = h.chat_requests
            assert iteration_notes(parent)[0].startswith("[Iteration 1 of 3;")
            for sub in (by_tool, direct):
                assert convo(sub) == [("user", "Dig")]
                assert iteration_notes(sub)[0].startswith("[Iteration 1 of 40;"), sub


async def test_run_ephemeral_with_a_parent_session_takes_its_profile_and_data(
    tmp_path: Path,
) -> None:
    """agent-loop spec: "run_ephemeral reads the parent session from the DB when
    parent_session_id is provided, so session-aware tools (filesystem, todo, scratchpad)
    operate on the parent's data". Called directly, with no profile named, the sub-agent
    takes the parent session's current profile (its model, its sub-agent tools) and
    writes into that session's folder, scratchpad and todo list."""
    kit = make_kit()
    writes = calls(
        call("filesystem", action="write", path="notes.txt", content="from the sub-agent"),
        call("scratchpad", action="write", content="pad from the sub-agent"),
        call("todo", action="add", text="step added by the sub-agent"),
    )
    replies = [{"text": "hello"}, writes, {"text": "wrote them"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            await h.turn("s-parent", "hi", profile_id="keeper")
            text, completed = await h.runtime.agent.run_ephemeral(
                SpawnRequest(task="Write the notes"), parent_session_id="s-parent"
            )
            assert (text, completed) == ("wrote them", True)
            sub = h.chat_requests[1]
            assert sub["model"] == "model-keeper"
            assert tool_names(sub) == ["filesystem", "scratchpad", "todo"]
            sessions = tmp_path / "data" / "sessions"
            assert (sessions / "s-parent" / "notes.txt").read_text() == "from the sub-agent"
            assert [p.name for p in sessions.iterdir()] == ["s-parent"]
            kv = h.runtime.store
            assert await kv.kv_get("scratchpad", "s-parent") == "pad from the sub-agent"
            todo = await kv.kv_get("todo", "s-parent")
            assert [step["text"] for step in todo] == ["step added by the sub-agent"]


async def test_run_ephemeral_raises_a_backend_level_llm_error(tmp_path: Path) -> None:
    """A direct run_ephemeral meets its backend failing: the caller gets that error,
    as a synchronous spawn_agent call's turn ends with it."""
    kit = make_kit()
    replies = [{"status": 502, "error_body": "bad gateway"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            with pytest.raises(LLMStatusError, match="bad gateway") as caught:
                await h.runtime.agent.run_ephemeral(SpawnRequest(task="Dig", profile_id="pa"))
            assert caught.value.status == 502


@pytest.mark.slow  # waits out the sub-agent's 0.5 s on the real clock
async def test_run_ephemeral_timeout_is_a_cancel_scope_that_closes_the_stream(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    # The model says two words, then goes silent with the connection open (well within
    # the 90 s chunk timeouts): only the sub-agent's own timeout can end this.
    replies = [{"text": "partial words", "stall": True}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            assert h.fake is not None
            started = trio.current_time()
            text, completed = await h.runtime.agent.run_ephemeral(
                SpawnRequest(task="Think hard", profile_id="pa", timeout_seconds=0.5)
            )
            took = trio.current_time() - started
            assert completed is False
            assert text.startswith("partial words")
            assert "timed out after 0.5 s" in text
            assert 0.5 <= took < 5
            # Leaving the cancel scope closed the HTTP stream: the server saw it go.
            await h.fake.wait_disconnects(1)


# --- spawn_agent: profiles, tools, prompts ------------------------------------------


async def test_spawn_agent_resolves_profile_and_tools_as_the_spec_says(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        spawn(task="T1"),  # no profile: the parent session's current one ("pa")
        {"text": "sub one"},
        spawn(task="T2", profile_id="pb"),  # empty tools.subagent: tools.agent
        {"text": "sub two"},
        spawn(task="T3", profile_id="pb", exclude_tools=["boom"]),
        {"text": "sub three"},
        {"text": "all done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="pa")
            assert frames[-1]["text"] == "all done"
            reqs = h.chat_requests
            assert len(reqs) == 7
            one, two, three = reqs[1], reqs[3], reqs[5]
            assert (one["model"], tool_names(one)) == ("model-pa", ["snapshot", "block"])
            assert "PA-SUB prompt" in system_texts(one)[0]
            assert "PA-MAIN" not in system_texts(one)[0]
            assert convo(one) == [("user", "T1")]
            assert (two["model"], tool_names(two)) == ("model-pb", ["snapshot", "boom"])
            assert "PB-SUB prompt" in system_texts(two)[0]
            assert (three["model"], tool_names(three)) == ("model-pb", ["snapshot"])
            # Each report came back to the parent as the spawn_agent result.
            assert tool_contents(reqs[6]) == ["sub one", "sub two", "sub three"]


async def test_spawn_agent_follows_the_sessions_profile_after_a_switch(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        calls(call("switch_profile", profile_id="pc")),
        spawn(task="T"),
        {"text": "sub"},
        {"text": "done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            await h.turn("s1", "hi", profile_id="pa")
            sub = h.chat_requests[2]
            assert (sub["model"], tool_names(sub)) == ("model-pc", ["snapshot"])
            assert "PC-SUB prompt" in system_texts(sub)[0]
            row = await h.runtime.store.get_session("s1")
            assert row is not None and row.profile_id == "pc"


async def test_spawn_agent_rejects_an_unknown_profile_by_name(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [spawn(task="T", profile_id="nope"), {"text": "ok"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="pa")
            (result,) = of_type(frames, "tool_result", name="spawn_agent")
            assert result["ok"] is False
            assert "unknown profile_id 'nope'" in result["error"]
            assert len(h.chat_requests) == 2  # no sub-agent ran


async def test_spawn_agent_shapes_the_system_prompt_and_transfers_context(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    replies = [
        spawn(task="T", briefing="B-FACTS"),
        {"text": "ok1"},
        spawn(task="T", custom_system_prompt="CUSTOM ONLY", briefing="B2"),
        {"text": "ok2"},
        spawn(task="T", inherit_system_prompt=True),
        {"text": "ok3"},
        spawn(task="T", context_transfer="we talked about rivers"),
        {"text": "ok4"},
        {"text": "done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            await h.turn("s1", "hi", profile_id="pa")
            agent = h.runtime.agent
            cfg = agent.config()
            sub_prompt = agent.parts.builder.system_prompt(cfg, cfg.profile("pa"), subagent=True)
            main_prompt = agent.parts.builder.system_prompt(cfg, cfg.profile("pa"))
            reqs = h.chat_requests
            assert system_texts(reqs[1])[0] == f"{sub_prompt}\n\n## Briefing\nB-FACTS"
            assert system_texts(reqs[3])[0] == "CUSTOM ONLY\n\n## Briefing\nB2"
            assert system_texts(reqs[5])[0] == main_prompt
            assert "PA-MAIN prompt" in main_prompt
            assert convo(reqs[5]) == [("user", "T")]
            assert system_texts(reqs[7])[0] == sub_prompt
            assert convo(reqs[7]) == [
                ("user", "Context from the parent conversation:\nwe talked about rivers"),
                ("assistant", CONTEXT_TRANSFER_ACK),
                ("user", "T"),
            ]


async def test_subagent_plans_only_when_its_profile_enables_subagent_planning(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    task = "Research the three longest rivers and compare their basins"
    replies = [
        spawn(task=task, profile_id="planner"),
        {"text": "DIRECT"},  # the planner sub-agent's phase 1
        {"text": "planned answer"},
        spawn(task=task),  # "pa": subagent_planning_enabled is off
        {"text": "unplanned answer"},
        {"text": "done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="pa")
            reqs = h.chat_requests
            assert len(reqs) == 6
            # Phase 1 is a tool-less classification call about the task.
            assert tool_names(reqs[1]) == [] and task in reqs[1]["messages"][-1]["content"]
            assert tool_names(reqs[2]) == ["snapshot"]
            assert tool_names(reqs[4]) == ["snapshot", "block"]
            planner_id, plain_id = [f["agent_id"] for f in of_type(frames, "subagent_started")]
            phases = of_type(frames, "plan_phase")
            assert phases and all(f["is_subagent"] and f["agent_id"] == planner_id for f in phases)
            assert not [f for f in phases if f["agent_id"] == plain_id]
            assert tool_contents(reqs[5]) == ["planned answer", "unplanned answer"]


async def test_subagent_session_tools_work_on_the_parent_session(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        spawn(task="Write the notes"),
        calls(
            call("filesystem", action="write", path="notes.txt", content="from the sub-agent"),
            call("scratchpad", action="write", content="pad from the sub-agent"),
            call("todo", action="add", text="step added by the sub-agent"),
        ),
        {"text": "wrote them"},
        {"text": "done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s-parent", "hi", profile_id="writer")
            sub_results = of_type(frames, "tool_result", is_subagent=True)
            assert [r["ok"] for r in sub_results] == [True, True, True], sub_results
            sessions = tmp_path / "data" / "sessions"
            note = sessions / "s-parent" / "notes.txt"
            assert note.read_text() == "from the sub-agent"
            assert [p.name for p in sessions.iterdir()] == ["s-parent"]
            kv = h.runtime.store
            assert await kv.kv_get("scratchpad", "s-parent") == "pad from the sub-agent"
            todo = await kv.kv_get("todo", "s-parent")
            assert [s["text"] for s in todo] == ["step added by the sub-agent"]
            assert not [k for k, _ in await kv.kv_list("todo") if k.startswith("subagent_")]


# --- events ----------------------------------------------------------------------------


async def test_subagent_events_reach_the_parent_stream_live_and_marked(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        spawn(task="Wait for the gate"),
        calls(call("block", label="g")),
        {"text": "sub finished"},
        {"text": "parent done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            s = await h.session("s1")
            s.send("hi", profile_id="pa")
            early = await s.until_type("tool_started", name="block")
            # The sub-agent is still blocked in its tool: this frame came live.
            assert kit.block.finished == [] and len(kit.block.calls) == 1
            started = of_type(early, "subagent_started")
            assert len(started) == 1
            agent_id = started[0]["agent_id"]
            assert agent_id.startswith("subagent_") and started[0]["is_subagent"] is True
            assert early[-1]["is_subagent"] is True and early[-1]["agent_id"] == agent_id
            kit.block.release("g")
            frames = early + await s.until_end()
            sub = [f for f in frames if f["is_subagent"]]
            assert sub and all(f["agent_id"] == agent_id for f in sub)
            assert "".join(f["text"] for f in of_type(sub, "text_delta")) == "sub finished"
            (finished,) = of_type(frames, "subagent_finished")
            assert (finished["completed"], finished["text"]) == (True, "sub finished")
            # The progress the sub-agent's tool reported is forwarded too.
            assert of_type(sub, "tool_event", name="block")
            (parent_result,) = of_type(frames, "tool_result", name="spawn_agent")
            assert parent_result["is_subagent"] is False and parent_result["ok"] is True
            order = [f["seq"] for f in (started[0], finished, parent_result)]
            assert order == sorted(order)
            # Top-level frames stay unmarked.
            assert all(f["agent_id"] is None for f in frames if not f["is_subagent"])


# --- ContextVars -----------------------------------------------------------------------

PARENT_MSG: dict[str, Any] = {
    "user_id": "alice",
    "user_role": "admin",
    "user_info": {"name": "Alice"},
}


def _sub_replies(outcome: str) -> list[dict[str, Any]]:
    inside = calls(call("snapshot", label="inside"))
    if outcome == "success":
        return [inside, {"text": "seen"}]
    if outcome == "failure":  # its own request refused: the call's failed result
        return [inside, {"status": 404, "error_body": "the sub model is not here"}]
    if outcome == "backend":  # the backend failed: raised
        return [inside, {"status": 500, "error_body": "the sub model crashed"}]
    return [inside, {"text": "thinking", "stall": True}]  # timeout


# The timeout case waits out the sub-agent's 1 s on the real clock: slow.
@pytest.mark.parametrize(
    "outcome", ["success", "failure", pytest.param("timeout", marks=pytest.mark.slow)]
)
async def test_parent_contextvars_survive_a_spawn(tmp_path: Path, outcome: str) -> None:
    kit = make_kit()
    replies = [
        calls(call("snapshot", label="before")),
        spawn(task="Look around", profile_id="sub", timeout_seconds=1),
        *_sub_replies(outcome),
        calls(call("snapshot", label="after")),
        {"text": "done"},
    ]
    cwd = tmp_path / "work"
    cwd.mkdir()
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            alice = await h.user("alice", "admin")
            msg = {**PARENT_MSG, "user_id": alice}
            frames = await h.turn("s1", "hi", profile_id="pa", cwd=cwd, **msg)
            (result,) = of_type(frames, "tool_result", name="spawn_agent")
            assert result["ok"] is (outcome == "success")
            if outcome == "failure":
                assert "the sub model is not here" in result["output"]
            if outcome == "timeout":
                assert "timed out after 1 s" in result["output"]
            (before,) = kit.snapshot.by_label("before")
            (inside,) = kit.snapshot.by_label("inside")
            (after,) = kit.snapshot.by_label("after")
            assert before["vars"] == {
                "session_id": "s1",
                "model": "model-pa",
                "working_directory": cwd,
                "user_id": alice,
                "user_role": "admin",
                "user_info": {"name": "Alice"},
            }
            # The sub-agent really changed them (so "after" proves a restore) ...
            assert inside["vars"]["model"] == "sub-model"
            assert inside["is_subagent"] is True and inside["session_id"] == "s1"
            # ... and the parent's next tool call sees its own values again.
            assert after["vars"] == before["vars"]
            assert after["is_subagent"] is False


# The timeout case waits out the sub-agent's 1 s on the real clock: slow.
@pytest.mark.parametrize(
    "outcome",
    ["success", "failure", "backend", pytest.param("timeout", marks=pytest.mark.slow), "stop"],
)
async def test_run_ephemeral_restores_the_callers_contextvars(tmp_path: Path, outcome: str) -> None:
    kit = make_kit()
    if outcome == "stop":
        replies = [calls(call("snapshot", label="inside")), calls(call("block"))]
    else:
        replies = _sub_replies(outcome)
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            with runvars.bound(
                session_id="caller",
                model="caller-model",
                working_directory=tmp_path,
                user_id="bob",
                user_role="user",
                user_info={"k": 1},
            ):
                before = runvars.snapshot()
                outcome_seen = await _run_ephemeral_for(h, kit, outcome)
                after = runvars.snapshot()
            assert after == before
            (inside,) = kit.snapshot.by_label("inside")
            assert inside["vars"]["session_id"].startswith("subagent_")
            assert inside["vars"]["model"] == "sub-model"
            if outcome in ("stop", "backend"):
                assert outcome_seen is None
                assert kit.block.cancelled == (["default"] if outcome == "stop" else [])
            else:
                assert outcome_seen is not None
                assert outcome_seen[1] is (outcome == "success")


async def _run_ephemeral_for(h: Harness, kit: Kit, outcome: str) -> tuple[str, bool] | None:
    agent = h.runtime.agent
    if outcome == "backend":
        with pytest.raises(LLMStatusError):
            await agent.run_ephemeral(SpawnRequest(task="Look", profile_id="sub"))
        return None
    if outcome != "stop":
        done: tuple[str, bool] = await agent.run_ephemeral(
            SpawnRequest(task="Look", profile_id="sub", timeout_seconds=0.5)
        )
        return done
    result: tuple[str, bool] | None = None
    async with trio.open_nursery() as nursery:
        # The parent's Stop: cancel the scope the sub-agent runs in, from outside.
        with trio.CancelScope() as parent_run:

            async def stop_when_blocked() -> None:
                await kit.block.wait_started()
                parent_run.cancel()

            nursery.start_soon(stop_when_blocked)
            result = await agent.run_ephemeral(SpawnRequest(task="Look", profile_id="sub"))
    return result


# --- Stop --------------------------------------------------------------------------------


async def test_stop_on_the_parent_stops_a_synchronous_subagent(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [spawn(task="Block"), calls(call("block"))]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            s = await h.session("s1")
            s.send("hi", profile_id="pa")
            await kit.block.wait_started()
            assert s.stop() is True
            frames = await s.until_end()
            end = frames[-1]
            assert (end["reason"], end["stopped"]) == ("stopped", True)
            assert kit.block.cancelled == ["default"]  # the sub-agent's tool was cancelled
            (result,) = of_type(frames, "tool_result", name="spawn_agent")
            assert (result["ok"], result["error"]) == (False, STOPPED_TEXT)
            # The sub-agent's card closes: subagent_finished(completed=False) still comes.
            (finished,) = of_type(frames, "subagent_finished")
            assert finished["completed"] is False and finished["is_subagent"] is True
            assert len(h.chat_requests) == 2  # the sub-agent asked nothing more
            context = await h.runtime.store.load_context("s1")
            call_id = next(m for m in context if m.get("tool_calls"))["tool_calls"][0]["id"]
            paired = [m for m in context if m.get("tool_call_id") == call_id]
            assert [m["content"] for m in paired] == [f"Error: {STOPPED_TEXT}"]
            await s.idle()
            # The session takes the next message normally.
            h.add_replies({"text": "back"})
            s.send("hi again")
            later = await s.until_end()
            assert later[-1]["text"] == "back"
