"""Two processes on one database: write transactions wait for the lock instead of failing.

Deterministic: the "other process" is a second sqlite3 connection that writes at the
worst moment (inside our transaction, between its first read and its first write),
driven from a trace callback on our connection. No threads, no sleeps.

Session leases: one owner runs a session at a time across processes; a dead owner's
lease (same host, pid gone; or expired) is taken over. Renewal runs on a MockClock.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing
from kvfake_tasks import MemoryKV
from test_task_supervisor import running_supervisor

from navi_trio.core.jobs import RUNNING_SCOPE
from navi_trio.core.jobs.task_notes import drain_notes
from navi_trio.core.turn import SessionLeases
from navi_trio.errors import SessionBusyError
from navi_trio.settings import Settings
from navi_trio.store._history import _append
from navi_trio.store._input import _prepare
from navi_trio.store._lease import pid_alive
from navi_trio.store._schema import SQLITE, _connect, _init_schema
from navi_trio.store.base import SessionRow
from navi_trio.store.methods import SessionStore
from navi_trio.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 30
HOST = socket.gethostname()


def test_a_write_transaction_takes_the_write_lock_before_it_reads(tmp_path: Path) -> None:
    path = tmp_path / "navi.db"
    db = _connect(path, "FULL", 0.05)
    _init_schema(db)
    SQLITE.insert_session(db, SessionRow("s-1", "default", "", "local", 1.0, 1.0), "{}", None)
    other = sqlite3.connect(str(path), timeout=0, isolation_level=None)
    seen: list[str] = []

    def other_process_writes(sql: str) -> None:
        # Fires when our append has read (the session check) and is about to write.
        if "MAX(position)" not in sql or seen:
            return
        try:
            other.execute("INSERT INTO kv (scope, key, value, updated_at) VALUES ('a','b','1',1)")
            seen.append("the other writer went first")
        except sqlite3.OperationalError as exc:
            seen.append(f"the other writer waits: {exc}")

    db.set_trace_callback(other_process_writes)
    rows = _prepare([{"role": "user", "content": "hi"}], "messages")
    # A deferred BEGIN would fail here with "database is locked" (its snapshot went
    # stale when the other writer committed, and the busy timeout does not apply).
    _append(db, "s-1", rows, rows, 2.0)
    db.set_trace_callback(None)
    assert seen == ["the other writer waits: database is locked"]
    # Our commit released the lock: the other writer goes now.
    other.execute("INSERT INTO kv (scope, key, value, updated_at) VALUES ('a','b','1',1)")
    assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 1
    other.close()
    db.close()


# -- session leases ---------------------------------------------------------------------


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, check=True, text=True)  # fmt: skip
    return int(proc.stdout)


async def claim(store: SQLiteStore, sid: str, owner: str) -> Any:
    return await store.claim_lease(sid, owner=owner, pid=1, host=HOST, ttl=60)


def _rollback_mode_database_locked_by_another(path: Path) -> sqlite3.Connection:
    """A new database still in rollback mode, and another connection holding its write
    lock: what a process opening the file meets while another makes it WAL."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("CREATE TABLE t (x)")
    other.execute("BEGIN IMMEDIATE")
    return other


def test_a_new_database_being_made_wal_by_another_process_is_waited_for(tmp_path: Path) -> None:
    """SQLite refuses the switch to WAL at once, without its busy handler, while another
    connection holds the write lock: `navi run`s started side by side on a new data folder
    failed "open store … database is locked". The open tries again until the lock goes
    (here the other side commits at the first wait: no real time passes)."""
    path = tmp_path / "navi.db"
    other = _rollback_mode_database_locked_by_another(path)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        other.execute("COMMIT")

    conn = _connect(path, "FULL", 30.0, sleep=sleep)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert len(waits) == 1 and 0 < waits[0] <= 0.1
    finally:
        conn.close()
        other.close()


def test_a_wal_switch_still_refused_after_the_busy_timeout_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "navi.db"
    other = _rollback_mode_database_locked_by_another(path)
    waits: list[float] = []
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            _connect(path, "FULL", 0.0, sleep=waits.append)
        assert waits == []  # no time left: the first refusal is the answer
    finally:
        other.close()


def test_a_file_that_is_not_a_database_fails_the_open_without_waiting(tmp_path: Path) -> None:
    path = tmp_path / "navi.db"
    path.write_bytes(b"this is not an SQLite database, only text" * 100)
    waits: list[float] = []
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        _connect(path, "FULL", 30.0, sleep=waits.append)
    assert waits == []


async def test_a_live_lease_is_refused_to_another_owner_and_released_by_its_own(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            mine = await store.claim_lease("s-1", owner="a", pid=os.getpid(), host=HOST, ttl=60)
            assert (mine.owner, mine.pid) == ("a", os.getpid())
            # Another owner, even in this very process: refused, told who holds it.
            theirs = await store.claim_lease("s-1", owner="b", pid=os.getpid(), host=HOST, ttl=60)
            assert theirs.owner == "a" and theirs.pid == os.getpid()
            # Another session is free; the holder re-claims and renews its own.
            other = await store.claim_lease("s-2", owner="b", pid=1, host=HOST, ttl=60)
            assert other.owner == "b"
            assert (await claim(store, "s-1", "a")).owner == "a"
            assert await store.renew_lease("s-1", owner="a", ttl=60) is True
            assert await store.renew_lease("s-1", owner="b", ttl=60) is False
            await store.release_lease("s-1", owner="b")  # not b's: nothing happens
            assert (await claim(store, "s-1", "b")).owner == "a"
            await store.release_lease("s-1", owner="a")
            assert (await claim(store, "s-1", "b")).owner == "b"
            assert await store.renew_lease("s-1", owner="a", ttl=60) is False


async def test_a_dead_owners_lease_is_taken_over(tmp_path: Path) -> None:
    gone = dead_pid()
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            # Same host, process gone: taken over at once, long TTL or not.
            await store.claim_lease("s-1", owner="crashed", pid=gone, host=HOST, ttl=3600)
            got = await store.claim_lease("s-1", owner="new", pid=os.getpid(), host=HOST, ttl=60)
            assert got.owner == "new"
            # Another host: its pid means nothing here; only expiry frees the lease.
            await store.claim_lease("s-2", owner="far", pid=gone, host="elsewhere", ttl=3600)
            got = await store.claim_lease("s-2", owner="new", pid=os.getpid(), host=HOST, ttl=60)
            assert (got.owner, got.host) == ("far", "elsewhere")
            await store.claim_lease("s-3", owner="far", pid=gone, host="elsewhere", ttl=-1)
            got = await store.claim_lease("s-3", owner="new", pid=os.getpid(), host=HOST, ttl=60)
            assert got.owner == "new"


def test_pid_alive_tells_live_from_dead_processes() -> None:
    assert pid_alive(os.getpid()) and pid_alive(os.getppid())
    assert not pid_alive(dead_pid()) and not pid_alive(0) and not pid_alive(-5)


async def wait_real(event: trio.Event, what: str, seconds: float = TIMEOUT) -> None:
    """`event.wait()` with an absolute timeout in real time (the test clock stands still)."""
    async with trio.open_nursery() as nursery:

        async def waiter() -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(waiter)
        await trio.to_thread.run_sync(time.sleep, seconds, abandon_on_cancel=True)
        raise AssertionError(f"{what} did not happen within {seconds} s")


class RenewSpy:
    """The store, with an event per lease renewal (the renewer runs in the background);
    a stand-in for the store, whose other methods it passes on."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.renewed = trio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def renew_lease(
        self, session_id: str, *, owner: str, ttl: float, generation: int | None = None
    ) -> bool:
        ours = await self.store.renew_lease(session_id, owner=owner, ttl=ttl, generation=generation)
        self.renewed.set()
        return ours


async def test_holds_nest_in_one_runtime_renew_while_held_and_refuse_another_runtime(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # A MockClock that only moves when told: the store's thread makes autojump race.
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        spy = RenewSpy(store)
        ours, theirs = SessionLeases(cast(SessionStore, spy), ttl=30), SessionLeases(store, ttl=30)
        async with ours.hold("s-1"):
            async with ours.hold("s-1"):  # a second run of this runtime: shares it
                pass
            with pytest.raises(SessionBusyError) as busy:
                async with theirs.hold("s-1"):
                    raise AssertionError("never entered")
            assert "'s-1'" in str(busy.value) and "busy" in str(busy.value)
            assert f"on {HOST}" in str(busy.value)
            before = await lease_of(store, "s-1")
            assert before is not None and not spy.renewed.is_set()
            mock_clock.jump(11)  # past a third of the TTL: the renewer extends the lease
            await wait_real(spy.renewed, "the lease renewal")
            after = await lease_of(store, "s-1")
            assert after is not None and after[0] == ours.owner and after[1] > before[1]
        # Released when the last hold ended; an error from the block passes through as is.
        with pytest.raises(KeyError):
            async with theirs.hold("s-1"):
                assert (await lease_of(store, "s-1")) is not None
                raise KeyError("from the block")
        # Released: expired, the row kept (its generation never goes back; store/fence.py).
        assert await lease_of(store, "s-1") == (theirs.owner, 0.0)


async def lease_of(store: SQLiteStore, sid: str) -> tuple[str, float] | None:
    def read(db: Any) -> tuple[str, float] | None:
        row = db.execute("SELECT owner, expires_at FROM leases WHERE session_id = ?",
                         [sid]).fetchone()  # fmt: skip
        return None if row is None else (row[0], row[1])

    return await store.run_raw_for_tests("read lease", read)


# -- background task markers of another process --------------------------------------


async def test_a_start_reports_only_markers_whose_process_is_gone_as_lost() -> None:
    kv = MemoryKV()
    mine = {"session_id": "s1", "task_id": "bt-live", "tool": "terminal",
            "pid": os.getppid(), "host": HOST}  # fmt: skip
    dead = {**mine, "task_id": "bt-dead", "pid": dead_pid()}
    old = {k: v for k, v in mine.items() if k not in ("pid", "host")} | {"task_id": "bt-old"}
    for marker in (mine, dead, old):
        await kv.kv_set(RUNNING_SCOPE, f"s1:{marker['task_id']}", marker)
    with trio.fail_after(TIMEOUT):
        async with running_supervisor(kv=kv):
            text = await drain_notes(kv, Settings(), "s1")
    # Another live process on this host runs bt-live: its marker stays, no note.
    assert kv.keys(RUNNING_SCOPE) == ["s1:bt-live"]
    assert text is not None and "bt-dead" in text and "bt-old" in text
    assert "bt-live" not in text
