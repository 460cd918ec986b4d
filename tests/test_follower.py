"""`Follower`: one reader following one session across cut-offs (core/session/broadcast.py).

The daemon's subscription pumps and `navi run`'s in-process follower both read a
session through it, so "cut off for lagging: subscribe again from the last seq" is
written once. A follower that falls behind gets a `Lagged` and then every frame it
missed, from the replay, with no gap and no repeat.

Rules: unit tests on the in-process broadcast (the frames api/protocol.py builds),
no clocks; every test that awaits has an absolute timeout. The same behaviour over a
real WebSocket is in tests/test_daemon_client.py and tests/test_api_tasks.py.
"""

from __future__ import annotations

from typing import Any

import trio

from navi_trio.api.protocol import event_frame, resync_frame
from navi_trio.core.session import Follower, Lagged, LocalBroadcast
from navi_trio.core.session.broadcast import SUBSCRIBER_BUFFER, SUBSCRIBER_MAX_CHARS, frame_size
from navi_trio.events import TaskUpdate, TextDelta, ThinkingDelta, ToolResultEvent

TIMEOUT = 10


def _broadcast() -> tuple[LocalBroadcast, list[tuple[int | None, str | None]]]:
    """A session's broadcast, and the (last_seq, epoch) of every subscribe asked of it."""
    b = LocalBroadcast("s1", encode=event_frame, resync=resync_frame)
    calls: list[tuple[int | None, str | None]] = []
    subscribe = b.subscribe

    def recorded(last_seq: int | None = None, epoch: str | None = None) -> Any:
        calls.append((last_seq, epoch))
        return subscribe(last_seq, epoch)

    b.subscribe = recorded  # type: ignore[method-assign]
    return b, calls


def _alternating(n: int) -> list[TextDelta | ThinkingDelta]:
    # Deltas of alternating kinds never merge: a follower that does not read overflows.
    return [(ThinkingDelta, TextDelta)[i % 2](f"w{i} ") for i in range(n)]


async def _read(follower: Follower, n: int) -> list[dict[str, Any] | Lagged]:
    return [await follower.__anext__() for _ in range(n)]


async def test_a_follower_cut_off_gets_lagged_then_every_frame_it_missed_once() -> None:
    b, calls = _broadcast()
    total = SUBSCRIBER_BUFFER + 500
    with trio.fail_after(TIMEOUT):
        follower = Follower(b.subscribe, lambda: b.epoch)
        for event in _alternating(total):
            b.publish(event)  # never read meanwhile: it is cut off at SUBSCRIBER_BUFFER + 1
        got = await _read(follower, total + 1)
        lagged = [i for i, item in enumerate(got) if isinstance(item, Lagged)]
        assert lagged == [SUBSCRIBER_BUFFER]
        assert got[SUBSCRIBER_BUFFER] == Lagged(SUBSCRIBER_BUFFER + 1, SUBSCRIBER_BUFFER + 1)
        seqs = [item["seq"] for item in got if not isinstance(item, Lagged)]
        assert seqs == list(range(1, total + 1))  # no gap, no repeat
        # Subscribed again from the last seq it handed out, in this life of the session.
        assert calls == [(None, None), (SUBSCRIBER_BUFFER, b.epoch)]
        follower.close()


async def test_a_follower_cut_off_before_any_seq_asks_from_just_before_the_first_missed() -> None:
    # Out-of-band frames (task updates, no seq) fill its queue; the first session frame
    # cannot go in. Subscribing again "live" would lose it: the follower asks the replay.
    b, calls = _broadcast()
    with trio.fail_after(TIMEOUT):
        follower = Follower(b.subscribe, lambda: b.epoch)
        for i in range(SUBSCRIBER_BUFFER):
            b.publish_out_of_band(TaskUpdate(task_id=f"t{i}", tool="x", status="running"))
        b.publish(TextDelta("first"))
        got = await _read(follower, SUBSCRIBER_BUFFER + 2)
        assert got[SUBSCRIBER_BUFFER] == Lagged(1, 1)
        last = got[-1]
        assert not isinstance(last, Lagged)
        assert (last["type"], last["seq"], last["text"]) == ("text_delta", 1, "first")
        assert calls == [(None, None), (0, b.epoch)]
        follower.close()


async def test_a_follower_ends_when_the_session_ends_its_subscription_without_a_cut_off() -> None:
    b, calls = _broadcast()
    with trio.fail_after(TIMEOUT):
        with Follower(b.subscribe, lambda: b.epoch, last_seq=None) as follower:
            b.publish(TextDelta("a"))
            b.close()  # the actor retired: no cut-off, so nothing subscribes again
            got = [item async for item in follower]
        assert [f["seq"] for f in got if not isinstance(f, Lagged)] == [1]
        assert calls == [(None, None)]
        assert not b.subscribed  # leaving the `with` closed the subscription


def _big_results(n: int, chars: int = 100_000) -> list[ToolResultEvent]:
    return [ToolResultEvent(call_id=f"c{i}", name="x", ok=True, output="o" * chars)
            for i in range(n)]  # fmt: skip


async def test_a_subscriber_that_does_not_read_is_cut_off_by_size_long_before_its_frame_count() -> (
    None
):
    b, _ = _broadcast()
    sub = b.subscribe()  # (nothing here awaits)
    for event in _big_results(30):  # 3 M characters, 30 of 1000 frames
        b.publish(event)
    assert sub.lagged is not None
    kept = sub.frames.statistics().queued
    size = frame_size(event_frame(_big_results(1)[0], "s1", 1, b.epoch))
    assert kept * size <= SUBSCRIBER_MAX_CHARS < (kept + 1) * size
    assert sub.lagged == (kept + 1, kept + 1)  # cut off at the first that did not fit
    sub.close()


async def test_a_replay_bigger_than_the_size_bound_still_reaches_its_subscriber_whole() -> None:
    b, _ = _broadcast()
    with trio.fail_after(TIMEOUT):
        for event in _big_results(30):  # kept for replay (4 M characters)
            b.publish(event)
        follower = Follower(b.subscribe, lambda: b.epoch, last_seq=0, last_epoch=b.epoch)
        got = await _read(follower, 30)
        assert [f["seq"] for f in got if not isinstance(f, Lagged)] == list(range(1, 31))
        b.publish(TextDelta("after"))
        last = await follower.__anext__()
        assert not isinstance(last, Lagged) and last["seq"] == 31
        follower.close()


async def test_a_replay_longer_than_the_frame_bound_still_reaches_its_subscriber_whole() -> None:
    """A backlog of more frames than a subscriber's queue holds (the replay keeps more)
    is room made for, not a cut-off: every frame, once, and no `Lagged`."""
    b, _ = _broadcast()
    total = SUBSCRIBER_BUFFER + 500
    with trio.fail_after(TIMEOUT):
        for event in _alternating(total):
            b.publish(event)
        follower = Follower(b.subscribe, lambda: b.epoch, last_seq=0, last_epoch=b.epoch)
        got = await _read(follower, total)
        assert not [item for item in got if isinstance(item, Lagged)]
        assert [f["seq"] for f in got if not isinstance(f, Lagged)] == list(range(1, total + 1))
        follower.close()
