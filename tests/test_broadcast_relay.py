"""`RelayBroadcast` (core/cluster/broadcast_relay.py): a follower's broadcast of the frames
another daemon publishes. Never a silent gap: a frame of another epoch, or a seq that
does not follow, is a ``resync`` to its subscribers first; and when this daemon
publishes its own frames again, they start another epoch, announced the same way.

Unit tests on the in-process broadcast with the frames api/protocol.py builds (no
clocks, nothing awaits), and one on a session actor that relays while it asks the
cluster about a dead daemon's turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from navi_trio.api.protocol import event_frame, resync_frame
from navi_trio.core.cluster import RelayBroadcast
from navi_trio.events import ErrorEvent, StreamEnd, TextDelta, ThinkingDelta
from navi_trio.testing import open_harness


def relayed(epoch: str, seq: int, text: str) -> dict[str, Any]:
    """A frame another daemon published: deltas of alternating kinds, which never merge."""
    return event_frame((ThinkingDelta, TextDelta)[seq % 2](text), "s1", seq, epoch)


def drained(sub: Any) -> list[dict[str, Any]]:
    out = []
    while True:
        try:
            out.append(sub.frames.receive_nowait())
        except trio.WouldBlock:  # nothing more now
            return out


def test_a_new_epoch_whose_seq_follows_the_last_is_still_a_resync_and_taken() -> None:
    b = RelayBroadcast("s1", encode=event_frame, resync=resync_frame)
    sub = b.subscribe()
    b.relay(relayed("e1", 1, "a"))
    b.relay(relayed("e1", 2, "b"))
    b.relay(relayed("e2", 3, "c"))  # another daemon, and its seq happens to follow
    got = [(f["type"], f["seq"], f["epoch"]) for f in drained(sub)]
    assert got == [
        ("resync", 0, "e1"), ("text_delta", 1, "e1"), ("thinking_delta", 2, "e1"),
        ("resync", 2, "e2"), ("text_delta", 3, "e2"),
    ]  # fmt: skip
    assert (b.epoch, b.seq) == ("e2", 3)
    # A client back with the new epoch's seq misses nothing; with the old one, resync.
    assert [f["seq"] for f in drained(b.subscribe(2, "e2"))] == [3]
    assert [f["type"] for f in drained(b.subscribe(2, "e1"))] == ["resync"]


def test_its_own_frames_after_relayed_ones_start_an_epoch_announced_by_a_resync() -> None:
    b = RelayBroadcast("s1", encode=event_frame, resync=resync_frame)
    b.relay(relayed("e1", 1, "a"))
    b.relay(relayed("e1", 7, "b"))
    sub = b.subscribe()
    b.publish(ThinkingDelta("ours"))
    first, frame = drained(sub)
    assert first["type"] == "resync" and first["epoch"] == frame["epoch"] != "e1", first
    assert (first["seq"], frame["seq"]) == (7, 8)  # above every seq it held


async def test_a_dead_turns_end_relayed_while_this_daemon_asks_for_it_reaches_its_clients(
    tmp_path: Path,
) -> None:
    """Two daemons find the same dead daemon's turn: the other wins and ends it while this
    one still waits for the cluster's answer (its actor busy meanwhile). The winner's
    error and stream_end are the session's: this daemon's clients get them."""
    asked, answered = trio.Event(), trio.Event()

    async def dead_turn(session_id: str) -> int | None:
        asked.set()
        await answered.wait()
        return None  # another daemon took the lease over first

    with trio.fail_after(10):
        async with open_harness(tmp_path, replies=[]) as h:
            h.runtime.sessions.broadcast_class = RelayBroadcast
            h.runtime.sessions.dead_turn = dead_turn
            actor = await h.runtime.sessions.get("s1")
            sub = actor.subscribe()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(actor.take_over)
                await asked.wait()
                assert actor.busy  # what used to turn the winner's frames away
                actor.relay(
                    event_frame(ErrorEvent(message="died", code="daemon_died"), "s1", 1, "e9")
                )
                actor.relay(event_frame(StreamEnd(reason="error"), "s1", 2, "e9"))
                answered.set()
            got = [(f["type"], f.get("reason") or f.get("code")) for f in drained(sub)]
    assert got == [("resync", None), ("error", "daemon_died"), ("stream_end", "error")], got
