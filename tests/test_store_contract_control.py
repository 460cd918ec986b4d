"""The SessionStore contract on both stores: wake-ups, usage counters, schedules (issue 23),
and what removing a user takes with it; every change of the users table is signalled.

Every test runs on a real SQLite file and on a fresh PostgreSQL database (the `backend`
fixture, tests/store_backends.py). "Two daemons" are two stores opened on the same file
or database. Rules: no sleeps; every test under an absolute `trio.fail_after`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import attrs
import pytest
import trio
from pg_server import pg_url_with_schema as pg_url_with_schema
from store_backends import Backend

from navi_trio.errors import LimitError, StoreError
from navi_trio.store import SessionStore, SQLiteStore
from navi_trio.store.base import (
    USERS_CHANNEL,
    NewSession,
    QueuedRow,
    RunUsage,
    ScheduleRow,
    UsageAsk,
    UsageLine,
    UsageRequest,
)

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


DAY = "user:u-1:2030-01-01"
SESSION = "session:s1"


def tokens(want: float, least: float, hold: str, **kw: Any) -> UsageRequest:
    return UsageRequest(
        want={"tokens": want}, least={"tokens": least}, full=("wall_sec",), hold=hold,
        pid=os.getpid(), host=HOST, **kw,
    )  # fmt: skip


async def test_a_reservation_takes_what_is_left_counting_the_holds_and_is_settled(
    backend: Backend,
) -> None:
    asks = [UsageAsk(SESSION, {"tokens": 5000}), UsageAsk(DAY, {"tokens": 3000, "wall_sec": 60})]
    with trio.fail_after(TIMEOUT):
        async with backend.open() as one, backend.open() as two:
            await one.add_usage([DAY], {"tokens": 1000})
            first = await one.reserve_usage(asks, tokens(1500, 101, "h-1"))
            assert (first.granted, first.refused) == ({"tokens": 1500}, None)
            assert first.spent[DAY]["tokens"] == 1000 and first.held[DAY]["tokens"] == 1500
            # Another daemon: only what the day has left after the hold (cut), then none.
            second = await two.reserve_usage(asks, tokens(1500, 101, "h-2"))
            assert second.granted == {"tokens": 500} and second.held[DAY]["tokens"] == 2000
            third = await two.reserve_usage(asks, tokens(1500, 101, "h-3"))
            assert (third.granted, third.refused) == ({}, (DAY, "tokens"))
            assert (third.spent[DAY]["tokens"], third.held[DAY]["tokens"]) == (1000, 2000)
            # Settled: the real use added and the hold dropped at once; the rest is free.
            totals = await one.settle_usage({SESSION: {"tokens": 420}, DAY: {"tokens": 420}},
                                            release=["h-1"])  # fmt: skip
            assert totals[DAY]["tokens"] == 1420 and totals[SESSION]["tokens"] == 420
            fourth = await two.reserve_usage(asks, tokens(2000, 101, "h-4"))
            assert fourth.granted == {"tokens": 3000 - 1420 - 500}
            await two.settle_usage({}, release=["h-2", "h-4"])
            assert await backend.query("SELECT count(*) FROM usage_holds") == [(0,)]
            # Wall time asks nothing but refuses at its limit.
            await one.add_usage([DAY], {"wall_sec": 60})
            late = await one.reserve_usage(asks, tokens(10, 10, "h-5"))
            assert late.refused == (DAY, "wall_sec")


async def test_a_count_is_taken_at_once_and_two_daemons_never_pass_the_limit(
    backend: Backend,
) -> None:
    asks = [UsageAsk(DAY, {"tool_calls": 4})]
    call = UsageRequest(want={"tool_calls": 1}, pid=os.getpid(), host=HOST)
    granted: list[bool] = []
    with trio.fail_after(TIMEOUT):
        async with backend.open() as one, backend.open() as two:

            async def take(store: Any) -> None:
                grant = await store.reserve_usage(asks, call)
                granted.append(grant.refused is None)

            async with trio.open_nursery() as nursery:
                for i in range(10):
                    nursery.start_soon(take, (one, two)[i % 2])
            assert sorted(granted) == [False] * 6 + [True] * 4
            assert (await one.get_usage([DAY]))[DAY]["tool_calls"] == 4
            assert await backend.query("SELECT count(*) FROM usage_holds") == [(0,)]


@pytest.mark.slow
async def test_a_hold_left_by_a_dead_process_or_expired_counts_no_more(
    backend: Backend,
) -> None:
    gone = _ended_pid()
    asks = [UsageAsk(DAY, {"tokens": 1000})]
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            # A hold taken on another host: its pid means nothing here, it counts.
            far = attrs.evolve(tokens(1000, 1000, "h-far"), host="another-host", pid=gone)
            assert (await store.reserve_usage(asks, far)).refused is None
            refused = await store.reserve_usage(asks, tokens(1000, 1000, "h-x"))
            assert refused.refused == (DAY, "tokens") and refused.held[DAY]["tokens"] == 1000
            await _past(backend, "h-far")  # until its time runs out
            # A hold of a process of this host that has ended: dropped at the next one.
            crashed = attrs.evolve(tokens(1000, 1000, "h-dead"), pid=gone)
            assert (await store.reserve_usage(asks, crashed)).refused is None
            mine = await store.reserve_usage(asks, tokens(1000, 1000, "h-mine"))
            assert mine.refused is None and mine.held[DAY]["tokens"] == 1000
            holds = await backend.query("SELECT hold FROM usage_holds ORDER BY hold")
            assert holds == [("h-mine",)]


def _ended_pid() -> int:
    proc = subprocess.Popen(["true"])  # noqa: ASYNC220 - waited for at once
    proc.wait()
    return proc.pid


async def _past(backend: Backend, hold: str) -> None:
    """The hold's expiry moved into the past (by the database's own clock)."""
    await backend.execute(f"UPDATE usage_holds SET expires_at = 0 WHERE hold = '{hold}'")


@pytest.mark.parametrize(
    ("asks", "request_", "problem"),
    [
        ([UsageAsk("k", {"gold": 1})], UsageRequest(want={"tokens": 1}), "unknown usage kind"),
        ([UsageAsk("k", {"tokens": -1})], UsageRequest(want={"tokens": 1}), "0 or more"),
        ([UsageAsk("k", {})], UsageRequest(want={"tokens": float("inf")}), "finite"),
        ([UsageAsk("k", {}), UsageAsk("k", {})], UsageRequest(want={}), "at most once"),
        ([UsageAsk("k", {})], UsageRequest(want={}, least={"tokens": 1}), "does not want"),
        ([UsageAsk("k", {})], UsageRequest(want={}, hold="h" * 65), "at most 64"),
        ([UsageAsk("k", {})], UsageRequest(want={}, ttl=0), "above 0"),
        ([UsageAsk("x" * 300, {})], UsageRequest(want={}), "at most 256"),
    ],
)
async def test_a_bad_reservation_is_refused_naming_the_problem(
    backend: Backend, asks: Any, request_: UsageRequest, problem: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            with pytest.raises(StoreError, match=problem):
                await store.reserve_usage(asks, request_)
            with pytest.raises(StoreError, match="list of strings"):
                await store.settle_usage({}, release="h-1")
            assert await backend.query("SELECT count(*) FROM usage_holds") == [(0,)]


# -- the session limit --------------------------------------------------------------------


async def test_sessions_created_at_once_by_two_daemons_stay_within_the_limit(
    backend: Backend,
) -> None:
    made: list[str] = []
    refused: list[str] = []
    with trio.fail_after(TIMEOUT):
        async with backend.open() as one, backend.open() as two:

            async def create(store: Any, i: int) -> None:
                try:
                    await store.create_session(f"s-{i}", profile_id="general",
                                               user_id="u-alice", sessions_max=3)  # fmt: skip
                    made.append(f"s-{i}")
                except LimitError as exc:
                    refused.append(str(exc))

            async with trio.open_nursery() as nursery:
                for i in range(10):
                    nursery.start_soon(create, (one, two)[i % 2], i)
            assert len(made) == 3 and len(refused) == 7
            assert "NAVI_SESSIONS_PER_USER=3" in refused[0]
            assert await one.count_sessions("u-alice") == 3
            await one.create_session("s-bob", profile_id="general", user_id="u-bob",
                                     sessions_max=3)  # fmt: skip


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
                claimed = await store.claim_schedule(
                    "sch-1", due=1000.0, next_due=1600.0, run=run, session=new
                )
                assert claimed.skipped is None
                results.append(claimed.claimed)

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


async def test_a_claim_over_the_owners_session_limit_skips_its_run_and_says_why(
    backend: Backend,
) -> None:
    run = QueuedRow("s-new", "run-1", {"kind": "schedule", "text": "check"}, os.getpid(), HOST)
    new = NewSession("s-new", "general", "u-alice")
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_schedule(schedule(next_due=1000.0))
            await store.create_session("s-old", profile_id="general", user_id="u-alice")
            skipped = await store.claim_schedule(
                "sch-1", due=1000.0, next_due=1600.0, run=run, session=new, sessions_max=1
            )
            assert skipped.claimed and skipped.skipped is not None
            assert "NAVI_SESSIONS_PER_USER=1" in skipped.skipped
            got = await store.get_schedule("sch-1")
            assert got is not None
            assert (got.next_due, got.runs, got.last_skip, got.last_skip_at) == (
                1600.0, 0, skipped.skipped, 1000.0
            )  # fmt: skip
            assert await store.get_session("s-new") is None
            assert await store.queued_sessions() == []
            # Room again: the next due time runs, and the reason is cleared.
            await store.delete_session("s-old")
            ran = await store.claim_schedule(
                "sch-1", due=1600.0, next_due=2200.0, run=run, session=new, sessions_max=1
            )
            assert ran.claimed and ran.skipped is None
            got = await store.get_schedule("sch-1")
            assert got is not None and (got.runs, got.last_skip) == (1, None)
            assert await store.get_session("s-new") is not None


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


# -- a removed user -----------------------------------------------------------------------


async def test_removing_a_user_takes_their_schedules_and_queued_messages_not_their_sessions(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            alice = await store.create_user("alice", "token-a")
            bob = await store.create_user("bob", "token-b")
            await store.create_session("s-bob", profile_id="general", user_id=bob["id"])
            for who, sid in ((alice, "sch-a"), (bob, "sch-b1"), (bob, "sch-b2")):
                await store.create_schedule(schedule(sid, user_id=who["id"]))
            for key, who in (("k1", bob), ("k2", alice), ("k3", bob)):
                message = {"text": key, "user_id": who["id"], "kind": "user"}
                await store.enqueue("s-bob", key, message, pid=os.getpid(), host=HOST)
            # A row that is not a message of ours is nobody's: it stays.
            await backend.execute(
                "INSERT INTO queued (key, session_id, pid, host, data, created_at)"
                " VALUES ('k4', 's-bob', 1, 'h', 'not json', 0)"
            )
            assert await store.remove_user("bob") is True
            assert [r.id for r in await store.list_schedules()] == ["sch-a"]
            keys = await backend.query("SELECT key FROM queued ORDER BY key")
            assert keys == [("k2",), ("k4",)]
            assert await store.get_session("s-bob") is not None
            assert await store.list_users() == [alice]


@asynccontextmanager
async def users_signals(store: SessionStore) -> AsyncIterator[trio.MemoryReceiveChannel[str]]:
    """What a daemon on this database hears of changes of the users table: SQLite's
    marker watch, or PostgreSQL's notifications on the users channel."""
    send, signals = trio.open_memory_channel[str](64)
    async with trio.open_nursery() as nursery:
        if isinstance(store, SQLiteStore):
            await nursery.start(store.watch_users, lambda: send.send_nowait("changed"))
            yield signals
        else:
            bus = cast(Any, store).bus()
            bus.on_message(lambda channel, _: send.send_nowait(channel))
            async with bus.listening():
                await bus.listen(USERS_CHANNEL)
                yield signals
        nursery.cancel_scope.cancel()


async def test_every_change_of_the_users_is_signalled_to_another_connection(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as daemon, backend.open() as cli:
            async with users_signals(daemon) as signals:
                # Each change by another connection (`navi users`), once committed.
                await cli.create_user("bob", "token-1")
                await signals.receive()
                assert await daemon.get_user_by_token("token-1") is not None
                await cli.rotate_user_token("bob", "token-2")
                await signals.receive()
                assert await daemon.get_user_by_token("token-1") is None
                await cli.remove_user("bob")
                await signals.receive()
                assert await daemon.get_user_by_name("bob") is None


# -- the accounts -----------------------------------------------------------------------


def _run(session: str, user: str, model: str, kind: str = "turn", **amounts: Any) -> RunUsage:
    spent = {"tokens_in": 100, "tokens_out": 10, "llm_sec": 1.5, "tool_sec": 0.25, **amounts}
    return RunUsage(session_id=session, user_id=user, profile="general", model=model,
                    kind=kind, **spent)  # fmt: skip


async def test_run_usage_is_summed_by_group_model_and_kind_and_survives_a_restart(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as one, backend.open() as two:
            await one.record_run_usage(_run("s1", "u-1", "m"))
            await two.record_run_usage(_run("s1", "u-1", "m", tokens_in=50))
            await one.record_run_usage(_run("s1", "u-1", "m", "subagent", tokens_out=4))
            await two.record_run_usage(_run("s2", "u-2", "big", tool_sec=0.0))
        async with backend.open() as store:
            by_model = await store.usage_report(by="model")
            alices = await store.usage_report(by="session", user_id="u-1")
            one_session = await store.usage_report(by="user", session_id="s2")
            later = await store.usage_report(since=time.time() + 3600)
    assert by_model == [
        UsageLine("big", "big", "turn", 1, 100, 10, 1.5, 0.0),
        UsageLine("m", "m", "subagent", 1, 100, 4, 1.5, 0.25),
        UsageLine("m", "m", "turn", 2, 150, 20, 3.0, 0.5),
    ]
    assert [(u.key, u.kind, u.runs) for u in alices] == [("s1", "subagent", 1), ("s1", "turn", 2)]
    assert [(u.key, u.tokens_in) for u in one_session] == [("u-2", 100)]
    assert later == []


@pytest.mark.parametrize(
    ("usage", "problem"),
    [
        (_run("", "u", "m"), "session_id"),
        (_run("s", "u", "m", "chat"), "run kind"),
        (_run("s", "u", "m", tokens_in=-1), "not negative"),
        (_run("s", "u", "m", llm_sec=float("inf")), "finite"),
    ],
)
async def test_bad_run_usage_is_refused_naming_the_problem(
    backend: Backend, usage: RunUsage, problem: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            with pytest.raises(StoreError, match=problem):
                await store.record_run_usage(usage)
            with pytest.raises(StoreError, match="grouped by one of"):
                await store.usage_report(by="colour")
            assert await store.usage_report() == []
