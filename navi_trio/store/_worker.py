"""The store's worker thread: it owns the sqlite connection and runs queued jobs in order.

A `_Job` carries one function to run against the connection and the way its answer gets
back to the caller's trio run (`ThreadAnswer`: its waiting task rescheduled through the
caller's trio token).

Group commit: when several jobs are already queued, the worker runs them in arrival
order inside ONE ``BEGIN IMMEDIATE … COMMIT`` (one fsync under synchronous=FULL), each
job in its own savepoint so an error fails only that job. Every caller is answered only
after the commit that holds its write, so durability is what it was with one commit per
job. Should the batch's BEGIN or COMMIT fail, it is rolled back and its jobs run again
one by one, each in its own transaction as before.

Durability per job: a job marked not `durable` (under ``synchronous=FULL``) runs with
``synchronous=NORMAL``: committed, in the WAL, without the fsync. A batch is fsync'd
when any of its jobs is durable; a later durable commit's fsync flushes the earlier
frames of the log too.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from navi_trio.errors import StoreError
from navi_trio.store._answer import ThreadAnswer
from navi_trio.store._schema import _connect

T = TypeVar("T")
logger = logging.getLogger(__name__)
# How long a write waits for another process's write lock before "database is locked".
# Commits take milliseconds; waiting long is cheap, failing a run mid-save is not.
BUSY_TIMEOUT_S = 30.0
# At most this many queued jobs share one transaction (bounds how long the lock is held).
MAX_BATCH = 64


class _Job(ThreadAnswer, Generic[T]):
    """One unit of work for the worker thread, and the way its answer gets back."""

    def __init__(
        self,
        op: str,
        fn: Callable[[sqlite3.Connection], T],
        stop: bool = False,
        durable: bool = True,
        growth: bool = False,
    ) -> None:
        super().__init__()
        self.op = op
        self.fn = fn
        self.stop = stop
        self.durable = durable
        # Whether to tell a write that needed new pages (`grew`): asked only while a full
        # disk is reported, the one time the answer is used; two queries a job otherwise.
        self.growth = growth
        self.result: T | None = None
        self.error: BaseException | None = None
        self.wrote = False  # it changed rows (and was not rolled back by its own error)
        self.grew = False  # and the database needed more pages for them (found room)

    def run(self, db: sqlite3.Connection | None, connect_error: BaseException | None) -> None:
        try:
            self.execute(db, connect_error)
        finally:
            self.answer()

    def execute(self, db: sqlite3.Connection | None, connect_error: BaseException | None) -> None:
        """Run the function, keeping its result or error; the caller is not told yet."""
        self.result, self.error, self.wrote, self.grew = None, None, False, False
        try:
            if db is None:
                raise connect_error or StoreError("no database connection")
            changes = db.total_changes
            pages = _page_count(db) if self.growth else 0
            self.result = self.fn(db)
            self.wrote = db.total_changes != changes
            self.grew = self.growth and self.wrote and _page_count(db) > pages
        except BaseException as exc:  # noqa: B036 - the thread must answer every job
            self.error = exc


def _page_count(db: sqlite3.Connection) -> int:
    # The pager's own count (no I/O): how the store tells a write that needed room.
    return int(db.execute("PRAGMA page_count").fetchone()[0])


class _Worker:
    """The thread that owns the sqlite connection and runs jobs in arrival order."""

    def __init__(self, path: Path, synchronous: str) -> None:
        self._path = path
        self._synchronous = synchronous
        # Only FULL/EXTRA fsync at each commit: a job that need not be durable skips it.
        self._relaxable = synchronous in ("FULL", "EXTRA")
        self._level = synchronous  # the connection's level now
        self._queue: queue.SimpleQueue[_Job[Any]] = queue.SimpleQueue()
        # Set as `_main` ends: `submit` asks this flag, not the thread (three calls a job).
        self._ended = False
        self.thread = threading.Thread(
            target=self._main, name=f"navi-store:{path.name}", daemon=True
        )

    def submit(self, job: _Job[Any]) -> None:
        if self._ended or self.thread.ident is None:  # ended, or never started
            raise StoreError(f"the store worker for {self._path} is not running")
        self._queue.put(job)

    def _main(self) -> None:
        db: sqlite3.Connection | None = None
        connect_error: BaseException | None = None
        try:
            db = _connect(self._path, self._synchronous, BUSY_TIMEOUT_S)
        except BaseException as exc:  # noqa: B036 - reported to every job instead
            connect_error = exc
        try:
            while True:
                batch = self._take_batch()
                if db is None or len(batch) == 1:
                    if db is not None:
                        self._sync_for(db, batch)
                    for job in batch:
                        job.run(db, connect_error)
                else:
                    self._sync_for(db, batch)
                    _run_batch(db, batch)
                if batch[-1].stop:
                    return
        finally:
            self._ended = True
            if db is not None:
                db.close()

    def _sync_for(self, db: sqlite3.Connection, batch: list[_Job[Any]]) -> None:
        """The connection's ``synchronous`` for `batch`: NORMAL when no job in it needs
        the fsync, else the configured level. Set outside any transaction; should SQLite
        refuse, the level stays as it was (and is tried again before the next batch)."""
        relaxed = self._relaxable and not any(job.durable for job in batch)
        level = "NORMAL" if relaxed else self._synchronous
        if level == self._level or db.in_transaction:
            return
        try:
            db.execute(f"PRAGMA synchronous={level}")
        except sqlite3.Error:
            logger.exception("store: setting synchronous=%s failed", level)
            return
        self._level = level

    def _take_batch(self) -> list[_Job[Any]]:
        """The next job and every job already queued behind it, up to a stop job."""
        # Only this thread takes from the queue: what `empty` says is not empty stays so.
        batch = [self._queue.get()]
        while not batch[-1].stop and len(batch) < MAX_BATCH and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return batch


def _run_batch(conn: sqlite3.Connection, batch: list[_Job[Any]]) -> None:
    """Run `batch` in one transaction, a savepoint per job; answer after the commit."""
    try:
        if conn.in_transaction:  # left open by an earlier job: do not fold into it
            raise sqlite3.OperationalError("a transaction is already open")
        conn.execute("BEGIN IMMEDIATE")
        for job in batch:
            conn.execute("SAVEPOINT navi_job")
            job.execute(conn, None)
            # Jobs never commit themselves (`_write_tx` nests as a savepoint); a transaction
            # gone here was rolled back by an error, so nothing of the batch is on disk.
            if not conn.in_transaction:
                raise sqlite3.OperationalError("a job ended the group transaction")
            if job.error is not None:
                conn.execute("ROLLBACK TO navi_job")
            conn.execute("RELEASE navi_job")
        conn.execute("COMMIT")
    except BaseException:  # noqa: B036 - nothing committed: every job runs again alone
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                logger.exception("store: rolling back a group transaction failed")
        for job in batch:
            job.run(conn, None)
        return
    for job in batch:
        job.answer()
