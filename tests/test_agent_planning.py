"""The planning phase inside the loop: when it runs, phase 2, mandatory plans, and a
3-step plan executed with tools (plan message, is_plan, todo list, plan event).

Rules: see tests/test_agent_basic.py (fake LLM over real HTTP, real SQLite, real time,
absolute timeouts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from agent_tools import EchoTool, RecordTool, of_type, toolset, with_tools

from navi_trio.testing import open_harness
from navi_trio.tools.todo import load_todo

TIMEOUT = 30
PLAN = """Complexity: simple
Milestones:
- Value recorded and echoed
Steps:
1. Record the starting state — TOOL: record
2. Echo the value back — TOOL: echo
3. Summarise the result for the user — SELF
"""
STEP_TEXTS = [
    "Record the starting state — TOOL: record",
    "Echo the value back — TOOL: echo",
    "Summarise the result for the user — SELF",
]
REQUEST = "Record the state, echo the value and summarise it"


def _calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in calls]}


def _done(i: int) -> tuple[str, dict[str, Any]]:
    return ("todo", {"action": "update", "index": i, "status": "done", "validation": "seen"})


async def test_three_step_plan_is_made_and_executed_with_tools(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        rec = RecordTool()
        replies = [
            {"text": "Three small steps.\nREFLECT: no"},
            {"text": PLAN},
            _calls(("record", {}), _done(1)),
            _calls(("echo", {"text": "42"}), _done(2)),
            _calls(_done(3)),
            {"text": "Recorded, echoed 42, all done."},
        ]
        async with open_harness(
            tmp_path,
            replies=replies,
            tools=toolset(rec, EchoTool()),
            profiles={"general": with_tools(["record", "echo", "todo"])},
        ) as h:
            frames = await h.turn("s1", REQUEST)
            store = h.runtime.store
            reqs = h.chat_requests
            assert len(reqs) == 6
            # Phase 3 was told the tools it may assign.
            assert "- record" in reqs[1]["messages"][-1]["content"]

            plan = of_type(frames, "plan")
            assert len(plan) == 1
            steps = plan[0]["steps"]
            assert [(s["index"], s["executor"], s["target"]) for s in steps] == [
                (1, "TOOL", "record"),
                (2, "TOOL", "echo"),
                (3, "SELF", None),
            ]
            assert plan[0]["milestones"] == ["Value recorded and echoed"]
            assert plan[0]["complexity"] == "simple"

            # The todo list was filled from the steps, then ticked off by the model.
            todo_events = of_type(frames, "todo_updated")
            assert [s["text"] for s in todo_events[0]["steps"]] == STEP_TEXTS
            assert {s["status"] for s in todo_events[0]["steps"]} == {"pending"}
            todo = await load_todo(store, "s1")
            assert [(t.text, t.status) for t in todo] == [(t, "done") for t in STEP_TEXTS]

            # The plan is in the context as an assistant message, and in the display
            # history with is_plan, right after the user message.
            context = await store.load_context("s1")
            messages = await store.load_messages("s1")
            assert context[1]["role"] == "assistant" and context[1]["is_plan"] is True
            assert context[1]["content"].startswith("## Plan")
            assert messages[1]["is_plan"] is True and messages[1]["role"] == "assistant"
            main = reqs[2]["messages"]
            assert main[-3]["role"] == "user" and main[-3]["content"] == REQUEST
            assert (
                main[-2]["role"] == "assistant"
                and "1. Record the starting state" in (main[-2]["content"])
            )

            names = [f["name"] for f in of_type(frames, "tool_started")]
            assert names == ["record", "todo", "echo", "todo", "todo"]
            assert all(f["ok"] for f in of_type(frames, "tool_result"))
            assert frames[-1]["reason"] == "complete" and frames[-1]["iterations"] == 4


async def test_phase2_review_runs_only_when_enabled_and_asked(tmp_path: Path) -> None:
    review = "Critic: the user may mean another value.\nPlan Adjustments: check it first."
    analysis = {"text": "Needs care.\nREFLECT: yes"}
    with trio.fail_after(TIMEOUT):
        replies = [analysis, {"text": review}, {"text": PLAN}, {"text": "done"}]
        async with open_harness(
            tmp_path,
            replies=replies,
            profiles={"general": {"planning_phase2_enabled": True}},
        ) as h:
            frames = await h.turn("s1", REQUEST)
            reqs = h.chat_requests
            assert len(reqs) == 4
            assert "Needs care." in reqs[1]["messages"][-1]["content"]
            plan_prompt = reqs[2]["messages"][-1]["content"]
            assert "check it first." in plan_prompt and "### Critic" in plan_prompt
            phases = [(f["phase"], f["status"]) for f in of_type(frames, "plan_phase")]
            assert ("review", "done") in phases

    with trio.fail_after(TIMEOUT):
        replies = [analysis, {"text": PLAN}, {"text": "done"}]
        async with open_harness(tmp_path / "off", replies=replies) as h:
            frames = await h.turn("s1", REQUEST)
            assert len(h.chat_requests) == 3
            assert "check it first." not in h.chat_requests[1]["messages"][-1]["content"]
            review_phase = [f for f in of_type(frames, "plan_phase") if f["phase"] == "review"]
            assert review_phase[0]["status"] == "skipped"
            assert review_phase[0]["detail"] == "phase 2 disabled"


async def test_planning_enabled_plans_every_non_casual_turn(tmp_path: Path) -> None:
    for enabled, expected in ((True, 2), (False, 1)):
        with trio.fail_after(TIMEOUT):
            replies = [{"text": "hi!"}, {"text": "DIRECT"}, {"text": "sure"}]
            async with open_harness(
                tmp_path / str(enabled),
                replies=replies[: expected + 1],
                profiles={"general": {"planning_enabled": enabled}},
            ) as h:
                await h.turn("s1", "hello")  # casual: never planned
                frames = await h.turn("s1", "Write a haiku about trio nurseries")
                assert len(h.chat_requests) == expected + 1
                assert bool(of_type(frames, "plan_phase")) is enabled
                assert frames[-1]["text"] == ("sure" if enabled else "DIRECT")


async def test_planning_mandatory_overrides_direct_on_every_turn(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [
            {"text": "DIRECT"},
            {"text": PLAN},
            {"text": "first answer"},
            {"text": "DIRECT"},
            {"text": PLAN},
            {"text": "second answer"},
            {"text": "hey there"},
        ]
        async with open_harness(
            tmp_path,
            replies=replies,
            profiles={"general": {"planning_mandatory": True}},
        ) as h:
            frames = await h.turn("s1", REQUEST)
            assert of_type(frames, "plan") and frames[-1]["text"] == "first answer"
            assert "a plan is required" in h.chat_requests[1]["messages"][-1]["content"]
            frames = await h.turn("s1", "Now do it again with another value")
            assert of_type(frames, "plan") and frames[-1]["text"] == "second answer"
            # A casual message is never planned, mandatory or not.
            frames = await h.turn("s1", "thanks!")
            assert not of_type(frames, "plan_phase") and frames[-1]["text"] == "hey there"
            messages = await h.runtime.store.load_messages("s1")
            assert sum(1 for m in messages if m.get("is_plan")) == 2

    with trio.fail_after(TIMEOUT):
        # Without the flag the same DIRECT answer means no plan.
        replies = [{"text": "DIRECT"}, {"text": "plain answer"}]
        async with open_harness(tmp_path / "off", replies=replies) as h:
            frames = await h.turn("s1", REQUEST)
            assert not of_type(frames, "plan") and frames[-1]["text"] == "plain answer"


# -- bounds on planning (issue 7 #2) ------------------------------------------------------


def _warnings(frames: list[Any]) -> list[tuple[str, str]]:
    return [(f["code"], f["message"]) for f in of_type(frames, "warning")]


async def test_a_phase_cut_at_its_cap_is_a_failed_phase_and_the_turn_goes_on(
    tmp_path: Path,
) -> None:
    for cut_at in ("analysis", "plan"):
        analysis = {"text": "Goal: a long analysis that never ends " * 20}
        if cut_at == "analysis":
            replies = [{**analysis, "done_reason": "length"}, {"text": "the answer"}]
        else:
            replies = [
                {"text": "Goal: x\nREFLECT: no"},
                {"text": PLAN[:60], "done_reason": "length"},
                {"text": "the answer"},
            ]
        with trio.fail_after(TIMEOUT):
            async with open_harness(tmp_path / cut_at, replies=replies) as h:
                frames = await h.turn("s1", REQUEST)
                warnings = _warnings(frames)
                assert [code for code, _ in warnings] == ["plan_cut"], warnings
                assert f"the {cut_at} phase was cut at its output cap of 1024" in warnings[0][1]
                assert not of_type(frames, "plan") and not of_type(frames, "todo_updated")
                phases = [(f["phase"], f["status"]) for f in of_type(frames, "plan_phase")]
                assert phases[-1] == (cut_at, "failed")
                assert frames[-1]["reason"] == "complete" and frames[-1]["text"] == "the answer"
                context = await h.runtime.store.load_context("s1")
                assert not any(m.get("is_plan") for m in context)
                # The answer call did not get the cut text as a plan.
                assert "## Plan" not in str(h.chat_requests[-1]["messages"])


async def test_a_planning_prompt_that_cannot_fit_is_never_sent(tmp_path: Path) -> None:
    # ~1000 tokens of request: the analysis prompt with room for its 1024-token answer
    # does not fit a 2048 window, while the turn's own call (no planning prompt) does.
    request = "Summarise this text: " + "word " * 1000
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "short"}], num_ctx=2048) as h:
            frames = await h.turn("s1", request)
            warnings = _warnings(frames)
            assert [code for code, _ in warnings] == ["plan_too_large"]
            assert "analysis prompt needs ~" in warnings[0][1] and "(2048" in warnings[0][1]
            reqs = h.chat_requests
            assert len(reqs) == 1 and reqs[0]["messages"][-2]["content"] == request
            assert frames[-1]["reason"] == "complete" and frames[-1]["text"] == "short"


async def test_a_long_analysis_is_cut_before_it_is_carried_into_the_plan(
    tmp_path: Path,
) -> None:
    analysis = "Goal: START " + "detail " * 3000 + "END\nREFLECT: no"
    replies = [{"text": analysis}, {"text": PLAN}, *_finish_plan(), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, profiles={"general": {"plan_max_tokens": 500}}
        ) as h:
            frames = await h.turn("s1", REQUEST)
            plan_prompt = h.chat_requests[1]["messages"][-1]["content"]
            assert "[the analysis was cut to 500 tokens]" in plan_prompt
            assert "START" in plan_prompt and "END" in plan_prompt  # head and tail kept
            assert plan_prompt.count("detail") < 600
            assert len(of_type(frames, "plan")) == 1


def _finish_plan() -> list[dict[str, Any]]:
    return [_calls(_done(1)), _calls(_done(2)), _calls(_done(3))]


async def test_a_plan_with_no_parsable_steps_gives_no_plan_and_the_turn_answers(
    tmp_path: Path,
) -> None:
    unreadable = "Complexity: simple\nMilestones: done\nI would just answer this directly."
    replies = [{"text": "Goal: x\nREFLECT: no"}, {"text": unreadable}, {"text": "the answer"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies) as h:
            frames = await h.turn("s1", REQUEST)
            phases = [(f["phase"], f["status"], f["detail"]) for f in of_type(frames, "plan_phase")]
            assert phases[-1] == ("plan", "done", "0 steps")
            assert not of_type(frames, "plan") and not of_type(frames, "todo_updated")
            assert not of_type(frames, "warning")
            assert frames[-1]["reason"] == "complete" and frames[-1]["text"] == "the answer"
            context = await h.runtime.store.load_context("s1")
            assert [m["role"] for m in context] == ["user", "assistant"]
            assert not any(m.get("is_plan") for m in context)


async def test_a_profile_can_drop_the_first_message_plan(tmp_path: Path) -> None:
    """The `local` profile's rule: no planning calls on a session's first message."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[{"text": "Straight to the answer."}],
            profiles={"general": {"planning_first_message": False}},
        ) as h:  # fmt: skip
            frames = await h.turn("s1", REQUEST)
            assert frames[-1]["text"] == "Straight to the answer."
            assert not of_type(frames, "plan_phase")
            assert len(h.chat_requests) == 1


def test_the_shipped_local_profile_is_for_small_models() -> None:
    from navi_trio.profiles import ConfigSource
    from navi_trio.settings import default_config_path

    local = ConfigSource(default_config_path()).current.profile("local")
    assert local.id == "local" and not local.planning_first_message
    assert not local.planning_enabled and not local.think_enabled
    assert local.max_iterations <= 5
