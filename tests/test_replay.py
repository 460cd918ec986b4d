"""Replay without gaps: the replay buffer merges consecutive deltas, answers exactly
what a subscriber missed (no gap, no duplicate, also from the middle of a merged frame),
says `resync` when what was missed is gone or the seq is another daemon life's, and a
subscriber that falls behind is cut off with `lagged` saying what it missed while the run
and the other subscribers go on.

Rules: see tests/test_agent_basic.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from quick_run import examples

from navi_trio.api.protocol import event_frame, resync_frame
from navi_trio.core.session import LocalBroadcast, ReplayBuffer
from navi_trio.core.session.broadcast import SUBSCRIBER_BUFFER
from navi_trio.core.turn import MERGE_MAX_CHARS
from navi_trio.events import TextDelta, ThinkingDelta
from navi_trio.testing import open_harness
from navi_trio.testing.harness import replay_buffer

TIMEOUT = 30


def _frames(specs: list[tuple[str, str | None, str]]) -> list[dict[str, Any]]:
    return [
        {"type": t, "seq": i + 1, "is_subagent": agent is not None, "agent_id": agent, "text": text}
        for i, (t, agent, text) in enumerate(specs)
    ]


def _atoms(frames: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a client can tell apart: each delta character, each other frame."""
    out: list[tuple[Any, ...]] = []
    for f in frames:
        if f["type"] in ("text_delta", "thinking_delta"):
            out += [(f["type"], f["agent_id"], ch) for ch in f["text"]]
        else:
            out.append((f["type"], f["seq"]))
    return out


def test_consecutive_deltas_merge_into_one_frame() -> None:
    buf = ReplayBuffer()
    for f in _frames([("text_delta", None, w) for w in ("a", "b", "c")]):
        buf.append(f)
    assert len(buf) == 1
    assert list(buf) == [
        {"type": "text_delta", "seq": 3, "is_subagent": False, "agent_id": None, "text": "abc"}
    ]
    assert buf.merged == 2


def test_deltas_of_another_kind_or_agent_do_not_merge() -> None:
    buf = ReplayBuffer()
    specs = [
        ("text_delta", None, "a"),
        ("thinking_delta", None, "b"),
        ("text_delta", "sub_1", "c"),
        ("text_delta", None, "d"),
        ("tool_started", None, ""),
        ("text_delta", None, "e"),
    ]
    for f in _frames(specs):
        buf.append(f)
    assert [f["text"] for f in buf] == ["a", "b", "c", "d", "", "e"]


def test_a_subscriber_mid_way_through_a_merged_frame_gets_only_the_rest() -> None:
    buf = ReplayBuffer()
    for f in _frames([("text_delta", None, w) for w in ("one ", "two ", "three")]):
        buf.append(f)
    assert buf.since(1, 3) == [
        {"type": "text_delta", "seq": 3, "is_subagent": False, "agent_id": None,
         "text": "two three"}
    ]  # fmt: skip
    assert buf.since(3, 3) == []


def test_a_merged_frame_stops_growing_at_its_cap() -> None:
    buf = ReplayBuffer()
    piece = "x" * 1000
    for f in _frames([("text_delta", None, piece)] * (2 * MERGE_MAX_CHARS // 1000)):
        buf.append(f)
    assert all(len(f["text"]) <= MERGE_MAX_CHARS for f in buf)
    assert len(buf) >= 2


def test_what_left_the_buffer_means_resync() -> None:
    buf = ReplayBuffer(max_frames=3)
    for f in _frames([("tool_started", None, "")] * 10):
        buf.append(f)
    assert [f["seq"] for f in buf] == [8, 9, 10]
    assert buf.since(7, 10) == list(buf)  # nothing missing: 8, 9, 10 are here
    assert buf.since(6, 10) is None  # 7 is gone
    assert buf.since(11, 10) is None  # a seq this buffer never sent


def test_the_buffer_is_bounded_by_characters_too() -> None:
    buf = ReplayBuffer(max_chars=10_000)
    for f in _frames([("tool_event", None, "y" * 3000)] * 20):
        buf.append(f)
    assert buf.chars <= 10_000
    assert len(buf) < 20


_spec = st.tuples(
    st.sampled_from(["text_delta", "thinking_delta", "tool_event"]),
    st.sampled_from([None, "sub_a"]),
    st.text(alphabet="ab ", min_size=0, max_size=5),
)


@settings(max_examples=examples(300), deadline=None)
@given(specs=st.lists(_spec, min_size=1, max_size=60), cut=st.integers(0, 60),
       max_frames=st.integers(1, 80))  # fmt: skip
def test_replay_is_exactly_what_was_missed_or_a_resync(
    specs: list[tuple[str, str | None, str]], cut: int, max_frames: int
) -> None:
    frames = _frames(specs)
    buf = ReplayBuffer(max_frames=max_frames)
    for f in frames:
        buf.append(dict(f))
    last_seq = min(cut, len(frames))
    got = buf.since(last_seq, len(frames))
    if got is None:
        first = buf.first_seq
        assert first is not None and last_seq < first - 1
    else:
        assert _atoms(got) == _atoms([f for f in frames if f["seq"] > last_seq])
        assert all(f["seq"] > last_seq for f in got)


# -- the session actor, over the fake LLM server ---------------------------------------


async def test_a_long_answer_is_replayed_whole_from_a_few_frames(tmp_path: Path) -> None:
    words = " ".join(f"w{i}" for i in range(3000))
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": words}]) as h:
            live = await h.turn("s1", "hi")
            actor = h.runtime.sessions.actor("s1")
            assert actor is not None
            deltas = [f for f in live if f["type"] == "text_delta"]
            assert "".join(f["text"] for f in deltas) == words
            assert len(replay_buffer(actor)) < 20  # the buffer merged them
            # From the middle of the answer (a live frame's seq: what a client saw last).
            cut = len(deltas) // 2
            start = deltas[cut]["seq"]
            with actor.subscribe(last_seq=start) as sub:
                replayed = []
                while True:
                    try:
                        replayed.append(sub.frames.receive_nowait())
                    except trio.WouldBlock:
                        break
            expected = [f for f in live if f["seq"] > start]
            assert _atoms(replayed) == _atoms(expected)
            text = "".join(f["text"] for f in replayed if f["type"] == "text_delta")
            assert text == words[len("".join(f["text"] for f in deltas[: cut + 1])) :]


async def test_a_subscriber_from_too_long_ago_or_another_epoch_gets_resync(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "a b c"}, {"text": "d"}]) as h:
            await h.turn("s1", "hi")
            actor = h.runtime.sessions.actor("s1")
            assert actor is not None
            replay_buffer(actor).max_frames = 2
            second = await h.turn("s1", "again")
            with actor.subscribe(last_seq=1) as sub:
                first = sub.frames.receive_nowait()
            assert first == {"type": "resync", "session_id": "s1", "seq": actor.seq,
                             "epoch": actor.epoch}  # fmt: skip
            with actor.subscribe(last_seq=second[-2]["seq"], epoch="elsewhere") as sub:
                assert sub.frames.receive_nowait()["type"] == "resync"
            with actor.subscribe(last_seq=second[-2]["seq"], epoch=actor.epoch) as sub:
                assert sub.frames.receive_nowait() == second[-1]
            assert all(f["epoch"] == actor.epoch for f in second)


async def test_a_restarted_daemon_answers_an_old_seq_with_resync(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "before"}]) as h:
            frames = await h.turn("s1", "hi")
            old_epoch, old_seq = frames[-1]["epoch"], frames[-1]["seq"]
        async with open_harness(tmp_path, replies=[]) as h:
            actor = await h.runtime.sessions.get("s1")
            assert actor.epoch != old_epoch
            with actor.subscribe(last_seq=old_seq, epoch=old_epoch) as sub:
                assert sub.frames.receive_nowait()["type"] == "resync"
            # Without the epoch, a seq the new daemon never sent is a resync too.
            with actor.subscribe(last_seq=old_seq) as sub:
                assert sub.frames.receive_nowait()["type"] == "resync"


async def test_a_subscriber_that_falls_behind_is_told_what_it_missed(tmp_path: Path) -> None:
    # Deltas of alternating kinds never merge, so a subscriber that does not read
    # overflows (a long answer of one kind merges while it waits: no cut-off).
    events = [(ThinkingDelta, TextDelta)[i % 2](f"w{i} ") for i in range(SUBSCRIBER_BUFFER + 500)]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path) as h:
            s = await h.session("s1")
            actor = s.actor
            slow = actor.subscribe()  # never read while the frames go out
            frames = []
            for event in events:
                actor.publish(event)
                frames.append(await s.subscription.frames.receive())  # this one keeps up
            assert len(frames) == len(events) and s.subscription.lagged is None
            assert slow.lagged is not None
            missed_from, missed_to = slow.lagged
            assert missed_from == SUBSCRIBER_BUFFER + 1
            # It gets what was in its channel, then the end of the channel.
            got = []
            async for frame in slow.frames:
                got.append(frame)
            assert [f["seq"] for f in got] == list(range(1, SUBSCRIBER_BUFFER + 1))
            # Subscribing again from the last seq it got replays the rest exactly.
            with actor.subscribe(last_seq=got[-1]["seq"]) as again:
                rest = []
                while True:
                    try:
                        rest.append(again.frames.receive_nowait())
                    except trio.WouldBlock:
                        break
            assert _atoms(got + rest) == _atoms(frames)


def test_a_frame_bigger_than_the_bound_alone_is_still_replayed() -> None:
    """The character bound drops older frames, never the newest: a huge tool output
    stays replayable alone (no resync for the subscriber that just missed it)."""
    buf = ReplayBuffer(max_chars=1000)
    frames = _frames([("tool_event", None, "a" * 10), ("tool_event", None, "y" * 5000)])
    for f in frames:
        buf.append(f)
    assert [f["seq"] for f in buf] == [2]
    assert buf.since(1, 2) == [frames[1]]
    assert buf.since(0, 2) is None  # seq 1 is gone


def test_merged_deltas_count_against_the_character_bound() -> None:
    """Each delta merged into an entry adds its characters: a long answer pushes older
    frames out as it grows, though it adds no entry."""
    buf = ReplayBuffer(max_chars=2000)
    specs: list[tuple[str, str | None, str]] = [("tool_started", None, "")]
    frames = _frames(specs + [("text_delta", None, "y" * 100)] * 30)
    for f in frames:
        buf.append(f)
    assert len(buf) == 1 and buf.first_seq == 2  # the merged answer alone: 3000 characters
    assert buf.since(1, 31) == [{**frames[-1], "text": "y" * 3000}]
    assert buf.since(0, 31) is None


async def test_a_resync_drops_the_replay_for_every_subscriber_now_and_later() -> None:
    """After a rewind the frames kept are another history's: the subscribers of the moment
    get ``resync``, and one back later from an older seq gets it too, never those frames."""
    b = LocalBroadcast("s1", encode=event_frame, resync=resync_frame)
    with trio.fail_after(TIMEOUT):
        for i in range(3):
            b.publish((ThinkingDelta, TextDelta)[i % 2](f"w{i}"))
        with b.subscribe() as live:
            b.resync()
            now = await live.frames.receive()
            assert (now["type"], now["seq"], now["epoch"]) == ("resync", 3, b.epoch)
        assert b.replay(1) is None
        assert b.replay(3) == []  # nothing missed since: nothing to reload
        with b.subscribe(1, b.epoch) as back:
            first = await back.frames.receive()
            assert (first["type"], first["seq"]) == ("resync", 3)
            b.publish(TextDelta("after"))
            nxt = await back.frames.receive()
            assert (nxt["type"], nxt["seq"], nxt["text"]) == ("text_delta", 4, "after")
