"""The PostgreSQL store's worker threads: each takes a connection from the pool per job.

A `Job` carries one function to run against a connection, inside one transaction, and
the way its answer gets back to the caller's trio run (`ThreadAnswer`: its waiting task
rescheduled through the caller's trio token), as the SQLite store's worker does.

Why a fixed set of threads with a queue, rather than `trio.to_thread.run_sync` per call:
a job handed over is never withdrawn. A caller cancelled while its job waits for a
thread or a connection stops waiting, and the job still runs (the agent's shielded
clean-up relies on a save it started landing), and closing the store drains every
queued job first. The threads are as many as the pool's connections, so no thread ever
waits for a connection that another thread of ours is not about to give back; trio
never blocks on the network, and every wait is bounded: a connection within
`POOL_WAIT_S`, a statement within `STATEMENT_TIMEOUT_S`, a lock within `LOCK_TIMEOUT_S`.

A transaction that PostgreSQL aborts as a serialization failure or a deadlock is run
again, up to `ATTEMPTS` times in all, after a short random pause.
"""

from __future__ import annotations

import logging
import queue
import random
import select
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import psycopg
import psycopg_pool

from navi_trio.errors import StoreError
from navi_trio.store._answer import ThreadAnswer
from navi_trio.store.postgres._errors import RETRIED

T = TypeVar("T")
Conn = psycopg.Connection[tuple[Any, ...]]
Pool = psycopg_pool.ConnectionPool[Conn]
logger = logging.getLogger(__name__)

POOL_WAIT_S = 10.0  # a job waits this long for a connection before "cannot reach"
STATEMENT_TIMEOUT_S = 30.0  # one statement, on the server
LOCK_TIMEOUT_S = 30.0  # one lock (a row another daemon holds, the migration lock)
# Our transactions never wait between statements: one idle this long belongs to a daemon
# that was paused (SIGSTOP, a VM freeze) mid-write, and its row locks would block the
# daemon taking its sessions over; the server ends it (the paused write then fails).
IDLE_IN_TRANSACTION_S = 5.0
ATTEMPTS = 4  # runs of a transaction aborted as a serialization failure or deadlock


def configure(conn: Conn) -> None:
    """Every new connection of the pool: the store's time limits, on the server."""
    conn.execute(
        f"SET statement_timeout = {int(STATEMENT_TIMEOUT_S * 1000)};"
        f" SET lock_timeout = {int(LOCK_TIMEOUT_S * 1000)};"
        f" SET idle_in_transaction_session_timeout = {int(IDLE_IN_TRANSACTION_S * 1000)}"
    )


def check_cheaply(conn: Conn) -> None:
    """The pool's check of a connection it hands out, without a round trip: the server
    sends an idle connection nothing unless it is ending it (an error, then the end of
    the stream: a terminated backend, a server shut down, the idle timeout), so one
    with something to read is checked for real (`check_connection`, which raises when it
    is broken: the pool then drops it and hands out another). One that breaks after
    this is the same risk as one that breaks just after a real check."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    if poller.poll(0):
        psycopg_pool.ConnectionPool.check_connection(conn)


class Job(ThreadAnswer, Generic[T]):
    """One unit of work for a worker thread, and the way its answer gets back.

    `transaction=False` runs `fn` on the connection as it comes (autocommit): for the
    migrations, which manage their own transactions under a session-level lock.
    An append is one too (its one statement is its transaction: no BEGIN, SET and COMMIT
    round trips, see migrations/0005_append.sql)."""

    def __init__(
        self,
        op: str,
        fn: Callable[[Conn], T],
        *,
        durable: bool = True,
        transaction: bool = True,
        stop: bool = False,
    ) -> None:
        super().__init__()
        self.op = op
        self.fn = fn
        self.durable = durable
        self.transaction = transaction
        self.stop = stop
        self.result: T | None = None
        self.error: BaseException | None = None

    def run(self, pool: Pool) -> None:
        try:
            self.result = self._attempts(pool)
        except BaseException as exc:  # noqa: B036 - the thread must answer every job
            self.error = exc
        finally:
            self.answer()

    def _attempts(self, pool: Pool) -> T:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return self._once(pool)
            except RETRIED as exc:
                if attempt == ATTEMPTS:
                    raise
                logger.debug("store: %s: %s; running it again", self.op, exc)
                time.sleep(random.uniform(0.002, 0.01) * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _once(self, pool: Pool) -> T:
        with pool.connection(timeout=POOL_WAIT_S) as conn:
            if not self.transaction:
                return self.fn(conn)
            with conn.transaction():
                if not self.durable:
                    # Committed without waiting for the WAL flush: it survives a killed
                    # daemon at once; a server crash in the next ~0.2 s could lose it,
                    # and the next durable commit flushes it too.
                    conn.execute("SET LOCAL synchronous_commit TO OFF")
                return self.fn(conn)


class Workers:
    """`count` threads running queued jobs in arrival order, each on a pooled connection."""

    def __init__(self, pool: Pool, count: int, name: str) -> None:
        self._pool = pool
        self._queue: queue.SimpleQueue[Job[Any]] = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._main, name=f"navi-store:{name}:{i}", daemon=True)
            for i in range(count)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def submit(self, job: Job[Any]) -> None:
        if not any(t.is_alive() for t in self.threads):
            raise StoreError(f"{job.op}: the store's worker threads are not running")
        self._queue.put(job)

    def stop(self) -> None:
        """Let every thread finish the jobs queued before this call, then end."""
        for _ in self.threads:
            self._queue.put(Job("stop", lambda conn: None, stop=True))

    def join(self, seconds: float) -> bool:
        """Wait (blocking) up to `seconds` in all; whether every thread has ended."""
        deadline = time.monotonic() + seconds
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def _main(self) -> None:
        while True:
            job = self._queue.get()
            if job.stop:
                job.answer()
                return
            job.run(self._pool)
