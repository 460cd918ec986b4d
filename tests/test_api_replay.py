"""Replay over a real WebSocket: a client whose last seq has left the replay buffer, or
that comes from another daemon life (epoch), gets `resync` first, reloads the history,
and then follows the live stream with no gap.

Rules: see tests/test_api_server.py (loopback, port 0, absolute timeouts).
"""

from __future__ import annotations

from pathlib import Path

import trio
from api_ws import open_daemon

from navi_trio.testing.harness import replay_buffer

TIMEOUT = 30


async def test_a_seq_older_than_the_buffer_gets_resync_then_history_then_live(
    tmp_path: Path,
) -> None:
    replies = [{"text": "one two three four five"}, {"text": "six seven"}, {"text": "eight"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies) as d:
            async with d.connect("alice") as c:
                created = await c.request({"type": "message", "content": "hi"})
                sid = created["session_id"]
                first_end = await c.until_end(sid)
            actor = d.harness.runtime.sessions.actor(sid)
            assert actor is not None
            replay_buffer(actor).max_frames = 2  # what the first run sent leaves the buffer
            async with d.connect("alice") as c:
                await c.request({"type": "message", "session_id": sid, "content": "hello"})
                await c.until_end(sid)
            async with d.connect("alice") as c:
                ok = await c.request(
                    {"type": "subscribe", "session_id": sid, "last_seq": 1,
                     "epoch": first_end["epoch"]}
                )  # fmt: skip
                assert ok["type"] == "ok"
                resync = await c.until_type("resync", session_id=sid)
                assert resync["seq"] == actor.seq and resync["epoch"] == actor.epoch
                history = await c.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
                assert [m["content"] for m in history["messages"]] == [
                    "hi", "one two three four five", "hello", "six seven"
                ]  # fmt: skip
                assert history["seq"] == resync["seq"]
                # Live frames go on right after the resync point.
                await c.request({"type": "message", "session_id": sid, "content": "more"})
                end = await c.until_end(sid)
                live = [f["seq"] for f in c.frames
                        if f.get("session_id") == sid and isinstance(f.get("seq"), int)
                        and f["type"] not in ("ok", "resync", "sessions", "session")]  # fmt: skip
                assert live[0] == resync["seq"] + 1 and end["text"] == "eight"


async def test_a_seq_from_another_daemon_life_gets_resync(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[{"text": "hello"}]) as d:
            async with d.connect("alice") as c:
                created = await c.request({"type": "message", "content": "hi"})
                sid = created["session_id"]
                end = await c.until_end(sid)
                await c.request(
                    {"type": "subscribe", "session_id": sid, "last_seq": end["seq"] - 1,
                     "epoch": "an-older-life"}
                )  # fmt: skip
                resync = await c.until_type("resync", session_id=sid)
                assert resync["seq"] == end["seq"] and resync["epoch"] == end["epoch"]
