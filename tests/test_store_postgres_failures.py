"""The PostgreSQL store when the server fails, is slow or locks: errors, retries, waiting.

On the session's throwaway server (tests/pg_server.py; skipped, saying why, where none
can start):

- the server's failures come back as the store's error classes and wire codes: nobody
  listening, a read-only database, a real full disk (a tablespace on a small tmpfs), a
  connection cut under the pool; each condition is one log line until it ends;
- a real deadlock between two transactions is run again, not reported;
- a session's row lock holds up no other session; a queued job whose caller gave up
  still runs; the pool's size bounds the connections.

Rules: real server, real connections, no sleeps; every test under an absolute timeout.
"""

from __future__ import annotations

import errno
import functools
import logging
import secrets
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from builders import user
from pg_server import closed_port, cut_connections, sql

from navi_trio.errors import StorageError, StorageFullError, StoreError
from navi_trio.store.postgres import PostgresStore
from navi_trio.store.postgres import _core as store_core
from navi_trio.store.postgres._errors import failure
from navi_trio.store.postgres._migrate import migrate
from navi_trio.testing.postgres import PgServer

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 30


# -- a server that fails ------------------------------------------------------------------


async def test_nobody_listening_is_a_storage_error_naming_the_server_not_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Opening gives up after OPEN_WAIT_S whatever the pool saw meanwhile (here: refused
    # at once, again and again): a short wait ends on the same error as 10 s of it.
    monkeypatch.setattr(store_core, "OPEN_WAIT_S", 0.2)
    with closed_port() as port:
        url = f"postgresql://navi:hunter2@127.0.0.1:{port}/nothing"
        with trio.fail_after(TIMEOUT), pytest.raises(StorageError) as refused:
            async with PostgresStore.open(url):
                pass
    said = str(refused.value)
    assert refused.value.code == "storage"
    assert f"open store postgresql://navi@127.0.0.1:{port}/nothing: cannot reach" in said
    assert "hunter2" not in said


async def test_a_read_only_database_refuses_writes_once_in_the_log_and_reads_go_on(
    pg_server: PgServer, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    db, admin = pg_url.rsplit("/", 1)[1], pg_server.url()
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="p")
            await store.append("s1", messages=[user("before")])
            await trio.to_thread.run_sync(
                sql, admin, f'ALTER DATABASE "{db}" SET default_transaction_read_only = on'
            )
            await trio.to_thread.run_sync(cut_connections, pg_url)  # new sessions: read-only
            for n in range(3):
                with pytest.raises(StorageError, match="cannot be written or read") as refused:
                    await store.append("s1", messages=[user(f"refused {n}")])
                assert refused.value.code == "storage" and "'s1'" in str(refused.value)
            assert await store.load_messages("s1") == [user("before")]  # reads go on
            lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            assert len(lines) == 1 and "read-only" in lines[0], lines
            await trio.to_thread.run_sync(
                sql, admin, f'ALTER DATABASE "{db}" RESET default_transaction_read_only'
            )
            await trio.to_thread.run_sync(cut_connections, pg_url)
            await store.append("s1", messages=[user("after")])
            assert await store.load_messages("s1") == [user("before"), user("after")]
    assert any("writes succeed again" in r.getMessage() for r in caplog.records)


async def test_connections_cut_under_the_pool_are_replaced(pg_url: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="p")
            for n in range(3):
                await trio.to_thread.run_sync(cut_connections, pg_url)
                await store.append("s1", messages=[user(str(n))])
            assert len(await store.load_messages("s1")) == 3


async def test_a_pool_of_two_runs_many_calls_on_two_connections(pg_url: str) -> None:
    seen: list[int] = []

    async def call(store: PostgresStore) -> None:
        seen.append(await store.run_raw_for_tests("backend pid", lambda c: c.info.backend_pid))

    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url, pool_size=2) as store:
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(call, store)
    assert len(seen) == 20 and 1 <= len(set(seen)) <= 2


async def test_a_session_waiting_for_a_lock_holds_up_no_other_session(pg_url: str) -> None:
    with trio.fail_after(TIMEOUT), psycopg.connect(pg_url) as other:
        async with PostgresStore.open(pg_url) as store:
            for sid in ("busy", "free"):
                await store.create_session(sid, profile_id="p")
            other.execute("SELECT 1 FROM sessions WHERE id = 'busy' FOR UPDATE")
            async with trio.open_nursery() as nursery:
                waits = functools.partial(store.append, "busy", messages=[user("waits")])
                nursery.start_soon(waits)
                await trio.testing.wait_all_tasks_blocked()
                await store.append("free", messages=[user("goes")])
                assert await store.load_messages("free") == [user("goes")]
                assert await store.load_messages("busy") == []
                await trio.to_thread.run_sync(other.commit)
            assert await store.load_messages("busy") == [user("waits")]


async def test_a_queued_job_whose_caller_gave_up_still_runs_before_close(pg_url: str) -> None:
    with trio.fail_after(TIMEOUT), psycopg.connect(pg_url) as other:
        async with PostgresStore.open(pg_url, pool_size=1) as store:  # one worker: a queue
            for sid in ("busy", "free"):
                await store.create_session(sid, profile_id="p")
            other.execute("SELECT 1 FROM sessions WHERE id = 'busy' FOR UPDATE")
            async with trio.open_nursery() as nursery:
                for sid in ("busy", "free"):  # "free" waits in the queue behind "busy"
                    save = functools.partial(store.append, sid, messages=[user(sid)])
                    nursery.start_soon(save)
                    await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()  # both callers give up
            await trio.to_thread.run_sync(other.commit)
        async with PostgresStore.open(pg_url) as store:
            assert await store.load_messages("busy") == [user("busy")]
            assert await store.load_messages("free") == [user("free")]


async def test_text_the_server_cannot_hold_is_a_store_error_saying_so(pg_url: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            with pytest.raises(StoreError, match="create session 's1'.*NUL"):
                await store.create_session("s1", profile_id="p", title="a\x00b")
            assert await store.get_session("s1") is None


@pytest.fixture
def small_tablespace(pg_server: PgServer, pg_url: str) -> Iterator[Path]:
    """The history tables of `pg_url` moved to a tablespace on a 1 MB tmpfs."""
    import os
    import shutil
    import tempfile

    # Not under tmp_path: the server runs as another user, who must reach the folder.
    where = Path(tempfile.mkdtemp(prefix="navi-pg-small-"))
    owner = os.stat(pg_server.folder / "data")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size=1m,uid={owner.st_uid},gid={owner.st_gid},mode=0700",
         "tmpfs", str(where)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a 1 MB tmpfs here: {mounted.stderr.strip() or 'refused'}")
    name = "small_" + secrets.token_hex(4)
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            migrate(conn, pg_url)  # the schema, as a store's open applies it
        sql(pg_url, f"CREATE TABLESPACE {name} LOCATION '{where}'")
        for table in ("messages", "context"):
            sql(pg_url, f"ALTER TABLE {table} SET TABLESPACE {name}")
        yield where
    finally:
        pg_server.drop_database(pg_url.rsplit("/", 1)[1])
        sql(pg_server.url(), f"DROP TABLESPACE IF EXISTS {name}")
        if subprocess.run(["umount", str(where)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


def fill(where: Path, leave: int) -> Path:
    """A file that takes the free blocks of the small disk but `leave` bytes."""
    filler = where / "filler"
    with filler.open("wb", buffering=0) as f:
        for _ in range(128):
            try:
                f.write(b"\0" * 16384)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        f.truncate(max(0, f.tell() - leave))
    return filler


async def test_a_real_full_disk_is_storage_full_nothing_half_stored_and_it_recovers(
    pg_url: str, small_tablespace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    big = [user("x" + secrets.token_hex(40_000))]  # 80 KB that TOAST cannot compress away
    outcome = []
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="p")
            filler = await trio.to_thread.run_sync(fill, small_tablespace, 200_000)
            for _ in range(8):
                try:
                    await store.append("s1", messages=big, context=big)
                    outcome.append("ok")
                except StorageFullError as exc:
                    assert exc.code == "storage_full" and "is full" in str(exc)
                    outcome.append("full")
            assert "full" in outcome, outcome
            kept = outcome.count("ok")
            assert await store.load_messages("s1") == big * kept  # nothing half-stored
            assert await store.load_context("s1") == big * kept
            lines = [r.getMessage() for r in caplog.records if "is full" in r.getMessage()]
            assert len(lines) == 1, lines
            filler.unlink()
            await store.append("s1", messages=[user("after")])
            assert (await store.load_messages("s1"))[-1] == user("after")
    assert any("writes succeed again" in r.getMessage() for r in caplog.records)


def test_every_server_failure_maps_to_its_class_and_wire_code() -> None:
    import psycopg.errors as pg
    import psycopg_pool

    cases = [
        (pg.DiskFull("could not extend file"), StorageFullError, "full"),
        (pg.ReadOnlySqlTransaction("read-only"), StorageError, "unwritable"),
        (pg.InsufficientPrivilege("denied"), StorageError, "unwritable"),
        (pg.IoError("i/o"), StorageError, "unwritable"),
        (pg.DataCorrupted("bad page"), StorageError, "unwritable"),
        (pg.QueryCanceled("statement timeout"), StorageError, "unreachable"),
        (pg.LockNotAvailable("lock timeout"), StorageError, "unreachable"),
        (pg.AdminShutdown("terminating"), StorageError, "unreachable"),
        (psycopg.OperationalError("connection refused"), StorageError, "unreachable"),
        (psycopg_pool.PoolTimeout("no connection in 10 s"), StorageError, "unreachable"),
        (pg.UniqueViolation("duplicate key"), StoreError, None),
        (ValueError("odd"), StoreError, None),
    ]
    for exc, cls, condition in cases:
        error, said = failure("append to session 's1'", "postgresql://h/db", exc)
        assert type(error) is cls and said == condition, (exc, error, said)
        assert str(error).startswith("append to session 's1'")


# -- retries ------------------------------------------------------------------------------


async def test_a_real_deadlock_is_run_again_not_reported(pg_url: str) -> None:
    both_hold_one = threading.Barrier(2, timeout=10)
    attempts: list[str] = []

    def locker(first: int, second: int, name: str) -> Any:
        def job(conn: Any) -> str:
            attempts.append(name)
            conn.execute("SET LOCAL deadlock_timeout = '50ms'")
            conn.execute("SELECT 1 FROM kv WHERE key = %s FOR UPDATE", [str(first)])
            if attempts.count(name) == 1:
                both_hold_one.wait()  # each holds its first row: the second lock deadlocks
            conn.execute("SELECT 1 FROM kv WHERE key = %s FOR UPDATE", [str(second)])
            return name

        return job

    results: list[str] = []

    async def run(store: PostgresStore, first: int, second: int, name: str) -> None:
        results.append(await store.run_raw_for_tests(f"lock {name}", locker(first, second, name)))

    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            for key in ("1", "2"):
                await store.kv_set("t", key, key)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, store, 1, 2, "a")
                nursery.start_soon(run, store, 2, 1, "b")
    assert sorted(results) == ["a", "b"]
    assert len(attempts) == 3  # the deadlock's victim ran twice
