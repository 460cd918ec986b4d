"""`RelayBroadcast` (core/cluster/broadcast_relay.py): a follower's broadcast of the frames
another daemon publishes. Never a silent gap: a frame of another epoch, or a seq that
does not follow, is a ``resync`` to its subscribers first; and when this daemon
publishes its own frames again, they start another epoch, announced the same way.

A session actor relays another daemon's frames unless a run here has the session's
lease: while it only asks the cluster about a dead daemon's turn, hands its message to
the daemon that runs the session, or rewinds or forks, the other daemon's frames are the
session's and reach this daemon's clients. While its run holds the lease they can only
be a replaced owner's late frames; while a run taken over here ends (or cannot tell
yet), they would end its turn a second time: neither is passed on.

Unit tests on the in-process broadcast with the frames api/protocol.py builds (no
clocks, nothing awaits), and on session actors driven directly: each frame is relayed
at a point the test holds the actor at (no sleeps).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import GateTool
from realtime import held, real_time_limit
from test_agent_fencing import FAR, calls, profile, take_over

from navi_trio.api.protocol import event_frame, resync_frame
from navi_trio.core.cluster import RelayBroadcast
from navi_trio.core.session import SessionActor
from navi_trio.core.turn import UserMessage
from navi_trio.core.turn.agent import _end_as_saved
from navi_trio.events import (
    CompressionStarted,
    ErrorEvent,
    MessageQueued,
    StreamEnd,
    TaskUpdate,
    TextDelta,
    ThinkingDelta,
)
from navi_trio.testing import open_harness
from navi_trio.testing.harness import Harness

HOST = socket.gethostname() or "localhost"


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


def test_a_turns_end_is_the_last_word_until_a_turns_frame_comes_own_or_relayed() -> None:
    """`ended_last`: what a daemon taking a dead daemon's lease over asks before it says the
    end of a turn the history shows ended (`SessionActor._say_dead_end`)."""
    b = RelayBroadcast("s1", encode=event_frame, resync=resync_frame)
    steps: list[bool] = [b.ended_last]
    b.relay(relayed("e1", 1, "a"))
    steps.append(b.ended_last)
    b.relay(event_frame(StreamEnd(text="a"), "s1", 2, "e1"))
    steps.append(b.ended_last)
    b.relay(event_frame(MessageQueued(text="next", position=0), "s1", 3, "e1"))
    b.relay(event_frame(CompressionStarted(reason="forced", tokens_before=9), "s1", 4, "e1"))
    b.relay({"type": "task_update", "session_id": "s1"})  # out of band
    steps.append(b.ended_last)  # between turns: still the end
    b.relay(event_frame(CompressionStarted(reason="pre_turn", tokens_before=9), "s1", 5, "e1"))
    steps.append(b.ended_last)  # a run's: its turn is on
    b.publish(StreamEnd(text="own"))
    steps.append(b.ended_last)
    b.publish(StreamEnd(text="sub", is_subagent=True))
    steps.append(b.ended_last)  # a sub-agent's end is said inside a turn: one is on
    b.publish(TextDelta("x"))
    steps.append(b.ended_last)
    assert steps == [False, False, True, True, False, True, False, False]


def test_the_end_said_for_a_turn_the_history_shows_ended_is_as_saved() -> None:
    said = [
        _end_as_saved(m)
        for m in (
            {"role": "assistant", "content": "done"},
            {"role": "assistant", "content": "half", "partial": True, "stopped": True},
            {"role": "assistant", "content": "so far", "partial": True, "budget": "spent"},
            {"role": "assistant", "content": "", "error": "the model failed"},
        )
    ]
    assert [(e.reason, e.text, e.stopped) for e in said] == [
        ("complete", "done", False),
        ("stopped", "half", True),
        ("budget_exhausted", "so far", False),
        ("error", "", False),
    ]


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


def test_a_gap_in_one_epochs_seqs_is_a_resync_and_the_replay_starts_after_it() -> None:
    b = RelayBroadcast("s1", encode=event_frame, resync=resync_frame)
    sub = b.subscribe()
    b.relay(relayed("e1", 1, "a"))
    b.relay(relayed("e1", 2, "b"))
    b.relay(relayed("e1", 5, "c"))  # 3 and 4 never reached this daemon
    got = [(f["type"], f["seq"]) for f in drained(sub)]
    assert got == [
        ("resync", 0), ("text_delta", 1), ("thinking_delta", 2), ("resync", 4), ("text_delta", 5),
    ]  # fmt: skip
    # A client back from before the gap reloads; one from just before 5 misses nothing.
    assert [f["type"] for f in drained(b.subscribe(2, "e1"))] == ["resync"]
    assert [f["seq"] for f in drained(b.subscribe(4, "e1"))] == [5]


def test_its_own_frames_start_above_every_seq_held_though_the_last_epochs_were_lower() -> None:
    b = RelayBroadcast("s1", encode=event_frame, resync=resync_frame)
    b.relay(relayed("e1", 9, "a"))
    b.relay(relayed("e2", 3, "b"))  # another daemon's life: its seqs start again
    sub = b.subscribe()
    b.publish(ThinkingDelta("ours"))
    first, frame = drained(sub)
    assert first["type"] == "resync" and first["epoch"] == frame["epoch"] not in ("e1", "e2")
    assert (first["seq"], frame["seq"]) == (9, 10)
    assert b.seq_floor == 10


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


def owners_end(actor: SessionActor) -> None:
    """The last frames of a turn the other daemon runs: its answer's end."""
    actor.relay(event_frame(TextDelta("the end"), "s1", 5, "e9"))
    actor.relay(event_frame(StreamEnd(reason="complete"), "s1", 6, "e9"))


def relayed_end(frames: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """What of the other daemon's frames (epoch e9) a subscriber got, past the resync."""
    return [
        (f["type"], f["seq"]) for f in frames if f.get("epoch") == "e9" and f["type"] != "resync"
    ]


class HeldHandOver:
    """The cluster's hand-over of queued messages to the daemon that runs the session: it
    waits, once asked (`asked`), until the test lets it answer (`answered`)."""

    def __init__(self) -> None:
        self.asked, self.answered = trio.Event(), trio.Event()
        self.handed: list[list[str]] = []  # the queue keys of each hand-over

    async def __call__(self, session_id: str, keys: list[str]) -> None:
        self.handed.append(keys)
        self.asked.set()
        await self.answered.wait()


async def relaying(h: Harness) -> SessionActor:
    h.runtime.sessions.broadcast_class = RelayBroadcast
    return await h.runtime.sessions.get("s1")


@pytest.mark.parametrize("stop", [False, True])
async def test_the_owners_end_reaches_this_daemons_clients_while_a_run_here_hands_its_message_over(
    tmp_path: Path, stop: bool
) -> None:
    """A message sent here finds, at its claim, the session run by another daemon: the actor
    is busy while it stores the message and hands it over, and the other daemon's turn may
    end just then. That end is the session's: this daemon's clients get it. A stop asked
    here meanwhile is not this run's to answer (the turn to stop is the other daemon's:
    the API asks it there, test_scale_relay.py); the message goes over all the same."""
    hand = HeldHandOver()
    no_plan = {"general": {"planning_first_message": False}}
    with trio.fail_after(10):
        async with open_harness(tmp_path, replies=[], profiles=no_plan) as h:
            h.runtime.sessions.hand_over = hand
            store = h.runtime.store
            await store.create_session("s1", profile_id="general")
            await store.claim_lease(
                "s1", owner="another-daemon", pid=os.getpid(), host=HOST, ttl=300
            )
            actor = await relaying(h)
            sub = actor.subscribe()
            msg = UserMessage("for the other daemon")
            actor.send_message(msg)
            await hand.asked.wait()
            assert actor.busy and actor.running is not None  # its run hands the message over
            assert actor.handing_over
            if stop:
                assert not actor.stop()  # nothing of the session runs here to stop
            owners_end(actor)
            hand.answered.set()
            await actor.idle.wait()
            assert msg.accepted.queued and len(hand.handed) == 1
            got = drained(sub)
    assert [f["type"] for f in got] == ["resync", "text_delta", "stream_end"], got
    assert relayed_end(got) == [("text_delta", 5), ("stream_end", 6)]


async def test_a_run_taken_over_here_ends_once_for_its_clients_then_the_new_owners_frames_come(
    tmp_path: Path,
) -> None:
    """Another daemon took the session over under a run here, and ended that run's turn
    itself: its end arriving while the run here winds down is not passed on (the run's
    clients get one end, its own ``session_busy``); the new owner's next frames are, after
    a resync."""
    gate = GateTool()
    with trio.fail_after(10):
        async with open_harness(
            tmp_path, replies=[calls("gate"), {"text": "never"}], tools=[gate],
            profiles=profile("gate"),
        ) as h:  # fmt: skip
            actor = await relaying(h)
            ending = h.runtime.sessions.on_run_end
            states: list[tuple[bool, bool]] = []

            def run_ended(session_id: str, msg: UserMessage, end: StreamEnd) -> None:
                running = actor.running
                states.append((actor.busy, running is not None and running.fenced))
                owners_end(actor)  # the new owner's end of this turn, as this run winds down
                if ending is not None:
                    ending(session_id, msg, end)

            actor._on_run_end = run_ended
            sub = actor.subscribe()
            actor.send_message(UserMessage("go"))
            await gate.entered.wait()
            await take_over(h, "s1")
            gate.gate.set()  # the call's result meets the fence: the run is taken over
            await actor.idle.wait()
            actor.relay(event_frame(ThinkingDelta("next"), "s1", 7, "e9"))
            got = drained(sub)
    assert states == [(True, True)], states
    said = [(f["type"], f.get("code") or f.get("reason")) for f in got]
    assert said[-4:] == [
        ("error", "session_busy"), ("stream_end", "error"),
        ("resync", None), ("thinking_delta", None),
    ], said  # fmt: skip
    assert relayed_end(got) == [("thinking_delta", 7)], said


async def test_the_owners_end_reaches_this_daemons_clients_while_a_queued_message_is_handed_back(
    tmp_path: Path,
) -> None:
    """A message queued here behind a run finds, at its own claim, that another daemon took
    the session in between: the actor is busy while it leaves that message to the other
    daemon, whose turn may end just then. That end reaches this daemon's clients."""
    hand = HeldHandOver()
    with trio.fail_after(10):
        async with open_harness(
            tmp_path, replies=[{"text": "ours", "stall": True}], profiles=profile()
        ) as h:
            h.runtime.sessions.hand_over = hand
            store = h.runtime.store
            claim, stopped = store.claim_lease, trio.Event()

            async def taken_first(session_id: str, **kw: Any) -> Any:
                if stopped.is_set():  # the other daemon claims between the two runs here
                    await claim(session_id, **{**kw, "owner": "another-daemon", "host": HOST})
                return await claim(session_id, **kw)

            store.claim_lease = taken_first  # type: ignore[method-assign]
            actor = await relaying(h)
            s = await h.session("s1")
            s.send("first")
            await s.until_type("text_delta")
            queued = UserMessage("queued here", on_busy="enqueue")
            assert actor.send_message(queued) == "enqueue"
            await queued.accepted.wait()
            stopped.set()  # the first run holds the lease: the next claim is the queued one's
            s.stop()
            await s.until_end()
            await hand.asked.wait()
            assert actor.busy  # its run leaves the queued message to the other daemon
            owners_end(actor)
            hand.answered.set()
            await actor.idle.wait()
            assert [len(keys) for keys in hand.handed] == [1]  # the queued message, handed over
            got = drained(s.subscription)
    assert relayed_end(got) == [("text_delta", 5), ("stream_end", 6)], got


async def test_another_daemons_frames_reach_this_daemons_clients_during_a_rewind_or_fork_here(
    tmp_path: Path,
) -> None:
    """A rewind or a fork runs in the actor's exclusive section (busy) and holds no lease of
    a run: the daemon that runs the session meanwhile goes on, and its frames are relayed."""
    with trio.fail_after(10):
        async with open_harness(tmp_path, replies=[]) as h:
            actor = await relaying(h)
            sub = actor.subscribe()

            async def work() -> bool:
                owners_end(actor)
                return actor.busy

            assert await actor.exclusive(work)
            got = drained(sub)
    assert relayed_end(got) == [("text_delta", 5), ("stream_end", 6)], got


async def test_a_replaced_owners_late_frames_are_dropped_while_a_run_here_holds_the_lease(
    tmp_path: Path,
) -> None:
    """While a run here holds the lease, a frame of another daemon can only be one it sent
    before this run took the session: turned away, the run's frames go on in their epoch.
    Not a frame sent out of band, with no seq (a background job the other daemon started
    says how it went): no run's, it is passed on. Once the run is over, the other daemon's
    frames are relayed again."""
    with trio.fail_after(10):
        async with open_harness(tmp_path, replies=[{"text": "ours", "stall": True}]) as h:
            actor = await relaying(h)
            s = await h.session("s1")
            s.send("hi")
            await s.until_type("text_delta")  # the run holds the lease
            owners_end(actor)
            update = TaskUpdate(task_id="t1", tool="bash", status="completed")
            actor.relay(event_frame(update, "s1", None, "e9"))
            s.stop()
            frames = await s.until_end()
            assert frames[-1]["reason"] == "stopped", frames[-1]
            assert [f for f in frames if f["type"] == "resync"] == [], frames
            assert relayed_end(frames) == [("task_update", None)]  # of the other's, that only
            await actor.idle.wait()
            owners_end(actor)
            got = drained(s.subscription)
    assert relayed_end(got) == [("text_delta", 5), ("stream_end", 6)], got


async def test_a_run_that_cannot_tell_whether_it_still_holds_the_lease_passes_no_frame_on(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The store does not answer this run's renewals (a paused daemon) until its lease could
    have run out; another daemon took the session over meanwhile and ends the run's turn.
    Until the run knows, and while it ends, its clients get nothing of the other daemon's:
    one end, its own ``session_busy``."""
    with held(autojump_clock), real_time_limit(30):
        async with open_harness(
            tmp_path, replies=[{"text": "ours", "stall": True}], profiles=profile(),
            lease_ttl_sec=3.0, first_chunk_timeout=FAR, chunk_timeout=FAR,
            session_idle_sec=FAR, llm_connect_timeout=FAR,
        ) as h:  # fmt: skip
            store = h.runtime.store
            renew, answers = store.renew_lease, trio.Event()

            async def unanswered(*args: Any, **kwargs: Any) -> bool:
                await answers.wait()
                return await renew(*args, **kwargs)

            store.renew_lease = unanswered  # type: ignore[method-assign]
            actor = await relaying(h)
            s = await h.session("s1")
            s.send("hi")
            await s.until_type("text_delta")
            await take_over(h, "s1")
            await trio.sleep(3.0)  # (virtual) past the lease's TTL, no renewal answered
            assert actor.busy
            owners_end(actor)  # the new owner's end of this turn
            answers.set()
            await actor.idle.wait()
            got = drained(s.subscription)
    said = [(f["type"], f.get("code") or f.get("reason")) for f in got if f["type"] != "text_delta"]
    assert said == [("error", "session_busy"), ("stream_end", "error")], said
    assert relayed_end(got) == []
