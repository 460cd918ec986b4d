"""A runtime shut down mid-turn ends the turn properly (issue 17, "Missing tests").

The model is streaming when the daemon shuts down: the turn's clean-up still runs to its
end, shielded. The partial answer is saved (marked partial and stopped), and the turn's
stream_end (reason "stopped", carrying that text) reaches the session's subscribers
before the actor closes their channels.

Rules: the fake LLM over real HTTP on 127.0.0.1, the store a real SQLite file; no
sleeps; an absolute `trio.fail_after`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from navi_trio.store import SQLiteStore
from navi_trio.testing import open_harness

TIMEOUT = 30
NO_PLAN = {"general": {"planning_first_message": False}}


def _rest(frames: Any) -> list[dict[str, Any]]:
    """What is left in a closed subscription's channel."""
    out = []
    while True:
        try:
            out.append(frames.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return out


async def test_a_shutdown_mid_stream_saves_the_partial_answer_and_ends_the_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="navi_trio.core.session.session_actor")
    replies = [{"text": "half an answer", "stall": True}]  # streams, then never ends
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=NO_PLAN) as h:
            s = await h.session("s1")
            s.send("tell me everything")
            streamed = ""
            while streamed != "half an answer":
                frame = await s.next()
                if frame["type"] == "text_delta":
                    streamed += frame["text"]
            h.runtime.nursery.cancel_scope.cancel()  # the daemon shuts down now
        # The runtime is gone; what it published before closing the channel is there.
        ends = [f for f in _rest(s.subscription.frames) if f["type"] == "stream_end"]
        assert [(f["reason"], f["text"]) for f in ends] == [("stopped", "half an answer")]
        assert any("run ended: stopped" in r.getMessage() for r in caplog.records)
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            messages = await store.load_messages("s1")
            context = await store.load_context("s1")
        for saved in (messages, context):
            last = saved[-1]
            assert (last["role"], last["content"], last["partial"], last["stopped"]) == (
                "assistant",
                "half an answer",
                True,
                True,
            )
        assert [m["content"] for m in messages if m["role"] == "user"] == ["tell me everything"]
