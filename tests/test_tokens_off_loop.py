"""The token encoding's load never blocks the trio thread (core/turn/tokens.py, core/turn/turn.py).

cl100k takes 0.1-1.4 s to load. A daemon's first turn used to count the context on the
trio thread while that load ran on a worker thread, so the trio thread waited on the
load's lock and every session stood still. Here the load is held at a gate on its worker
thread: the turn must wait for it off the loop (`TokenCounter.preload`), a stop must
not wait for it at all, and the turn goes on once the gate opens.

Rules: the fake LLM over real HTTP on 127.0.0.1 and a real SQLite file (`open_harness`);
real time, each test under an absolute `trio.fail_after`; nothing sleeps.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing
from agent_tools import EchoTool, call, toolset, with_tools

from navi_trio.core.turn import TokenCounter
from navi_trio.testing import open_harness
from navi_trio.testing.harness import Harness, SessionDriver

TIMEOUT = 30


class GatedLoad:
    """Stands in for a counter's `_load`: on a worker thread the load waits at `gate`.

    A call on the trio thread while the encoding is not loaded is the defect under
    test: its stack is recorded and the gate opened, so the test fails, not hangs."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.real = counter._load
        self.gate = threading.Event()
        self.on_trio: list[str] = []
        self.waited = threading.Event()  # a worker thread reached the gate

    def __call__(self) -> Any:
        if not self.counter.loaded:
            if threading.current_thread() is threading.main_thread():
                self.on_trio.append("".join(traceback.format_stack(limit=10)))
                self.gate.set()
            else:
                self.waited.set()
                self.gate.wait(TIMEOUT)
        return self.real()


def gate(h: Harness) -> GatedLoad:
    counter = h.runtime.agent.parts.counter
    assert not counter.loaded  # a fresh runtime: the encoding is not loaded yet
    gated = GatedLoad(counter)
    counter._load = gated  # type: ignore[method-assign]  # preload and every count use it
    return gated


@asynccontextmanager
async def held(
    tmp_path: Path, replies: list[dict[str, Any]], text: str, requests: int, **flags: Any
) -> AsyncIterator[tuple[Harness, GatedLoad, SessionDriver]]:
    """A fresh runtime with the load held at the gate, `text` sent to session s1, and
    every task waiting: the turn stands where it needs the encoding, off the loop, once
    the fake LLM has had `requests` requests.

    All tasks blocked is not enough alone: a task waiting for a worker thread (a name
    look-up on the way to the fake LLM) counts as blocked, and on a loaded machine the
    cushion ran out before the first request came (seen once at load ~15)."""
    profiles = {"general": with_tools(["echo"], planning_first_message=False, **flags)}
    async with open_harness(
        tmp_path, replies=replies, tools=toolset(EchoTool()), profiles=profiles
    ) as h:
        gated = gate(h)
        s = await h.session("s1")
        s.send(text)
        assert h.fake is not None
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        while not gated.on_trio and (
            not gated.waited.is_set() or len(h.fake.chat_requests) < requests
        ):
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert gated.on_trio == [], gated.on_trio[0]
        yield h, gated, s


async def test_a_turn_waits_for_the_load_off_the_loop_and_goes_on_when_it_is_done(
    tmp_path: Path,
) -> None:
    # The first answer is streamed (its bound fits, no count needed); then the turn
    # needs counts, and waits for them without holding the trio thread.
    replies = [call("echo", text="one"), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with held(tmp_path, replies, "echo one", 1) as (h, gated, s):
            assert h.fake is not None and len(h.fake.chat_requests) == 1
            assert gated.waited.is_set() and not loaded(h)
            gated.gate.set()
            frames = await s.until_end()
            assert frames[-1]["type"] == "stream_end" and frames[-1]["reason"] == "complete"
            assert frames[-1]["text"] == "done" and len(h.fake.chat_requests) == 2
            assert gated.on_trio == [], gated.on_trio[0]
            assert loaded(h)


async def test_an_active_budget_counts_the_prompt_after_the_load_not_during_it(
    tmp_path: Path,
) -> None:
    # A budget checks every call's prompt against what is left: that count waits for
    # the encoding before the first request, off the loop.
    replies = [{"text": "done", "prompt_tokens": 50, "completion_tokens": 5}]
    budgets = {"turn": {"tokens": 100000}}
    with trio.fail_after(TIMEOUT):
        async with held(tmp_path, replies, "hello", 0, budgets=budgets) as (h, gated, s):
            assert h.fake is not None and h.fake.chat_requests == []  # waits to count
            gated.gate.set()
            frames = await s.until_end()
            assert frames[-1]["reason"] == "complete" and frames[-1]["text"] == "done"
            assert [f for f in frames if f["type"] == "budget"], "no budget report"
            assert gated.on_trio == [], gated.on_trio[0]


async def test_a_stop_while_the_turn_waits_for_the_load_ends_it_at_once(tmp_path: Path) -> None:
    replies = [call("echo", text="one"), {"text": "never asked"}]
    with trio.fail_after(TIMEOUT):
        async with held(tmp_path, replies, "echo one", 1) as (h, gated, s):
            assert gated.waited.is_set() and not gated.gate.is_set()
            assert s.stop() is True
            frames = await s.until_end()  # with the gate still shut
            assert frames[-1]["reason"] == "stopped", frames[-1]
            assert not gated.gate.is_set() and gated.on_trio == []
            gated.gate.set()  # the load on its thread ends; the next turn counts with it


def loaded(h: Harness) -> bool:
    return h.runtime.agent.parts.counter.loaded
