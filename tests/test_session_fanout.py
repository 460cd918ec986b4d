"""The session actor's fan-out: a subscriber that is behind gets its waiting text
deltas merged (texts joined, seq the last one's), never a cut-off for a long answer
alone, never a merge across another frame; one that keeps up gets every frame.

Rules: see tests/test_agent_basic.py (real runtime on a tmp SQLite file, no clocks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from navi_trio.core.session.broadcast import SUBSCRIBER_BUFFER
from navi_trio.events import TextDelta, ThinkingDelta, ToolStarted
from navi_trio.testing import open_harness

TIMEOUT = 30
N = SUBSCRIBER_BUFFER * 3  # more deltas than a subscriber's queue holds


def _drain(frames: trio.abc.ReceiveChannel[dict[str, object]]) -> list[dict[str, Any]]:
    """What is waiting: frames as JSON-able dicts (their fields are whatever the wire says)."""
    out: list[dict[str, Any]] = []
    while True:
        try:
            out.append(frames.receive_nowait())  # type: ignore[attr-defined]
        except trio.WouldBlock:
            return out


async def test_a_subscriber_behind_gets_waiting_deltas_merged_with_the_last_seq(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path) as h:
            actor = await h.runtime.sessions.get("s1")
            behind = actor.subscribe()
            for i in range(N):
                actor.publish(TextDelta(f"{i} "))
            actor.publish(ThinkingDelta("hmm"))
            actor.publish(ToolStarted(call_id="c1", name="echo"))
            for i in range(N):
                actor.publish(TextDelta(f"{i}."))
            actor.publish(TextDelta("sub", is_subagent=True, agent_id="a1"))
            frames = _drain(behind.frames)
            assert behind.lagged is None
            assert [f["type"] for f in frames] == [
                "text_delta", "thinking_delta", "tool_started", "text_delta", "text_delta"
            ]  # fmt: skip
            assert frames[0]["text"] == "".join(f"{i} " for i in range(N))
            assert frames[3]["text"] == "".join(f"{i}." for i in range(N))
            seqs = [f["seq"] for f in frames]
            assert seqs == sorted(set(seqs)) and seqs[-1] == actor.seq
            assert seqs[0] == N and seqs[3] == 2 * N + 2
            behind.close()


async def test_a_subscriber_that_keeps_up_gets_every_delta(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path) as h:
            actor = await h.runtime.sessions.get("s1")
            sub = actor.subscribe()
            got = []
            for i in range(50):
                actor.publish(TextDelta(f"{i} "))
                got.append(await sub.frames.receive())
            assert [f["text"] for f in got] == [f"{i} " for i in range(50)]
            assert [f["seq"] for f in got] == list(range(1, 51))
            sub.close()
