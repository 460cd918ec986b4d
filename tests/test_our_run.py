"""Which frames are a message's run (api/our_run.py: `Accepted`, `OurRun`) and what the
chat waits for (client/awaited.py: `Awaited`), frame by frame: in-process, no daemon.
The cases the frame streams of tests/test_client_eof.py and tests/test_daemon_client.py
do not reach: a reply naming no position, the caps, an ok of another session.
"""

from __future__ import annotations

from itertools import count
from typing import Any

from navi_trio.api.our_run import Accepted, OurRun
from navi_trio.client.awaited import UNANSWERED_MAX, Awaited

Frame = dict[str, Any]
SID = "s-1"


def frames() -> Any:
    """A maker of the session's frames, their seqs counting up from 1."""
    seq = count(1)

    def frame(kind: str, **fields: Any) -> Frame:
        return {"type": kind, "session_id": SID, "seq": next(seq), "is_subagent": False, **fields}

    return frame


def test_a_queued_message_whose_place_is_not_said_waits_for_one_run_to_end() -> None:
    frame = frames()
    run = OurRun.of(Accepted(SID, created=False, queued=True), "mine")
    assert not run.ours(frame("message_queued", text="mine"))  # no position (an older daemon)
    assert run.ahead == 1
    assert not run.ours(frame("text_delta", text="the running turn's"))
    assert not run.ours(frame("stream_end"))
    assert run.ours(frame("text_delta", text="ours"))


def test_the_chat_waits_for_its_cap_of_unanswered_messages_and_lets_the_oldest_go_past_it() -> None:
    awaited = Awaited()
    for i in range(UNANSWERED_MAX):
        awaited.sent(f"m{i}", "text", busy=False)
    assert list(awaited.unanswered) == [f"m{i}" for i in range(UNANSWERED_MAX)]
    awaited.sent("one more", "text", busy=False)
    assert len(awaited.unanswered) == UNANSWERED_MAX
    assert "m0" not in awaited.unanswered and "one more" in awaited.unanswered


def test_an_ok_naming_another_session_than_the_chats_is_not_followed() -> None:
    """The chat left the session (/new, /resume) before the ok came: none of that run's
    frames come here, so waiting for its end would wait for ever."""
    for session, followed in ((SID, True), ("s-elsewhere", False)):
        awaited = Awaited()
        awaited.sent("m1", "hello", busy=False)
        awaited.taken("m1", {"type": "ok", "id": "m1", "session_id": session, "seq": 0}, SID)
        assert not awaited.unanswered
        assert awaited.waiting is followed, session


def test_the_frame_at_the_seq_the_ok_names_came_before_the_message() -> None:
    frame = frames()
    run = OurRun.of(Accepted(SID, created=False, queued=False, seq=2, epoch="e1"), "mine")
    assert not run.ours({**frame("text_delta", text="before"), "epoch": "e1"})  # seq 1
    assert not run.ours({**frame("stream_end"), "epoch": "e1"})  # seq 2: the run before
    assert run.ours({**frame("text_delta", text="ours"), "epoch": "e1"})  # seq 3
    assert not run.ended


def test_after_a_restart_the_new_epochs_low_seqs_are_still_our_run() -> None:
    """A restarted daemon counts seqs from 1 again in a new epoch: the ok's seq says
    nothing of them."""
    run = OurRun.of(Accepted(SID, created=False, queued=False, seq=40, epoch="e1"), "mine")
    later = {"session_id": SID, "epoch": "e2", "is_subagent": False}
    assert run.ours({**later, "type": "text_delta", "seq": 3, "text": "ours"})
    assert run.ours({**later, "type": "stream_end", "seq": 4})
    assert run.ended


def test_another_messages_queued_or_steered_frame_is_not_ours() -> None:
    frame = frames()
    queued = OurRun.of(Accepted(SID, created=False, queued=True), "mine")
    assert not queued.ours(frame("message_queued", text="someone else's", position=1))
    assert queued.ahead is None  # still waiting for our own message_queued
    steered = OurRun.of(Accepted(SID, created=False, queued=False, on_busy="steer"), "mine")
    assert not steered.ours(frame("steered", text="someone else's"))
    assert not steered.ours(frame("text_delta", text="the running turn's"))
    assert steered.ours(frame("steered", text="mine"))
    assert steered.ours(frame("text_delta", text="ours now"))


def test_a_sub_agents_end_neither_ends_our_run_nor_counts_as_a_run_ahead() -> None:
    frame = frames()
    run = OurRun.of(Accepted(SID, created=False, queued=True), "mine")
    assert not run.ours(frame("message_queued", text="mine", position=1))
    assert not run.ours(frame("stream_end", is_subagent=True, agent_id="a1"))
    assert run.ahead == 1  # the running turn's sub-agent ended, not the turn
    assert not run.ours(frame("stream_end"))
    assert run.ours(frame("stream_end", is_subagent=True, agent_id="a2"))
    assert run.running
    assert run.ours(frame("stream_end"))
    assert run.ended


def test_a_steer_whose_steered_frame_came_before_the_ok_is_followed_to_its_end() -> None:
    frame = frames()
    awaited = Awaited()
    awaited.sent("m1", "mine", busy=True)
    awaited.frame(frame("steered", text="mine"))  # before the ok
    ok = {"type": "ok", "id": "m1", "session_id": SID, "on_busy": "steer"}
    awaited.taken("m1", ok, SID)
    assert awaited.waiting
    awaited.frame(frame("text_delta", text="the turn, with ours in it"))
    awaited.frame(frame("stream_end"))
    assert not awaited.waiting


def test_the_ok_says_whether_the_message_was_queued() -> None:
    ok = {"type": "ok", "session_id": SID, "queued": True, "on_busy": "enqueue", "seq": 4}
    accepted = Accepted.of([ok])
    assert (accepted.queued, accepted.on_busy, accepted.seq) == (True, "enqueue", 4)
    assert not Accepted.of([{**ok, "queued": False}]).queued
