"""Stop ends a run at once in every phase: planning, prefill, streaming, a running tool
(inline or in a parallel batch). Afterwards the store holds the user message, the
partial answer marked ``partial``, and a "stopped by the user" result for every tool
call that had none; StreamEnd says stopped; the next turn goes on from there.

Rules: see tests/test_agent_basic.py. Real time: every wait here is on an event (a
frame, a request the fake server got, a tool that started), never on a clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from agent_tools import (
    BlockTool,
    EchoTool,
    assert_paired,
    assert_wire_paired,
    of_type,
    seed,
    toolset,
    with_tools,
)

from navi_trio.core.turn import UserMessage
from navi_trio.core.turn.tool_executor import STOPPED_TEXT
from navi_trio.events import TextDelta
from navi_trio.testing import open_harness

TIMEOUT = 30
TASK = "Find the answer to the question"


def _assert_stopped(end: dict[str, Any]) -> None:
    assert end["type"] == "stream_end"
    assert (end["stopped"], end["reason"]) == (True, "stopped")


async def test_stop_during_planning(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"delay_first": 1000, "text": "DIRECT"}]) as h:
            s = await h.session("s1")
            s.send(TASK)
            await s.until(lambda f: f["type"] == "plan_phase" and f["status"] == "started")
            assert h.fake is not None
            await h.fake.wait_requests(1)
            assert s.stop() is True
            frames = await s.until_end()
            _assert_stopped(frames[-1])
            await h.fake.wait_disconnects(1)
            messages = await h.runtime.store.load_messages("s1")
            assert [(m["role"], m["content"]) for m in messages] == [("user", TASK)]
            assert await h.runtime.store.load_context("s1") == messages


async def test_stop_during_prefill_closes_the_connection(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"delay_first": 1000, "text": "late"}]) as h:
            await seed(h)
            s = await h.session("s1")
            s.send(TASK)
            assert h.fake is not None
            await h.fake.wait_requests(1)
            s.stop()
            frames = await s.until_end()
            _assert_stopped(frames[-1])
            assert not of_type(frames, "text_delta")
            await h.fake.wait_disconnects(1)
            assert h.fake.disconnects[0]["path"] == "/api/chat"
            messages = await h.runtime.store.load_messages("s1")
            assert messages[-1] == {**messages[-1], "role": "user", "content": TASK}


async def test_stop_mid_stream_saves_the_partial_answer(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies: list[dict[str, Any]] = [
            {"thinking": "hmm", "text": "The answer is", "stall": True},
            {"text": "continued"},
        ]
        async with open_harness(tmp_path, replies=replies) as h:
            await seed(h)
            s = await h.session("s1")
            s.send(TASK)
            await s.until(lambda f: f["type"] == "text_delta" and f["text"].endswith("is"))
            s.stop()
            frames = await s.until_end()
            _assert_stopped(frames[-1])
            assert frames[-1]["text"] == "The answer is"
            assert h.fake is not None
            await h.fake.wait_disconnects(1)
            for saved in (
                await h.runtime.store.load_messages("s1"),
                await h.runtime.store.load_context("s1"),
            ):
                assert saved[-2]["role"] == "user" and saved[-2]["content"] == TASK
                last = saved[-1]
                assert (last["role"], last["content"], last["partial"]) == (
                    "assistant",
                    "The answer is",
                    True,
                )
                assert last["thinking"] == "hmm"
            # The next turn sees the partial answer in its history.
            s.send("go on")
            await s.until_end()
            sent = h.chat_requests[1]["messages"]
            assert [m["content"] for m in sent if m["role"] != "system"][-3:] == [
                TASK,
                "The answer is",
                "go on",
            ]


async def test_stop_during_a_running_tool_pairs_every_call(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        block = BlockTool()
        three = {
            "text": "Working.",
            "tool_calls": [
                {"name": "echo", "arguments": {"text": "first"}},
                {"name": "block", "arguments": {}},
                {"name": "echo", "arguments": {"text": "never runs"}},
            ],
        }
        async with open_harness(
            tmp_path,
            replies=[three, {"text": "after stop"}],
            tools=toolset(block, EchoTool()),
            profiles={"general": with_tools(["echo", "block"])},
        ) as h:
            await seed(h)
            s = await h.session("s1")
            s.send(TASK)
            await block.started.wait()
            s.stop()
            frames = await s.until_end()
            _assert_stopped(frames[-1])
            assert block.cancelled
            results = of_type(frames, "tool_result")
            assert [(r["ok"], r["output"] or r["error"]) for r in results] == [
                (True, "first"),
                (False, STOPPED_TEXT),
                (False, STOPPED_TEXT),
            ]
            started = [f["call_id"] for f in of_type(frames, "tool_started")]
            assert [r["call_id"] for r in results][: len(started)] == started
            store = h.runtime.store
            for saved in (await store.load_messages("s1"), await store.load_context("s1")):
                assert_paired(saved)
                assert saved[1]["content"] == TASK
                tools = [m["content"] for m in saved if m["role"] == "tool"]
                assert tools == ["first", f"Error: {STOPPED_TEXT}", f"Error: {STOPPED_TEXT}"]
            # The next turn's history has every call paired, in order.
            frames = await h.turn("s1", "why did you stop?")
            assert_wire_paired(h.chat_requests[1]["messages"])
            assert frames[-1]["text"] == "after stop"


async def test_stop_mid_parallel_batch(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        block = BlockTool()
        both = {
            "tool_calls": [
                {"name": "block", "arguments": {}},
                {"name": "echo", "arguments": {"text": "quick"}},
            ]
        }
        async with open_harness(
            tmp_path,
            replies=[both],
            tools=toolset(block, EchoTool()),
            profiles={"general": with_tools(["echo", "block"], parallel_tool_calls=True)},
        ) as h:
            await seed(h)
            s = await h.session("s1")
            s.send(TASK)
            await s.until(lambda f: f["type"] == "tool_result" and f["name"] == "echo")
            await block.started.wait()
            s.stop()
            frames = await s.until_end()
            _assert_stopped(frames[-1])
            context = await h.runtime.store.load_context("s1")
            assert_paired(context)
            assert [m["content"] for m in context if m["role"] == "tool"] == [
                f"Error: {STOPPED_TEXT}",
                "quick",
            ]


async def test_leaving_run_stream_early_is_a_stop(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [{"text": "one two three", "stall": True}]
        async with open_harness(tmp_path, replies=replies) as h:
            await seed(h)
            agent = h.runtime.agent
            got: list[Any] = []
            async with agent.run_stream("s1", UserMessage(TASK)) as events:
                async for ev in events:
                    got.append(ev)
                    if isinstance(ev, TextDelta) and ev.text.endswith("three"):
                        break
            # Leaving returned: the run is over (its task ended with the nursery) and
            # it ended as a Stop does — not by the stream's 60 s chunk timeout, which
            # would save the partial answer with an error instead.
            assert h.fake is not None
            await h.fake.wait_disconnects(1)
            messages = await h.runtime.store.load_messages("s1")
            last = messages[-1]
            assert (last["content"], last["partial"], last.get("stopped")) == (
                "one two three",
                True,
                True,
            )
            assert "error" not in last
            # The next turn runs normally: nothing of the left run is still going.
            h.add_replies({"text": "fresh"})
            assert await agent.run("s1", "again") == "fresh"


async def test_stop_when_idle_does_nothing(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "hello"}]) as h:
            s = await h.session("s1")
            assert s.stop() is False
            s.send("hi")
            frames = await s.until_end()
            assert frames[-1]["reason"] == "complete"
            await s.idle()
            assert s.stop() is False
