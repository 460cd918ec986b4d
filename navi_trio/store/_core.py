"""The body of the SQLite store that every table's methods run on.

`_Core` owns the worker thread (`_worker`): `open` starts it, creates the schema and
runs the start-up check; `_run(op, fn)` queues one job and waits for its answer,
mapping what SQLite raised to the caller's `StoreError` (`_health.failure`) and logging
each storage condition once (`_report`). `run_raw_for_tests` is the one public way to
`_run`, for tests and diagnostics.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Self, TypeVar

import trio

from navi_trio.errors import StorageError, StorageFullError, StoreError
from navi_trio.store._health import (
    _DAMAGED,
    QUICK_CHECK_SEC,
    check_summary,
    failure,
    primary_code,
    quick_check,
)
from navi_trio.store._schema import _TABLES, _init_schema
from navi_trio.store._worker import _Job, _Worker
from navi_trio.store.methods import SessionStore

logger = logging.getLogger("navi_trio.store.sqlite")

T = TypeVar("T")
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class _Core(SessionStore):
    """The worker, open and close and `_run` (see the module docstring)."""

    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        if synchronous.upper() not in _SYNCHRONOUS:
            raise StoreError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        self._synchronous = synchronous.upper()
        self._worker: _Worker | None = None
        self._closed = False
        # Storage failures already logged ("full", "unwritable", "damaged <op>"): one
        # line when a condition starts, not one per request, until it ends (`_run`).
        self._reported: set[str] = set()
        # What PRAGMA quick_check found at open: [] none, None not finished in time.
        self.damage: list[str] | None = []

    @classmethod
    def open(
        cls, path: Path | str, *, synchronous: str = "FULL", close_timeout: float = 10.0
    ) -> AbstractAsyncContextManager[Self]:
        """Open (creating the parent folders, WAL and schema) and close on exit.

        At exit, queued jobs are drained and the connection closed, shielded from
        cancellation and bounded by `close_timeout` seconds of real time (a thread join,
        so a test's virtual clock cannot cut it short).
        """
        return cls._open(Path(path), synchronous, close_timeout)

    @classmethod
    @asynccontextmanager
    async def _open(cls, path: Path, synchronous: str, close_timeout: float) -> AsyncIterator[Self]:
        store = cls(path, synchronous=synchronous)
        worker = _Worker(store.path, store._synchronous)
        worker.thread.start()
        store._worker = worker
        try:
            await store._run(f"open store {path}", _init_schema)
            await store._check()
            yield store
        finally:
            with trio.CancelScope(shield=True):
                await store._close(close_timeout)

    async def _close(self, join_seconds: float) -> None:
        worker = self._worker
        if worker is None or self._closed:
            return
        self._closed = True
        if worker.thread.is_alive():
            worker.submit(_Job("close", lambda db: None, stop=True))
        await trio.to_thread.run_sync(worker.thread.join, join_seconds)
        if worker.thread.is_alive():
            logger.warning(
                "store %s: worker still busy %.1f s after close; queued writes may be lost",
                self.path,
                join_seconds,
            )

    async def _check(self) -> None:
        """PRAGMA quick_check, bounded in time; a damaged file is one line in the log."""
        try:
            self.damage = await self._run(
                f"check {self.path}", lambda db: quick_check(db, QUICK_CHECK_SEC)
            )
        except StoreError as exc:
            logger.error("store %s: the start-up check failed: %s", self.path, exc)
            return
        said = check_summary(self.path, self.damage, QUICK_CHECK_SEC)
        if said is not None:
            (logger.warning if self.damage is None else logger.error)("store: %s", said)

    async def _run(
        self,
        op: str,
        fn: Callable[[sqlite3.Connection], T],
        *,
        durable: bool = True,
        write: bool = True,
        transaction: bool = True,
    ) -> T:
        # Every job is one transaction on the one worker; `write` says nothing here.
        if self._worker is None:
            raise StoreError(
                f"{op}: the store at {self.path} is not open (use `async with"
                " SQLiteStore.open(path) as store`)"
            )
        if self._closed:
            raise StoreError(f"{op}: the store at {self.path} is closed")
        job: _Job[T] = _Job(op, fn, durable=durable, growth="full" in self._reported)
        started = trio.current_time() if self._on_write is not None else 0.0
        self._worker.submit(job)
        # Cancelled here? The job stays queued and still runs; only its answer is dropped.
        await job.wait()
        if write and job.error is None:
            self._wrote(started)
        if job.error is not None:
            if isinstance(job.error, StoreError):
                raise job.error
            error = failure(op, self.path, job.error)
            if isinstance(error, StorageError):
                self._report(op, job.error, error)
            raise error from job.error
        # Back to normal: a write went through (unwritable), one that needed new room in
        # the file did (full; small writes may still fit while big ones do not).
        back = {"unwritable"} if job.wrote else set()
        back |= {"full"} if job.grew else set()
        if back & self._reported:
            logger.warning("store %s: writes succeed again", self.path)
            self._reported -= back
        return job.result  # type: ignore[return-value]  # set when error is None

    def _report(self, op: str, cause: BaseException, error: StorageError) -> None:
        """Log a storage failure once per condition (each request still gets its error)."""
        if isinstance(error, StorageFullError):
            key = "full"
        elif primary_code(cause) in _DAMAGED:
            key = f"damaged {op}"
        else:
            key = "unwritable"
        if key in self._reported:
            return
        self._reported.add(key)
        if key == "full":
            logger.error(
                "store %s: the disk is full (%s): every write fails with storage_full until "
                "space is freed (first: %s); reads go on",
                self.path,
                cause,
                op,
            )
        else:
            logger.error("store: %s", error)

    async def stats(self) -> dict[str, int]:
        """Row count per table."""
        return await self._run("stats", _stats)


def _stats(db: sqlite3.Connection) -> dict[str, int]:
    return {t: int(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in _TABLES}
