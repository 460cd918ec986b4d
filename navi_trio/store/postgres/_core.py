"""The body of the PostgreSQL store that every group of methods runs on.

`_Core` owns the psycopg_pool pool and its worker threads (`_workers`): `open` connects
(within `OPEN_WAIT_S`) and applies the migrations (`_migrate`); `_run(op, fn)` queues
one job and waits for its answer, mapping what psycopg raised to the caller's
`StoreError` (`_errors.failure`) and logging each storage condition once (`_report`);
`bus` is the LISTEN / NOTIFY of this database (`_bus`). `run_raw_for_tests` is the one
public way to `_run`, for tests and diagnostics.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Self, TypeVar

import psycopg
import psycopg_pool
import trio
from psycopg.conninfo import conninfo_to_dict

from navi_trio.errors import StorageError, StoreError
from navi_trio.store.db_url import describe
from navi_trio.store.fence import Fence
from navi_trio.store.methods import SessionStore
from navi_trio.store.postgres import _tables as t
from navi_trio.store.postgres._bus import PgBus
from navi_trio.store.postgres._errors import failure
from navi_trio.store.postgres._migrate import migrate
from navi_trio.store.postgres._workers import (
    POOL_WAIT_S,
    Conn,
    Job,
    Workers,
    check_cheaply,
    configure,
)

logger = logging.getLogger("navi_trio.store.postgres.store")
T = TypeVar("T")
POOL_SIZE = 8  # connections (and worker threads) per store
OPEN_WAIT_S = 10.0  # opening waits this long for the first connection
CONNECT_TIMEOUT_S = 10  # libpq's connect_timeout, unless the URL sets one


def check_url(url: str) -> str:
    """`url` when libpq can use it; StoreError naming the problem (never the password)."""
    try:
        conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise StoreError(f"{describe(url)} is not a usable PostgreSQL URL ({exc})") from None
    return url


class _Core(SessionStore):
    """The pool, its workers, open and close and `_run` (see the module)."""

    def __init__(self, url: str, *, pool_size: int = POOL_SIZE) -> None:
        self.where = describe(url)  # never the password
        self._url = check_url(url)
        if pool_size < 1:
            raise StoreError(f"pool_size must be 1 or more, got {pool_size!r}")
        self._pool_size = pool_size
        self._workers: Workers | None = None
        self._closed = False
        # Conditions already logged ("full", "unwritable", "unreachable"): one line when
        # one starts, one when a call succeeds again (`_run`).
        self._reported: set[str] = set()

    @classmethod
    def open(
        cls, url: str, *, pool_size: int = POOL_SIZE, close_timeout: float = 10.0
    ) -> AbstractAsyncContextManager[Self]:
        """Connect, migrate the schema, and close on exit (see the module's docstring)."""
        return cls._open(url, pool_size, close_timeout)

    @classmethod
    @asynccontextmanager
    async def _open(cls, url: str, pool_size: int, close_timeout: float) -> AsyncIterator[Self]:
        store = cls(url, pool_size=pool_size)
        pool = store._make_pool()
        try:
            try:
                await trio.to_thread.run_sync(
                    functools.partial(pool.open, wait=True, timeout=OPEN_WAIT_S)
                )
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                raise failure(f"open store {store.where}", store.where, exc)[0] from exc
            workers = Workers(pool, pool_size, store.where)
            workers.start()
            store._workers = workers
            try:
                migrated = await store._run(
                    f"migrate the schema of {store.where}",
                    lambda conn: migrate(conn, store.where),
                    transaction=False,
                )
                if migrated:
                    logger.info("store %s: applied migration(s) %s", store.where, migrated)
                yield store
            finally:
                with trio.CancelScope(shield=True):
                    await store._stop(close_timeout)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(pool.close, close_timeout)

    def _make_pool(self) -> psycopg_pool.ConnectionPool[Conn]:
        given = conninfo_to_dict(self._url)
        kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in given:
            kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
        if "application_name" not in given:
            kwargs["application_name"] = f"navi {os.getpid()}"  # which daemon, for its ops
        return psycopg_pool.ConnectionPool(
            self._url,
            min_size=1,
            max_size=self._pool_size,
            open=False,
            kwargs=kwargs,
            configure=configure,
            check=check_cheaply,
            timeout=POOL_WAIT_S,
            name=f"navi {self.where}",
        )

    async def _stop(self, seconds: float) -> None:
        workers = self._workers
        if workers is None or self._closed:
            return
        self._closed = True
        workers.stop()
        if not await trio.to_thread.run_sync(workers.join, seconds):
            logger.warning(
                "store %s: workers still busy %.1f s after close; queued writes may be lost",
                self.where,
                seconds,
            )

    async def _run(
        self,
        op: str,
        fn: Callable[[Conn], T],
        *,
        durable: bool = True,
        write: bool = True,
        transaction: bool = True,
    ) -> T:
        if self._workers is None:
            raise StoreError(
                f"{op}: the store at {self.where} is not open (use `async with"
                " PostgresStore.open(url) as store`)"
            )
        if self._closed:
            raise StoreError(f"{op}: the store at {self.where} is closed")
        job: Job[T] = Job(op, fn, durable=durable, transaction=transaction)
        started = trio.current_time()
        self._workers.submit(job)
        # Cancelled here? The job stays queued and still runs; only its answer is dropped.
        await job.wait()
        if write and job.error is None:
            self._wrote(started)
        if job.error is not None:
            error, said = failure(op, self.where, job.error)
            if said is not None:
                self._report(said, error)
            if error is job.error:
                raise error
            raise error from job.error
        # Back to normal: any answer ends "unreachable"; a write ends "full" / "unwritable".
        back = self._reported if write else self._reported & {"unreachable"}
        if back:
            logger.warning(
                "store %s: %s again",
                self.where,
                "writes succeed" if write else "the database answers",
            )
            self._reported -= back
        return job.result  # type: ignore[return-value]  # set when error is None

    def _fenced(self, fence: Fence | None, fn: Callable[[Conn], T]) -> Callable[[Conn], T]:
        return t.fenced(fence, fn)

    def _report(self, said: str, error: StorageError | StoreError) -> None:
        """Log a storage failure once per condition (each request still gets its error)."""
        if said in self._reported:
            return
        self._reported.add(said)
        logger.error("store: %s (logged once until the database answers again)", error)

    def bus(self) -> PgBus:
        """LISTEN / NOTIFY between the daemons of this database (core/cluster/cluster.py)."""
        return PgBus(self, self._url)

    async def stats(self) -> dict[str, int]:
        """Row count per table."""
        return await self._run("stats", t.stats, write=False)
