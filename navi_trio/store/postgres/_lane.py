"""The PostgreSQL store's direct lane: one statement on a connection trio itself drives.

    lane = Lane(conninfo, size=4, where="…")
    async with lane.running():                  # its tasks, until the block ends
        await lane.execute(op, "SELECT navi_append(%s, …)", [sid, …])

Why: a job on a worker thread (`_workers`) cost the daemon some 400 us of CPU on top
of its statement (the queue, Python's GIL given up and taken back by two threads, the
wake-up of trio), most of what an append costs, and a round makes two or three appends.
The lane sends one statement with libpq in non-blocking mode (`psycopg.pq`, the
documented wrapper psycopg itself is built on) and waits for the socket with trio: no
thread at all. Only statements that are a transaction of their own (autocommit) go
here: navi_append (migrations/0005), and the store's other one-statement reads and
writes (kv, a lease's release, who holds a lease), each called once a turn or more.
Rows come back with each column in its text form (the caller casts in the query).

The rules are the workers': a statement handed over is never withdrawn (it runs in the
lane's own task; a caller cancelled stops waiting, the statement still lands, and
closing waits for every one begun); at most `size` connections, opened when needed
(connect in a thread, libpq's connect is blocking) and kept; an idle connection with
something to read (the server ended it) is replaced before use, where the pool's
`check_cheaply` checks such a one for real; the server bounds each statement (`SETUP`'s
time limits) and the lane stops waiting a little later (a server gone silent), the
whole job included; a serialization failure or deadlock runs the statement again,
`ATTEMPTS` in all. A failure is raised as psycopg raises it (`psycopg.errors.
error_from_result`: the same class and SQLSTATE), so `_errors.failure` and the
store's refusals (`_history.refusal`) treat both paths alike.
"""

from __future__ import annotations

import math
import random
import select
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import trio
from psycopg import pq
from psycopg.errors import error_from_result

from navi_trio.store.postgres._errors import RETRIED
from navi_trio.store.postgres._workers import ATTEMPTS, SETUP, STATEMENT_TIMEOUT_S

Row = tuple[bytes | None, ...]
LANE_SIZE = 12  # connections of the lane, per store
ANSWER_GRACE_S = 5.0  # past the server's statement_timeout: the server is gone


def dollar_params(query: str) -> bytes:
    """psycopg's ``%s`` placeholders as libpq's ``$1, $2, …`` (the query has no other %)."""
    parts = query.split("%s")
    out = [parts[0]]
    for i, part in enumerate(parts[1:], 1):
        out.append(f"${i}{part}")
    return "".join(out).encode()


def text_param(value: Any) -> bytes | None:
    """One parameter in PostgreSQL's text form (its type is the function's, inferred):
    None, bool, int, float, str, or a list of str / bool / None as an array literal."""
    if value is None:
        return None
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int | float):
        return repr(value).encode()
    if isinstance(value, str):
        return _utf8(value)
    if isinstance(value, list):
        return _utf8("{" + ",".join(_element(v) for v in value) + "}")
    raise TypeError(f"no text form for a parameter of type {type(value).__name__}")


def _utf8(text: str) -> bytes:
    """`text` for libpq, refused as psycopg refuses it: a text parameter ends at a NUL
    (libpq passes it as a C string), so one with a NUL would arrive cut short."""
    if "\x00" in text:
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise psycopg.DataError(f"text that UTF-8 cannot carry: {exc.reason}") from None


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(f"no array element form for {type(value).__name__}")


class Lane:
    """Up to `size` connections running one statement each (see the module)."""

    def __init__(self, conninfo: str, *, size: int = LANE_SIZE, where: str = "") -> None:
        self._conninfo = conninfo.encode()
        self._where = where
        self._size = size
        self._count = 0  # connections open or being opened
        self._idle: list[pq.abc.PGconn] = []  # last used on top: the fewest connections
        self._free = trio.lowlevel.ParkingLot()  # statements waiting for a connection
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._jobs: set[trio.CancelScope] = set()  # statements begun, shielded
        self._closing = math.inf  # their deadline once the lane closes

    def here(self) -> bool:
        """Whether the caller may use the lane: it runs, and in the caller's trio run."""
        return self._nursery is not None and trio.lowlevel.current_trio_token() is self._token

    @asynccontextmanager
    async def running(self, close_timeout: float = 10.0) -> AsyncIterator[None]:
        """The lane's tasks for the block; at its end, every statement begun finishes
        (within `close_timeout`, even when the block ends cancelled or with an error: each
        runs shielded) and the connections close."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery, self._token = nursery, trio.lowlevel.current_trio_token()
                try:
                    yield
                finally:
                    self._nursery = None  # no new statement; the ones begun run on
                    self._closing = trio.current_time() + close_timeout
                    for scope in self._jobs:
                        scope.deadline = min(scope.deadline, self._closing)
        finally:
            for conn in self._idle:
                conn.finish()
            self._idle.clear()

    async def execute(self, op: str, query: str, params: Sequence[Any]) -> list[Row]:
        """Run `query` (``%s`` placeholders) with `params`: its rows, each column in its
        text form (bytes, or None for NULL); raise what psycopg would."""
        nursery = self._nursery
        if nursery is None:
            raise psycopg.OperationalError(f"{op}: the store's lane is closed")
        values = [text_param(v) for v in params]
        done = trio.Event()
        outcome: list[BaseException | list[Row]] = []
        # Not in the caller's task: a caller cancelled stops waiting, the statement runs on.
        nursery.start_soon(self._job, dollar_params(query), values, done, outcome)
        await done.wait()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    async def _job(
        self, sql: bytes, values: list[bytes | None], done: trio.Event,
        outcome: list[BaseException | list[Row]],
    ) -> None:  # fmt: skip
        limit = STATEMENT_TIMEOUT_S + ANSWER_GRACE_S  # the whole job, connecting included
        deadline = min(trio.current_time() + limit, self._closing)
        with trio.CancelScope(shield=True, deadline=deadline) as scope:
            self._jobs.add(scope)
            try:
                outcome.append(await self._attempts(sql, values))
            except Exception as exc:  # handed to the caller, who raises it
                outcome.append(exc)
            finally:
                self._jobs.discard(scope)
        if not outcome:
            outcome.append(psycopg.OperationalError(
                f"the store closed before {self._where} answered" if self._nursery is None
                else f"the server {self._where} did not answer within {limit:.0f} s"
            ))  # fmt: skip
        done.set()

    async def _attempts(self, sql: bytes, values: list[bytes | None]) -> list[Row]:
        for attempt in range(1, ATTEMPTS + 1):
            conn = await self._take()
            try:
                answer = await self._exchange(conn, sql, values)
            except BaseException:
                self._drop(conn)  # broken, or left mid-statement: never reused
                raise
            self._idle.append(conn)
            self._free.unpark()
            if not isinstance(answer, psycopg.Error):
                return answer
            if not isinstance(answer, RETRIED) or attempt == ATTEMPTS:
                raise answer
            await trio.sleep(random.uniform(0.002, 0.01) * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _take(self) -> pq.abc.PGconn:
        """An idle connection that is still open, a new one, or the next one given back."""
        while True:
            while self._idle:
                conn = self._idle.pop()
                if _still_open(conn):
                    return conn
                self._drop(conn)
            if self._count < self._size:
                self._count += 1
                try:
                    return await self._connect()
                except BaseException:
                    self._count -= 1
                    raise
            await self._free.park()

    def _drop(self, conn: pq.abc.PGconn) -> None:
        conn.finish()
        self._count -= 1
        self._free.unpark()

    async def _connect(self) -> pq.abc.PGconn:
        conn = await trio.to_thread.run_sync(pq.PGconn.connect, self._conninfo)
        if conn.status != pq.ConnStatus.OK:
            said = conn.get_error_message()
            conn.finish()
            raise psycopg.OperationalError(f"connection to {self._where} failed: {said}")
        conn.nonblocking = 1
        try:
            answer = await self._exchange(conn, SETUP.encode(), None)
        except BaseException:
            conn.finish()
            raise
        if isinstance(answer, psycopg.Error):
            conn.finish()
            raise answer
        return conn

    async def _exchange(
        self, conn: pq.abc.PGconn, sql: bytes, values: list[bytes | None] | None
    ) -> psycopg.Error | list[Row]:
        """Send one query and read every result: the server's error if it refused it,
        else the rows of the last. OperationalError when the connection fails midway
        (it is broken then)."""
        try:
            if values is None:
                conn.send_query(sql)
            else:
                conn.send_query_params(sql, values)
            fd = conn.socket
            while conn.flush():
                await trio.lowlevel.wait_writable(fd)
            answer: psycopg.Error | list[Row] = []
            while True:
                while conn.is_busy():
                    await trio.lowlevel.wait_readable(fd)
                    conn.consume_input()
                result = conn.get_result()
                if result is None:
                    return answer
                if isinstance(answer, psycopg.Error):
                    continue  # the first error is the answer; read the rest
                if result.status == pq.ExecStatus.FATAL_ERROR:
                    answer = error_from_result(result)
                elif result.status == pq.ExecStatus.TUPLES_OK:
                    columns = range(result.nfields)
                    answer = [tuple(result.get_value(r, c) for c in columns)
                              for r in range(result.ntuples)]  # fmt: skip
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:  # libpq's: the connection failed (closed, reset)
            raise psycopg.OperationalError(str(exc)) from None
        except OSError as exc:
            raise psycopg.OperationalError(f"the connection to {self._where}: {exc}") from None


def _still_open(conn: pq.abc.PGconn) -> bool:
    """An idle connection the server has sent nothing is as good as after a check. One
    with something to read is not used again: an idle autocommit connection that listens
    to nothing is sent something when the server ends it (an error, then the end of the
    stream: a terminated backend, a server shutting down), or, rarely, a notice; a new
    connection costs less than telling the two apart."""
    if conn.status != pq.ConnStatus.OK:
        return False
    poller = select.poll()
    poller.register(conn.socket, select.POLLIN)
    return not poller.poll(0)
