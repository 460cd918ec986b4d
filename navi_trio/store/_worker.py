"""The store's worker thread: it owns the sqlite connection and runs queued jobs in order.

A `_Job` carries one function to run against the connection and the way its answer gets
back to the caller's trio run (an event set through the caller's trio token).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import trio
from sqlite_utils import Database

from navi_trio.errors import StoreError
from navi_trio.store._schema import _connect

T = TypeVar("T")
# How long a write waits for another process's write lock before "database is locked".
# Commits take milliseconds; waiting long is cheap, failing a run mid-save is not.
BUSY_TIMEOUT_S = 30.0


class _Job(Generic[T]):
    """One unit of work for the worker thread, and the way its answer gets back."""

    def __init__(self, op: str, fn: Callable[[Database], T], stop: bool = False) -> None:
        self.op = op
        self.fn = fn
        self.stop = stop
        self.token = trio.lowlevel.current_trio_token()
        self.done = trio.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    def run(self, db: Database | None, connect_error: BaseException | None) -> None:
        try:
            if db is None:
                raise connect_error or StoreError("no database connection")
            self.result = self.fn(db)
        except BaseException as exc:  # noqa: B036 - the thread must answer every job
            self.error = exc
        finally:
            try:
                self.token.run_sync_soon(self.done.set)
            except trio.RunFinishedError:
                pass  # the caller's trio run is gone; nobody is waiting


class _Worker:
    """The thread that owns the sqlite connection and runs jobs in arrival order."""

    def __init__(self, path: Path, synchronous: str) -> None:
        self._path = path
        self._synchronous = synchronous
        self._queue: queue.SimpleQueue[_Job[Any]] = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=self._main, name=f"navi-store:{path.name}", daemon=True
        )

    def submit(self, job: _Job[Any]) -> None:
        if not self.thread.is_alive():
            raise StoreError(f"the store worker for {self._path} is not running")
        self._queue.put(job)

    def _main(self) -> None:
        db: Database | None = None
        connect_error: BaseException | None = None
        try:
            db = _connect(self._path, self._synchronous, BUSY_TIMEOUT_S)
        except BaseException as exc:  # noqa: B036 - reported to every job instead
            connect_error = exc
        try:
            while True:
                job = self._queue.get()
                job.run(db, connect_error)
                if job.stop:
                    return
        finally:
            if db is not None:
                db.close()
