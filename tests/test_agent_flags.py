"""Every thinking flag of a profile, on and off, proved by what the model was sent
(or what the loop did): think, iteration budget, goal anchoring, anti-stall (also for
identical repeated calls), step validation, adaptive re-plan, max_iterations, profile
switch, parallel tool calls.

Rules: see tests/test_agent_basic.py. The sessions are seeded with an earlier user
message so that a non-casual message is not a first message (no planning call).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import trio
from agent_tools import (
    BumpTool,
    EchoTool,
    RecordTool,
    assert_paired,
    call,
    of_type,
    seed,
    system_notes,
    tool_contents,
    toolset,
    with_tools,
)

from navi_trio.events import TodoStep
from navi_trio.testing import open_harness
from navi_trio.tools.todo import load_todo

TIMEOUT = 30
GOAL = "Find the answer to the question"


def _echoes(n: int) -> list[dict[str, Any]]:
    """n different echo calls (no todo progress), then a final answer."""
    return [call("echo", text=f"v{i}") for i in range(n)] + [{"text": "final"}]


@attrs.frozen
class Saved:
    todo: list[TodoStep]
    messages: list[dict[str, Any]]
    context: list[dict[str, Any]]


async def _run(
    tmp_path: Path,
    replies: list[dict[str, Any]],
    flags: dict[str, Any],
    text: str = GOAL,
    tools: tuple[str, ...] = ("echo", "todo", "bump"),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Saved]:
    """One seeded turn with `flags` on the general profile: frames, request bodies and
    what the store holds afterwards."""
    async with open_harness(
        tmp_path,
        replies=replies,
        tools=toolset(EchoTool(), BumpTool()),
        profiles={"general": with_tools(tools, **flags)},
    ) as h:
        await seed(h)
        frames = await h.turn("s1", text)
        store = h.runtime.store
        saved = Saved(
            todo=await load_todo(store, "s1"),
            messages=await store.load_messages("s1"),
            context=await store.load_context("s1"),
        )
        return frames, h.chat_requests, saved


async def test_think_enabled_passes_think_true(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        _, on, _ = await _run(tmp_path / "on", [{"text": "a"}], {"think_enabled": True})
        _, off, _ = await _run(tmp_path / "off", [{"text": "a"}], {"think_enabled": False})
        assert on[0]["think"] is True
        assert "think" not in off[0]


async def test_iteration_budget_note(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        flags = {"max_iterations": 3}
        _, on, _ = await _run(tmp_path / "on", _echoes(1), {**flags})
        assert system_notes(on[0])[-1].startswith("[Iteration 1 of 3; 2 left")
        assert system_notes(on[1])[-1].startswith("[Iteration 2 of 3; 1 left")
        _, off, _ = await _run(
            tmp_path / "off", _echoes(1), {**flags, "iteration_budget_enabled": False}
        )
        assert not any("[Iteration" in n for body in off for n in system_notes(body))


async def test_goal_anchor_every_interval(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        flags = {"goal_anchoring_interval": 2, "anti_stall_enabled": False}
        _, on, _ = await _run(tmp_path / "on", _echoes(4), flags)
        anchored = [
            i
            for i, body in enumerate(on)
            if any(n.startswith("[Goal reminder]") and GOAL in n for n in system_notes(body))
        ]
        assert anchored == [2, 4]
        _, off, _ = await _run(
            tmp_path / "off", _echoes(4), {**flags, "goal_anchoring_enabled": False}
        )
        assert not any("[Goal reminder]" in n for body in off for n in system_notes(body))


def _warned(bodies: list[dict[str, Any]]) -> list[int]:
    return [
        i
        for i, body in enumerate(bodies)
        if any(n.startswith("[Warning]") for n in system_notes(body))
    ]


async def test_anti_stall_warns_after_threshold_without_progress(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        flags = {"anti_stall_threshold": 2, "goal_anchoring_enabled": False}
        frames, on, _ = await _run(tmp_path / "on", _echoes(3), flags)
        assert _warned(on) == [2]  # after two calls without todo progress
        warnings = [f for f in of_type(frames, "warning") if f["code"] == "anti_stall"]
        assert len(warnings) == 1
        frames, off, _ = await _run(
            tmp_path / "off", _echoes(3), {**flags, "anti_stall_enabled": False}
        )
        assert _warned(off) == [] and not of_type(frames, "warning")


async def test_anti_stall_counts_identical_repeated_calls(tmp_path: Path) -> None:
    flags = {"anti_stall_threshold": 2, "goal_anchoring_enabled": False}
    with trio.fail_after(TIMEOUT):
        # Each bump adds a todo step (progress), but the same call with the same
        # result over and over is a loop all the same.
        same = [call("bump")] * 3 + [{"text": "final"}]
        _, bodies, saved = await _run(tmp_path / "same", same, flags)
        assert len(saved.todo) == 3  # the todo did change each time
        assert _warned(bodies) == [3]
        # Different arguments each time: real progress, no warning.
        varied = [call("bump", n=i) for i in range(3)] + [{"text": "final"}]
        _, bodies, _ = await _run(tmp_path / "varied", varied, flags)
        assert _warned(bodies) == []


def _todo_add_then(status: str, **extra: Any) -> dict[str, Any]:
    update = {"action": "update", "index": 1, "status": status, **extra}
    return {
        "tool_calls": [
            {"name": "todo", "arguments": {"action": "add", "text": "check the thing"}},
            {"name": "todo", "arguments": update},
        ]
    }


async def test_step_validation_refuses_done_without_validation(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [_todo_add_then("done"), {"text": "ok"}]
        _, on, saved = await _run(tmp_path / "on", replies, {"step_validation_enabled": True})
        refused = tool_contents(on[1])[-1]
        assert refused.startswith("Error:") and "without 'validation'" in refused
        assert [s.status for s in saved.todo] == ["pending"]

        _, off, saved = await _run(tmp_path / "off", replies, {"step_validation_enabled": False})
        assert "is now done" in tool_contents(off[1])[-1]
        assert [s.status for s in saved.todo] == ["done"]

        # With validation the step may be done even when the flag is on.
        replies = [_todo_add_then("done", validation="the test passed"), {"text": "ok"}]
        _, _, saved = await _run(tmp_path / "valid", replies, {"step_validation_enabled": True})
        assert [s.status for s in saved.todo] == ["done"]


async def test_adaptive_replan_after_a_failed_step(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [_todo_add_then("failed"), call("echo", text="x"), {"text": "ok"}]
        flags = {"adaptive_replan_enabled": True}
        _, on, _ = await _run(tmp_path / "on", replies, flags)
        notes = [n for n in system_notes(on[1]) if n.startswith("[Re-plan]")]
        assert len(notes) == 1 and "step 1 (check the thing) failed" in notes[0]
        # Queued for the next iteration only.
        assert not any(n.startswith("[Re-plan]") for n in system_notes(on[2]))

        _, off, _ = await _run(tmp_path / "off", replies, {"adaptive_replan_enabled": False})
        assert not any("[Re-plan]" in n for body in off for n in system_notes(body))


async def test_max_iterations_ends_the_turn(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [call("echo", text=f"v{i}") for i in range(5)]
        frames, bodies, saved = await _run(tmp_path, replies, {"max_iterations": 2})
        assert len(bodies) == 2
        assert "This is the last one" in system_notes(bodies[1])[-1]
        end = frames[-1]
        assert (end["reason"], end["iterations"], end["stopped"]) == ("max_iterations", 2, False)
        assert any(f["code"] == "max_iterations" for f in of_type(frames, "warning"))
        messages = saved.messages
        assert messages[-1]["role"] == "assistant" and "2 iterations" in messages[-1]["content"]
        assert_paired(messages)
        assert_paired(saved.context)


async def test_profile_switch_reloads_profile_and_tools(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [
            {
                "tool_calls": [
                    {"name": "switch_profile", "arguments": {"profile_id": "researcher"}},
                    {"name": "echo", "arguments": {"text": "still general"}},
                ]
            },
            call("record"),
            {"text": "switched"},
            {"text": "next turn"},
        ]
        rec = RecordTool()
        profiles = {
            "general": with_tools(["switch_profile", "echo"], think_enabled=True),
            "researcher": with_tools(["record", "echo"], think_enabled=False),
        }
        async with open_harness(
            tmp_path, replies=replies, tools=toolset(EchoTool(), rec), profiles=profiles
        ) as h:
            await seed(h)
            cfg = h.runtime.config.current
            frames = await h.turn("s1", GOAL)
            reqs = h.chat_requests

            def tools(i: int) -> set[str]:
                return {t["function"]["name"] for t in reqs[i]["tools"]}

            assert tools(0) == {"switch_profile", "echo"} and reqs[0]["think"] is True
            # The rest of the batch ran under the old profile; the next call uses the new one.
            assert of_type(frames, "tool_result")[1]["output"] == "still general"
            assert tools(1) == {"record", "echo"} and "think" not in reqs[1]
            researcher = cfg.profile("researcher").system_prompt.strip()
            assert reqs[1]["messages"][0]["content"].endswith(researcher)
            assert not reqs[0]["messages"][0]["content"].endswith(researcher)
            assert len(rec.seen) == 1
            row = await h.runtime.store.get_session("s1")
            assert row is not None and row.profile_id == "researcher"
            await h.turn("s1", "and now?")
            assert {t["function"]["name"] for t in h.chat_requests[3]["tools"]} == {
                "record",
                "echo",
            }


async def test_parallel_tool_calls_start_the_batch_up_front(tmp_path: Path) -> None:
    two = {
        "tool_calls": [
            {"name": "echo", "arguments": {"text": "a"}},
            {"name": "echo", "arguments": {"text": "b"}},
        ]
    }
    with trio.fail_after(TIMEOUT):
        order = {}
        for parallel in (True, False):
            frames, bodies, saved = await _run(
                tmp_path / str(parallel),
                [two, {"text": "ok"}],
                {"parallel_tool_calls": parallel},
            )
            order[parallel] = [
                f["type"] for f in frames if f["type"] in ("tool_started", "tool_result")
            ]
            # Results go back in call order either way.
            assert tool_contents(bodies[1]) == ["a", "b"]
            assert_paired(saved.context)
        assert order[True][:2] == ["tool_started", "tool_started"]
        assert order[False] == ["tool_started", "tool_result", "tool_started", "tool_result"]


async def test_anti_stall_warning_survives_a_mid_turn_compression(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        # The first answer claims a 1500-token prompt, so the second call is compressed
        # first (the context is rebuilt): the warning due on that call must still be in it.
        replies = [
            {**call("echo", size=120), "prompt_tokens": 1500},
            {"text": "SUMMARY"},
            {"text": "final"},
        ]
        flags = {
            "anti_stall_threshold": 1,
            "goal_anchoring_enabled": False,
            "compression_keep_recent": 2,
            "compression_max_tokens": 200,
        }
        async with open_harness(
            tmp_path,
            replies=replies,
            num_ctx=2048,
            tools=toolset(EchoTool()),
            profiles={"general": with_tools(["echo"], **flags)},
        ) as h:
            await seed(h)
            frames = await h.turn("s1", GOAL)
            assert of_type(frames, "compression_started")[0]["reason"] == "mid_turn"
            assert [f["code"] for f in of_type(frames, "warning")] == ["anti_stall"]
            assert _warned(h.chat_requests) == [2]
