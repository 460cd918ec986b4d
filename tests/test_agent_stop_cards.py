"""What a stopped run says about its tool calls (issue 17: a call stopped after 6 s showed
as "✗ failed · 0.0s"): each call without a result gets a `tool_result` marked
``stopped``, with how long it had run; a call that never started ran 0 s; a call that
finished before the stop keeps its own result.

Rules: see tests/test_agent_basic.py. The scripted backend (no sockets) and a MockClock
moved by hand once the tool runs: 6 s pass in no real time, and nothing else can move
the clock.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing
from agent_tools import BlockTool, EchoTool, of_type, seed, toolset, with_tools
from realtime import real_time_limit

from navi_trio.testing import open_harness

TIMEOUT = 30


async def test_a_stopped_call_is_stopped_with_how_long_it_ran(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    block = BlockTool()
    three = {"tool_calls": [
        {"name": "echo", "arguments": {"text": "first"}},
        {"name": "block", "arguments": {}},
        {"name": "echo", "arguments": {"text": "never runs"}},
    ]}  # fmt: skip
    with real_time_limit(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[three], scripted=True, tools=toolset(block, EchoTool()),
            profiles={"general": with_tools(["echo", "block"])},
        ) as h:  # fmt: skip
            await seed(h)
            s = await h.session("s1")
            s.send("run them")
            await block.started.wait()
            mock_clock.jump(6)
            s.stop()
            frames = await s.until_end()
    first, blocked, never = of_type(frames, "tool_result")
    assert (first["ok"], first["stopped"]) == (True, False)
    assert blocked["ok"] is False and blocked["stopped"] is True
    assert 6000 <= blocked["duration_ms"] < 7000, blocked
    assert never["stopped"] is True and never["duration_ms"] == 0
    assert frames[-1]["reason"] == "stopped"
