"""A user's notices are data in the core and frames only in api/: a scheduled run's end
reaches every connection of its owner, and `notice_frame` is the one place it becomes
a ``schedule_run`` frame."""

from __future__ import annotations

import json

import attrs
import pytest
import trio

from navi_trio.api.protocol import encode, notice_frame
from navi_trio.notices import (
    NOTICES_MAX,
    TEXT_MAX_CHARS,
    ScheduleRun,
    UserNotices,
    notice_data,
    notice_of,
)


def test_a_scheduled_runs_end_is_a_schedule_run_frame() -> None:
    ended = ScheduleRun("sch-1", "s-1", "complete", "done", 12.5)
    assert notice_frame(ended) == {
        "type": "schedule_run",
        "schedule_id": "sch-1",
        "session_id": "s-1",
        "reason": "complete",
        "text": "done",
        "at": 12.5,
    }
    skipped = ScheduleRun("sch-2", None, "skipped", "over the session limit", 3.0)
    assert json.loads(encode(notice_frame(skipped)))["session_id"] is None


async def test_a_notice_reaches_each_connection_of_its_user_only() -> None:
    hub = UserNotices()
    ended = ScheduleRun("sch-1", "s-1", "complete", "done", 1.0)
    with hub.subscribe("alice") as one, hub.subscribe("alice") as two, hub.subscribe("bob") as bob:
        assert hub.publish("alice", ended) == 2
        assert one.receive_nowait() is ended and two.receive_nowait() is ended
        with pytest.raises(trio.WouldBlock):
            bob.receive_nowait()  # not bob's
        # A client that takes none loses the newest past its bound; publish never blocks.
        for _ in range(NOTICES_MAX + 3):
            hub.publish("bob", ended)
        assert bob.statistics().current_buffer_used == NOTICES_MAX


def test_a_notice_from_another_daemon_is_read_back_whole_and_checked_field_by_field() -> None:
    ended = ScheduleRun("sch-1", "s-1", "complete", "done", 12.5)
    skipped = ScheduleRun("sch-2", None, "skipped", "x" * (TEXT_MAX_CHARS + 5), 3)
    assert notice_of(json.loads(json.dumps(notice_data(ended)))) == ended
    assert notice_of(notice_data(skipped)) == attrs.evolve(
        skipped, text="x" * TEXT_MAX_CHARS, at=3.0
    )
    good = notice_data(ended)
    for bad in ({"schedule_id": 1}, {"session_id": 2}, {"at": "now"}, {"text": None}):
        assert notice_of({**good, **bad}) is None, bad
    assert notice_of(["sch-1"]) is None


async def test_a_notice_published_here_is_passed_elsewhere_and_one_from_elsewhere_is_not() -> None:
    notices = UserNotices()
    passed: list[tuple[str, ScheduleRun]] = []
    notices.elsewhere = lambda user_id, notice: passed.append((user_id, notice))
    ended = ScheduleRun("sch-1", "s-1", "complete", "done", 12.5)
    with notices.subscribe("u1") as recv:
        assert notices.publish("u1", ended) == 1
        assert notices.publish_here("u1", ended) == 1
        assert [recv.receive_nowait(), recv.receive_nowait()] == [ended, ended]
    assert passed == [("u1", ended)]
