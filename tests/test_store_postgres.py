"""What only the PostgreSQL store has: migrations, a server that fails, retries, the factory.

The contract both stores keep is in tests/test_store_contract*.py. Here, on the session's
throwaway server (tests/pg_server.py; skipped, saying why, where none can start):

- the schema's migrations run once per database under an advisory lock, a second daemon
  waits for them, a newer schema is refused;
- the server's failures come back as the store's error classes and wire codes: nobody
  listening, a read-only database, a real full disk (a tablespace on a small tmpfs), a
  connection cut under the pool; each condition is one log line until it ends;
- a real deadlock between two transactions is run again, not reported;
- `NAVI_DB=postgresql://…` selects the store, and psycopg stays out of a SQLite start-up.

Rules: real server, real connections, no sleeps; every test under an absolute timeout.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import secrets
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from pg_server import pg_server as pg_server
from pg_server import pg_url as pg_url
from test_startup_imports import imported_by

from navi_trio.errors import ConfigError, StorageError, StorageFullError, StoreError
from navi_trio.settings import Settings
from navi_trio.store.factory import open_store, store_kind, store_report
from navi_trio.store.postgres import PostgresStore
from navi_trio.store.postgres._errors import failure
from navi_trio.store.postgres._migrate import LOCK_KEY, SCHEMA_VERSION, migrate, migrations
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing.postgres import PgServer

TIMEOUT = 30


def sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement.encode(), params)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


def cut_connections(url: str) -> None:
    """Terminate every other connection to `url`'s database (a server restart, for them)."""
    sql(url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
             " WHERE datname = current_database() AND pid <> pg_backend_pid()")  # fmt: skip


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# -- migrations -------------------------------------------------------------------------


async def test_migrations_are_applied_once_and_recorded(pg_url: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="p")
        async with PostgresStore.open(pg_url) as store:  # applies nothing the second time
            assert await store.get_session("s1") is not None
    rows = await trio.to_thread.run_sync(sql, pg_url, "SELECT version, name FROM schema_migrations")
    assert rows == [(m.version, m.name) for m in migrations()] == [(1, "init")]
    assert SCHEMA_VERSION == 1


async def test_daemons_starting_together_apply_each_migration_once(pg_url: str) -> None:
    opened: list[int] = []

    async def daemon() -> None:
        async with PostgresStore.open(pg_url) as store:
            opened.append(len(await store.list_sessions()))

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(daemon)
    assert opened == [0, 0, 0, 0]
    rows = await trio.to_thread.run_sync(sql, pg_url, "SELECT version FROM schema_migrations")
    assert rows == [(1,)]


async def test_a_second_daemon_waits_for_the_migration_lock_then_finds_it_applied(
    pg_url: str,
) -> None:
    opened = trio.Event()
    with trio.fail_after(TIMEOUT), psycopg.connect(pg_url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])  # "another daemon migrates"

        async def second() -> None:
            async with PostgresStore.open(pg_url) as store:
                opened.set()
                assert await store.stats() == dict.fromkeys(
                    ["sessions", "messages", "context", "kv", "users"], 0
                )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await wait_for_lock_waiter(pg_url)
            assert not opened.is_set()

            # The other daemon's migration: the schema, recorded with a date of its own.
            def migrate_there() -> None:
                with other.transaction():
                    other.execute(migrations()[0].sql.encode())
                    other.execute(
                        "CREATE TABLE schema_migrations (version integer PRIMARY KEY,"
                        " name text NOT NULL, applied_at timestamptz NOT NULL)"
                    )
                    other.execute("INSERT INTO schema_migrations VALUES (1, 'init', '2001-01-01')")
                other.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])  # fmt: skip

            await trio.to_thread.run_sync(migrate_there)
        assert opened.is_set()
    rows = await trio.to_thread.run_sync(
        sql, pg_url, "SELECT version, extract(year FROM applied_at) FROM schema_migrations"
    )
    assert rows == [(1, 2001)]  # applied once, by the other daemon


async def wait_for_lock_waiter(url: str) -> None:
    """Until a connection waits for the migration lock (bounded by the caller's timeout)."""
    query = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
             " AND objid = %s")  # fmt: skip
    while (await trio.to_thread.run_sync(sql, url, query, (LOCK_KEY,)))[0][0] == 0:
        pass  # one round trip per look, no sleep


async def test_a_database_of_a_newer_navi_is_refused(pg_url: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url):
            pass
        await trio.to_thread.run_sync(
            sql, pg_url, "INSERT INTO schema_migrations (version, name) VALUES (7, 'future')"
        )
        with pytest.raises(StoreError, match="schema version 7; this navi knows 1"):
            async with PostgresStore.open(pg_url):
                pass


# -- a server that fails ------------------------------------------------------------------


async def test_nobody_listening_is_a_storage_error_naming_the_server_not_the_password(
    socket_closed: Any,
) -> None:
    with socket_closed() as port:
        url = f"postgresql://navi:hunter2@127.0.0.1:{port}/nothing"
        with trio.fail_after(TIMEOUT), pytest.raises(StorageError) as refused:
            async with PostgresStore.open(url):
                pass
    said = str(refused.value)
    assert refused.value.code == "storage"
    assert f"open store postgresql://navi@127.0.0.1:{port}/nothing: cannot reach" in said
    assert "hunter2" not in said


@contextlib.contextmanager
def socket_closed_port() -> Iterator[int]:
    """A loopback port nobody listens on (bound, not listening: connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


@pytest.fixture
def socket_closed() -> Any:
    return socket_closed_port


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
        seen.append(await store._run("backend pid", lambda c: c.info.backend_pid))

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
        results.append(await store._run(f"lock {name}", locker(first, second, name)))

    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            for key in ("1", "2"):
                await store.kv_set("t", key, key)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, store, 1, 2, "a")
                nursery.start_soon(run, store, 2, 1, "b")
    assert sorted(results) == ["a", "b"]
    assert len(attempts) == 3  # the deadlock's victim ran twice


# -- the factory and start-up -------------------------------------------------------------


async def test_navi_db_with_a_url_selects_postgres_and_a_path_sqlite(
    pg_url: str, tmp_path: Path
) -> None:
    on_server = Settings.from_env({"NAVI_DB": pg_url})
    assert on_server.db_url == pg_url and on_server.db_path == Settings().db_path
    assert store_kind(on_server) == "postgresql"
    postgres_url = "postgres://" + pg_url.split("://", 1)[1]
    assert store_kind(Settings.from_env({"NAVI_DB": postgres_url})) == "postgresql"
    on_file = Settings.from_env({"NAVI_DB": str(tmp_path / "n.db")})
    assert (on_file.db_url, on_file.db_path, store_kind(on_file)) == (
        "",
        tmp_path / "n.db",
        "sqlite",
    )
    with trio.fail_after(TIMEOUT):
        async with open_store(Settings.from_env({"NAVI_DB": postgres_url})) as store:
            assert isinstance(store, PostgresStore)
        async with open_store(on_file) as store:
            assert isinstance(store, SQLiteStore) and store.path == tmp_path / "n.db"
    # Given a file (`--db`), the file wins over a server in the environment.
    chosen = Settings.from_env({"NAVI_DB": pg_url}, db_path=tmp_path / "n.db")
    assert (chosen.db_url, store_kind(chosen)) == ("", "sqlite")
    with pytest.raises(ConfigError, match="postgresql://"):
        store_kind(Settings(db_url="mysql://h/db"))


def test_psycopg_stays_out_of_a_start_up_on_a_file(tmp_path: Path) -> None:
    statement = "import navi_trio.cli, navi_trio.cli_run, navi_trio.runtime, navi_trio.doctor"
    assert imported_by(statement, ("psycopg", "psycopg_pool")) == []
    db = str(tmp_path / "n.db")
    opens_a_file = (
        "import trio\nfrom navi_trio.settings import Settings\n"
        "from navi_trio.store.factory import open_store\n"
        "async def main():\n"
        f"    async with open_store(Settings.from_env({{'NAVI_DB': {db!r}}})):\n"
        "        pass\n"
        "trio.run(main)"
    )
    assert imported_by(opens_a_file, ("psycopg", "psycopg_pool")) == []


async def test_the_doctor_report_says_which_server_and_whether_it_answers(
    pg_url: str, socket_closed: Any
) -> None:
    with trio.fail_after(TIMEOUT):
        fresh = await store_report(Settings(db_url=pg_url))
        assert (fresh["ok"], fresh["existed"], fresh["tables"]) == (True, False, None)
        assert fresh["path"].startswith(f"{pg_url} (PostgreSQL 1")
        # Read-only: looking created nothing.
        assert await trio.to_thread.run_sync(
            sql, pg_url, "SELECT to_regclass('schema_migrations') IS NULL"
        ) == [(True,)]
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="p")
        used = await store_report(Settings(db_url=pg_url))
        assert (used["ok"], used["existed"], used["schema"]) == (
            True, True, {"applied": [1], "known": 1}
        )  # fmt: skip
        assert used["tables"]["sessions"] == 1
        errors: list[str] = []
        with socket_closed() as port:
            down_url = f"postgresql://u:pw@127.0.0.1:{port}/x"
            down = await store_report(Settings(db_url=down_url), errors)
        assert down["ok"] is False and "does not answer" in down["error"]
        assert errors == [down["error"]] and "pw" not in down["error"]
        assert down["path"] == f"postgresql://u@127.0.0.1:{port}/x"


async def test_navi_doctor_names_the_server_and_never_its_password(
    pg_server: PgServer, pg_url: str, tmp_path: Path
) -> None:
    import json
    import os
    import sys

    secret_url = pg_url.replace("navi@", "navi:not-needed-secret@")  # trust: ignored
    env = {**os.environ, "NAVI_DB": secret_url, "XDG_DATA_HOME": str(tmp_path)}
    with socket_closed_port() as port:
        argv = [
            sys.executable,
            "-m",
            "navi_trio",
            "doctor",
            "--llm-url",
            f"http://127.0.0.1:{port}",
        ]
        with trio.fail_after(TIMEOUT):
            async with PostgresStore.open(pg_url):
                pass
            text = await trio.run_process(argv, env=env, capture_stdout=True, capture_stderr=True)
            as_json = await trio.run_process(
                [*argv, "--json"], env=env, capture_stdout=True, capture_stderr=True
            )
    out = text.stdout.decode()
    assert f"{pg_url} (PostgreSQL 1" in out and "(exists)" in out, out
    assert "rows: context=0, kv=0, messages=0, sessions=0, users=0" in out
    report = json.loads(as_json.stdout)
    assert report["db"]["ok"] is True and report["settings"]["db_url"] == pg_url
    for said in (out, as_json.stdout.decode(), text.stderr.decode()):
        assert "not-needed-secret" not in said
