"""Both session stores behind one face, for the contract suite (tests/test_store_contract*.py).

`backend` is a fixture parametrised over ``sqlite`` (a real file under tmp_path) and
``postgres`` (a fresh database on the session's throwaway server, tests/pg_server.py;
skipped with the reason when there is none). A `Backend` opens its store as often as a
test likes (the same file or database: "after a restart"), and reaches the database
from outside the store, on a connection of its own, the way another process would:
`query`, `execute`, `fail_inserts` (a trigger that makes every insert into a table fail,
for "nothing of a failed operation is stored"), `holding` (a write lock held by that
other connection, so the store's next write to the session waits for it).

The fixtures are registered once for every module in tests/conftest.py; a test module
asks for `backend` by name and imports only the class for its annotation::

    from store_backends import Backend
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from navi_trio.store.methods import SessionStore
from navi_trio.store.sqlite import SQLiteStore

TIMEOUT = 20
HERE = Path(__file__).resolve().parent


class Backend:
    """One store's database: open its store, and touch it from another connection."""

    name = "?"

    def __init__(self, target: str) -> None:
        self.target = target  # a file path or a postgresql:// URL

    def open(self) -> AbstractAsyncContextManager[SessionStore]:
        raise NotImplementedError

    def _connect(self) -> Any:
        raise NotImplementedError

    def _sql(self, sql: str) -> str:
        return sql

    async def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of one statement (``%s`` placeholders) on a connection of its own."""

        def run() -> list[tuple[Any, ...]]:
            conn = self._connect()
            try:
                return [tuple(r) for r in conn.execute(self._sql(sql), params).fetchall()]
            finally:
                conn.close()

        return await trio.to_thread.run_sync(run)

    async def execute(self, *statements: str) -> None:
        def run() -> None:
            conn = self._connect()
            try:
                for sql in statements:
                    conn.execute(sql)
                conn.commit()
            finally:
                conn.close()

        await trio.to_thread.run_sync(run)

    async def fail_inserts(self, table: str, message: str) -> None:
        raise NotImplementedError

    async def allow_inserts(self, table: str) -> None:
        await self.execute(f"DROP TRIGGER navi_fail_{table} ON {table}")

    def _lock_sql(self, sid: str) -> list[str]:
        raise NotImplementedError

    @asynccontextmanager
    async def holding(self, sid: str) -> AsyncIterator[None]:
        """Another connection holds the write lock a write to `sid` needs, until the end."""
        conn = await trio.to_thread.run_sync(self._connect)
        try:

            def lock() -> None:
                for sql in self._lock_sql(sid):
                    conn.execute(sql, (sid,) if "%s" in sql or "?" in sql else ())

            await trio.to_thread.run_sync(lock)
            yield
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(conn.commit)
                await trio.to_thread.run_sync(conn.close)

    async def run_child(self, *args: str) -> trio.Process:
        """tests/store_contract_child.py on this store, its stdout a pipe."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p
        )
        return await trio.lowlevel.open_process(
            [sys.executable, str(HERE / "store_contract_child.py"), self.target, *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip


class SqliteBackend(Backend):
    name = "sqlite"

    def open(self) -> AbstractAsyncContextManager[SessionStore]:
        return SQLiteStore.open(self.target)

    def _connect(self) -> Any:
        return sqlite3.connect(self.target, timeout=TIMEOUT, check_same_thread=False)

    def _sql(self, sql: str) -> str:
        return sql.replace("%s", "?")

    async def fail_inserts(self, table: str, message: str) -> None:
        await self.execute(
            f"CREATE TRIGGER navi_fail_{table} BEFORE INSERT ON {table}"
            f" BEGIN SELECT RAISE(ABORT, '{message}'); END"
        )

    async def allow_inserts(self, table: str) -> None:
        await self.execute(f"DROP TRIGGER navi_fail_{table}")

    def _lock_sql(self, sid: str) -> list[str]:
        return ["BEGIN IMMEDIATE"]  # the whole file's write lock


class PostgresBackend(Backend):
    name = "postgres"

    def open(self) -> AbstractAsyncContextManager[SessionStore]:
        from navi_trio.store.postgres import PostgresStore

        return PostgresStore.open(self.target)

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.target, connect_timeout=TIMEOUT)

    async def fail_inserts(self, table: str, message: str) -> None:
        await self.execute(
            f"CREATE FUNCTION navi_fail_{table}() RETURNS trigger LANGUAGE plpgsql"
            f" AS $$ BEGIN RAISE EXCEPTION '{message}'; END $$",
            f"CREATE TRIGGER navi_fail_{table} BEFORE INSERT ON {table}"
            f" FOR EACH ROW EXECUTE FUNCTION navi_fail_{table}()",
        )

    async def allow_inserts(self, table: str) -> None:
        await self.execute(
            f"DROP TRIGGER navi_fail_{table} ON {table}", f"DROP FUNCTION navi_fail_{table}"
        )

    def _lock_sql(self, sid: str) -> list[str]:
        return ["SELECT 1 FROM sessions WHERE id = %s FOR UPDATE"]  # the session's row


# The PostgreSQL half starts a server (once a session): slow, as every process start is.
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return SqliteBackend(str(tmp_path / "navi.db"))
    pytest.importorskip("psycopg", reason="psycopg is not installed (the extra `postgres`)")
    return PostgresBackend(request.getfixturevalue("pg_url"))
