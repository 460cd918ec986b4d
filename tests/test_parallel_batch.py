"""Parallel tool-call batches end to end (issue 4, "Parallel tool-call batch").

With `parallel_tool_calls` on (the profile's override, else Settings), 2+ calls of one
response run concurrently: the batch's tool_started frames first, in call order; live
events merged and tagged with their call; results appended in call order with one
save; Stop mid-batch pairs the unfinished calls with "stopped by the user"; one tool's
exception is its own failed result, but a sub-agent's backend failure ends the turn.

The "meet" test tool proves the overlap: each call waits for the others to start, so
the batch deadlocks when run one call after another (the absolute timeout would fail
the test) and finishes when the calls really run at the same time.

Rules: real HTTP to the fake LLM on 127.0.0.1 (port 0) through `open_harness`, a real
SQLite file under tmp_path, real time, every test under an absolute `fail_after`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from bg_tools import Kit, call, calls, make_kit, of_type, profile

from navi_trio.core.turn.tool_executor import STOPPED_TEXT
from navi_trio.testing import open_harness
from navi_trio.tools.base import ToolContext, ToolResult

TIMEOUT = 30
TOOLS = ["meet", "boom", "block", "snapshot"]

PROFILES: dict[str, dict[str, Any]] = {
    "par": profile(TOOLS, parallel_tool_calls=True),
    "seq": profile(TOOLS, parallel_tool_calls=False),
    "inherit": profile(TOOLS),  # parallel_tool_calls unset: Settings decides
    "par-spawn": profile([*TOOLS, "spawn_agent"], ["snapshot"], parallel_tool_calls=True),
}


def harness(tmp_path: Path, kit: Kit, replies: list[dict[str, Any]], **settings: Any) -> Any:
    return open_harness(tmp_path, replies=replies, profiles=PROFILES, tools=kit.tools(), **settings)


class WhereTool:
    """Records the trio task each call runs in, by its label."""

    name = "where"
    description = "notes the task it runs in"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.tasks: dict[str, trio.lowlevel.Task] = {}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.tasks[str(args["label"])] = trio.lowlevel.current_task()
        return ToolResult.success("noted")


def meet(name: str, **arguments: Any) -> dict[str, Any]:
    return call("meet", name=name, **arguments)


def tool_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] in ("tool_started", "tool_event", "tool_result")]


async def test_a_batch_really_overlaps(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        calls(
            meet("a", wait_start=["b", "c"]),
            meet("b", wait_start=["a", "c"]),
            meet("c", wait_start=["a", "b"]),
        ),
        {"text": "we met"},
    ]
    with trio.fail_after(TIMEOUT):  # run one by one, "a" would wait here forever
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="par")
            assert frames[-1]["text"] == "we met"
            results = of_type(frames, "tool_result")
            assert [r["ok"] for r in results] == [True, True, True]
            # All three started before any of them could finish.
            assert sorted(kit.rendezvous.log[:3]) == ["start:a", "start:b", "start:c"]


async def test_batch_frames_start_first_in_order_and_live_events_are_tagged(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    replies = [
        calls(
            meet("a", wait_start=["b", "c"]),
            meet("b", wait_start=["a", "c"]),
            meet("c", wait_start=["a", "b"]),
        ),
        {"text": "ok"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = tool_frames(await h.turn("s1", "hi", profile_id="par"))
            assert [f["type"] for f in frames[:3]] == ["tool_started"] * 3
            call_ids = [f["call_id"] for f in frames[:3]]
            assert [f["arguments"]["name"] for f in frames[:3]] == ["a", "b", "c"]
            assert len(set(call_ids)) == 3
            # Every call's live event arrives before any result (they run together),
            # each tagged with the call (id and tool name) it came from.
            events = of_type(frames, "tool_event")
            first_result = next(i for i, f in enumerate(frames) if f["type"] == "tool_result")
            assert all(frames.index(e) < first_result for e in events)
            tagged = {e["call_id"]: e["data"]["who"] for e in events}
            assert tagged == dict(zip(call_ids, ["a", "b", "c"], strict=True))
            assert {e["name"] for e in events} == {"meet"}


async def test_results_are_appended_in_call_order_with_one_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = make_kit()
    # They finish in reverse order: c, then b, then a.
    replies = [
        calls(meet("a", wait_end=["b"]), meet("b", wait_end=["c"]), meet("c")),
        {"text": "ok"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            store = h.runtime.store
            saves: list[list[str]] = []
            real_append = store.append

            async def counting_append(session_id: str, **kwargs: Any) -> None:
                saves.append([m["role"] for m in kwargs.get("context", ())])
                await real_append(session_id, **kwargs)

            monkeypatch.setattr(store, "append", counting_append)
            frames = await h.turn("s1", "hi", profile_id="par")
            started = of_type(frames, "tool_started")
            finished = of_type(frames, "tool_result")
            ids = [f["call_id"] for f in started]
            assert [f["call_id"] for f in finished] == ids[::-1]
            ends = [e for e in kit.rendezvous.log if e.startswith("end:")]
            assert ends == ["end:c", "end:b", "end:a"]
            context = await store.load_context("s1")
            tool_msgs = [m for m in context if m["role"] == "tool"]
            assert [m["tool_call_id"] for m in tool_msgs] == ids
            assert [m["content"] for m in tool_msgs] == [
                "a met the others",
                "b met the others",
                "c met the others",
            ]
            with_results = [roles for roles in saves if "tool" in roles]
            assert with_results == [["tool", "tool", "tool"]]


@pytest.mark.parametrize(
    ("profile_id", "setting", "parallel"),
    [
        ("inherit", True, True),  # no override: Settings on
        ("inherit", False, False),  # no override: Settings off (the default)
        ("par", False, True),  # the profile's override wins ...
        ("seq", True, False),  # ... both ways
    ],
)
async def test_the_profile_override_else_settings_decides(
    tmp_path: Path, profile_id: str, setting: bool, parallel: bool
) -> None:
    kit = make_kit()
    # "a" waits (briefly) for "b" to start: only a concurrent batch lets it.
    replies = [calls(meet("a", wait_start=["b"], patience=0.2), meet("b")), {"text": "ok"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies, parallel_tool_calls=setting) as h:
            frames = tool_frames(await h.turn("s1", "hi", profile_id=profile_id))
            kinds = [f["type"] for f in frames if f["type"] != "tool_event"]
            a_result = of_type(frames, "tool_result", name="meet")[0]
            if parallel:
                assert kinds == ["tool_started"] * 2 + ["tool_result"] * 2
                assert a_result["ok"] is True, a_result
            else:
                assert kinds == ["tool_started", "tool_result"] * 2
                assert a_result["error"] == "a gave up waiting for the others"
                assert kit.rendezvous.log == ["start:a", "end:a", "start:b", "end:b"]


async def test_a_lone_call_runs_inline_even_with_parallel_calls_on(tmp_path: Path) -> None:
    """background-tasks spec: "the batch is used only for 2+ calls". With parallel
    calls on, an answer with one call runs it in the turn's own task, as a sequential
    round does; only an answer with two or more starts a batch (a task per call)."""
    where = WhereTool()
    replies = [
        calls(call("where", label="alone-1")),
        calls(call("where", label="alone-2")),
        calls(call("where", label="pair-a"), call("where", label="pair-b")),
        {"text": "done"},
    ]
    profiles = {"par-where": profile(["where"], parallel_tool_calls=True)}
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, profiles=profiles, tools=[*make_kit().tools(), where]
        ) as h:
            frames = await h.turn("s1", "hi", profile_id="par-where")
            assert frames[-1]["text"] == "done"
            seen = where.tasks
            assert seen["alone-1"] is seen["alone-2"]  # the turn's task, both rounds
            assert seen["pair-a"] is not seen["pair-b"]
            assert {seen["pair-a"], seen["pair-b"]}.isdisjoint({seen["alone-1"]})


async def test_stop_mid_batch_cancels_the_unfinished_calls(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        calls(meet("quick"), call("block", label="x"), call("block", label="y")),
        {"text": "never asked for"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            s = await h.session("s1")
            s.send("hi", profile_id="par")
            await s.until_type("tool_result", name="meet")
            await kit.block.wait_started(2)
            assert s.stop() is True
            frames = await s.until_end()
            assert frames[-1]["reason"] == "stopped"
            assert sorted(kit.block.cancelled) == ["x", "y"]
            stopped = of_type(frames, "tool_result", name="block")
            assert [(r["ok"], r["error"]) for r in stopped] == [(False, STOPPED_TEXT)] * 2
            assert len(h.chat_requests) == 1
            context = await h.runtime.store.load_context("s1")
            assistant = next(m for m in context if m.get("tool_calls"))
            ids = [c["id"] for c in assistant["tool_calls"]]
            tool_msgs = [m for m in context if m["role"] == "tool"]
            assert [m["tool_call_id"] for m in tool_msgs] == ids
            assert [m["content"] for m in tool_msgs] == [
                "quick met the others",
                f"Error: {STOPPED_TEXT}",
                f"Error: {STOPPED_TEXT}",
            ]


async def test_one_tools_exception_is_its_own_failed_result(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        calls(call("boom"), meet("a"), call("snapshot", label="s")),
        {"text": "carried on"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="par")
            assert (frames[-1]["reason"], frames[-1]["text"]) == ("complete", "carried on")
            results = {r["name"]: r for r in of_type(frames, "tool_result")}
            assert results["boom"]["ok"] is False
            assert results["boom"]["error"] == (
                "the tool boom raised RuntimeError: boom: a deliberate tool bug"
            )
            assert results["meet"]["ok"] is True and results["snapshot"]["ok"] is True
            tool_msgs = [m for m in h.chat_requests[1]["messages"] if m["role"] == "tool"]
            assert [m["content"] for m in tool_msgs][:2] == [
                "Error: the tool boom raised RuntimeError: boom: a deliberate tool bug",
                "a met the others",
            ]


async def test_a_subagents_backend_failure_stops_the_batch_and_ends_the_turn(
    tmp_path: Path,
) -> None:
    """background-tasks spec, parallel batch: "one tool's exception is recorded as its
    own failed result and does not kill its neighbours (backend-level LLM errors still
    abort the turn)". The sub-agent's backend fails: its neighbour, which would wait
    forever, is stopped, every call is paired, and the turn ends with the error."""
    kit = make_kit()
    replies = [
        calls(call("block", label="x"), call("spawn_agent", task="Dig")),
        {"status": 503, "error_body": "the server is overloaded"},
        {"text": "never asked for"},
    ]
    with trio.fail_after(TIMEOUT):  # the block call would hold the batch forever
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="par-spawn")
            assert frames[-1]["reason"] == "error"
            (error,) = [f for f in of_type(frames, "error") if not f["is_subagent"]]
            assert error["code"] == "llm_status" and "the server is overloaded" in error["message"]
            assert len(h.chat_requests) == 2
            assert kit.block.finished == []
            kinds = [f["type"] for f in tool_frames(frames) if f["type"] != "tool_event"]
            assert kinds[:2] == ["tool_started"] * 2
            results = of_type(frames, "tool_result")
            assert sorted(r["name"] for r in results) == ["block", "spawn_agent"]
            for r in results:
                assert r["ok"] is False and r["stopped"] is True
                assert r["error"].startswith("not finished: the turn ended on an LLM error")
            context = await h.runtime.store.load_context("s1")
            assistant = next(m for m in context if m.get("tool_calls"))
            ids = [c["id"] for c in assistant["tool_calls"]]
            assert [m["tool_call_id"] for m in context if m["role"] == "tool"] == ids
