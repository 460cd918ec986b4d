"""The SessionStore contract on both stores: wake-ups, usage counters, schedules (issue 23).

Every test runs on a real SQLite file and on a fresh PostgreSQL database (the `backend`
fixture, tests/store_backends.py). "Two daemons" are two stores opened on the same file
or database. Rules: no sleeps; every test under an absolute `trio.fail_after`.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pytest
import trio
from store_backends import Backend

from navi_trio.errors import StoreError
from navi_trio.store.base import NewSession, QueuedRow, ScheduleRow

TIMEOUT = 30
HOST = socket.gethostname() or "localhost"
NOTES = "task_notes"


def wake(sid: str, key: str) -> QueuedRow:
    return QueuedRow(sid, key, {"kind": "wake", "text": ""}, os.getpid(), HOST)


def schedule(sid: str = "sch-1", **changes: Any) -> ScheduleRow:
    row: dict[str, Any] = {
        "id": sid, "user_id": "u-alice", "session_id": None, "profile_id": "general",
        "kind": "every", "spec": "600", "message": "check the mail", "catch_up": True,
        "paused": False, "next_due": 1000.0, "created_at": time.time(),
    }  # fmt: skip
    row.update(changes)
    return ScheduleRow(**row)


# -- wake-ups ---------------------------------------------------------------------------


async def test_a_note_and_its_wake_up_land_together_and_are_bounded(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s1", profile_id="general")
            for i in (1, 2):
                queued = await store.enqueue_wake(
                    wake("s1", f"w{i}"), note=(NOTES, f"s1:{i}", {"n": i}), limit=2, per=3600
                )
                assert queued is True
            # The third within the hour: the note is kept, no wake-up is queued.
            third = await store.enqueue_wake(
                wake("s1", "w3"), note=(NOTES, "s1:3", {"n": 3}), limit=2, per=3600
            )
            assert third is False
            assert [k for k, _ in await store.kv_list(NOTES, "s1:")] == ["s1:1", "s1:2", "s1:3"]
            adopted = await store.adopt_queued("s1", pid=os.getpid(), host=HOST)
            assert [(k, m["kind"]) for k, m in adopted] == [("w1", "wake"), ("w2", "wake")]
            # Out of the window (here: a window of a microsecond) they count no more.
            assert await store.enqueue_wake(wake("s1", "w4"), note=None, limit=2, per=1e-6)
            assert await store.enqueue_wake(wake("s1", "w5"), note=None, limit=0, per=3600) is False


async def test_a_failed_wake_up_stores_neither_the_note_nor_the_wake(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s1", profile_id="general")
            await backend.fail_inserts("queued", "queue on fire")
            with pytest.raises(StoreError, match="queue on fire"):
                await store.enqueue_wake(
                    wake("s1", "w1"), note=(NOTES, "s1:1", {"n": 1}), limit=5, per=3600
                )
            assert await store.kv_list(NOTES) == []
            await backend.allow_inserts("queued")
            assert await store.enqueue_wake(wake("s1", "w1"), note=None, limit=1, per=3600)
            with pytest.raises(StoreError):
                await store.enqueue_wake(wake("nope", "w9"), note=None, limit=1, per=3600)
            with pytest.raises(StoreError, match="limit"):
                await store.enqueue_wake(wake("s1", "w2"), note=None, limit=-1, per=3600)


# -- usage ------------------------------------------------------------------------------


async def test_usage_adds_up_across_two_daemons_and_survives_a_restart(backend: Backend) -> None:
    keys = ["session:s1", "user:u-1:2030-01-01"]
    with trio.fail_after(TIMEOUT):
        async with backend.open() as one, backend.open() as two:

            async def spend(store: Any, n: int) -> None:
                for _ in range(n):
                    await store.add_usage(keys, {"tokens": 10, "tool_calls": 1, "wall_sec": 0.5})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(spend, one, 20)
                nursery.start_soon(spend, two, 20)
            await one.add_usage(["session:s1"], {"subagents": 3})
        async with backend.open() as store:
            got = await store.get_usage([*keys, "session:never"])
    assert got["session:s1"] == {"tokens": 400, "tool_calls": 40, "subagents": 3, "wall_sec": 20}
    assert got["user:u-1:2030-01-01"]["tokens"] == 400
    assert got["session:never"] == {"tokens": 0, "tool_calls": 0, "subagents": 0, "wall_sec": 0}


@pytest.mark.parametrize(
    ("keys", "amounts", "problem"),
    [
        (["k"], {"tokens": -1}, "0 or more"),
        (["k"], {"tokens": float("nan")}, "finite"),
        (["k"], {"gold": 1}, "unknown usage kind"),
        (["k"], {"tokens": "5"}, "must be a number"),
        ("k", {"tokens": 1}, "list of strings"),
        (["x" * 300], {"tokens": 1}, "at most 256"),
        ([f"k{i}" for i in range(17)], {"tokens": 1}, "at most 16"),
    ],
)
async def test_bad_usage_is_refused_naming_the_problem(
    backend: Backend, keys: Any, amounts: Any, problem: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            with pytest.raises(StoreError, match=problem):
                await store.add_usage(keys, amounts)
            assert await store.get_usage(["k"]) == {"k": dict.fromkeys(
                ["tokens", "tool_calls", "subagents", "wall_sec"], 0.0)}  # fmt: skip


# -- schedules --------------------------------------------------------------------------


async def test_schedules_are_created_listed_paused_and_deleted(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            a = await store.create_schedule(schedule("sch-a", budget={"turn": {"tokens": 9}}))
            b = await store.create_schedule(schedule("sch-b", user_id="u-bob", kind="cron",
                                                     spec="*/30 * * * *"))  # fmt: skip
            with pytest.raises(StoreError, match="already exists"):
                await store.create_schedule(schedule("sch-a"))
            with pytest.raises(StoreError, match="kind"):
                await store.create_schedule(schedule("sch-c", kind="weekly"))
            assert await store.get_schedule("sch-a") == a
            assert [r.id for r in await store.list_schedules()] == ["sch-a", "sch-b"]
            assert await store.list_schedules("u-bob") == [b]
            assert await store.count_schedules("u-alice") == 1
            assert await store.set_schedule("sch-a", paused=True, next_due=None) is True
            got = await store.get_schedule("sch-a")
            assert got is not None and got.paused and got.next_due is None
            assert got.budget == {"turn": {"tokens": 9}}
            assert await store.set_schedule("ghost", paused=True, next_due=None) is False
            assert await store.delete_schedule("sch-b") is True
            assert await store.delete_schedule("sch-b") is False
        async with backend.open() as store:  # after a restart
            assert [r.id for r in await store.list_schedules()] == ["sch-a"]


async def test_a_due_time_is_claimed_once_with_its_session_and_queued_run(
    backend: Backend,
) -> None:
    run = QueuedRow("s-new", "run-1", {"kind": "schedule", "text": "check"}, os.getpid(), HOST)
    new = NewSession("s-new", "general", "u-alice", "check the mail")
    with trio.fail_after(TIMEOUT):
        async with backend.open() as one, backend.open() as two:
            await one.create_schedule(schedule(next_due=1000.0))
            results: list[bool] = []

            async def claim(store: Any) -> None:
                results.append(
                    await store.claim_schedule(
                        "sch-1", due=1000.0, next_due=1600.0, run=run, session=new
                    )  # fmt: skip
                )

            before = time.time()
            async with trio.open_nursery() as nursery:  # two daemons at once
                nursery.start_soon(claim, one)
                nursery.start_soon(claim, two)
            after = time.time()
            assert sorted(results) == [False, True]
            got = await one.get_schedule("sch-1")
            assert got is not None
            assert (got.next_due, got.runs, got.last_session_id) == (1600.0, 1, "s-new")
            # When it ran (the claim that queued it), not the due time it ran for.
            assert got.last_run_at is not None and before <= got.last_run_at <= after, got
            row = await one.get_session("s-new")
            assert row is not None and (row.user_id, row.title) == ("u-alice", "check the mail")
            queued = await one.adopt_queued("s-new", pid=os.getpid(), host=HOST)
            assert queued == [("run-1", {"kind": "schedule", "text": "check"})]
            # A stale due time claims nothing; a skip (no run) moves it on.
            assert not await one.claim_schedule("sch-1", due=1000.0, next_due=2200.0, run=None)
            assert await one.claim_schedule("sch-1", due=1600.0, next_due=2200.0, run=None)
            got = await one.get_schedule("sch-1")
            assert got is not None and (got.next_due, got.runs) == (2200.0, 1)
            # Paused: nothing is claimed.
            await one.set_schedule("sch-1", paused=True, next_due=2200.0)
            assert not await one.claim_schedule("sch-1", due=2200.0, next_due=2800.0, run=None)


async def test_a_failed_claim_leaves_everything_as_it_was(backend: Backend) -> None:
    run = QueuedRow("s-new", "run-1", {"kind": "schedule", "text": "check"}, os.getpid(), HOST)
    new = NewSession("s-new", "general", "u-alice")
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_schedule(schedule(next_due=1000.0))
            await backend.fail_inserts("queued", "queue on fire")
            with pytest.raises(StoreError, match="queue on fire"):
                await store.claim_schedule(
                    "sch-1", due=1000.0, next_due=1600.0, run=run, session=new
                )
            got = await store.get_schedule("sch-1")
            assert got is not None and (got.next_due, got.runs) == (1000.0, 0)
            assert await store.get_session("s-new") is None


async def test_deleting_a_session_deletes_its_wakes_usage_and_schedules(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s1", profile_id="general")
            await store.create_schedule(schedule("sch-s1", session_id="s1"))
            await store.create_schedule(schedule("sch-new"))
            await store.add_usage(["session:s1", "user:u-alice:2030-01-01"], {"tokens": 5})
            assert await store.enqueue_wake(wake("s1", "w1"), note=None, limit=1, per=3600)
            assert await store.delete_session("s1")
            assert [r.id for r in await store.list_schedules()] == ["sch-new"]
            usage = await store.get_usage(["session:s1", "user:u-alice:2030-01-01"])
            assert usage["session:s1"]["tokens"] == 0
            assert usage["user:u-alice:2030-01-01"]["tokens"] == 5  # the user's day stays
            await store.create_session("s1", profile_id="general")
            # A new session of that name starts with no wake-ups counted.
            assert await store.enqueue_wake(wake("s1", "w2"), note=None, limit=1, per=3600)
