"""PostgreSQL's failures as the store's errors, and the one log line per condition.

`failure(op, where, exc)` turns what a job raised into the StoreError its caller sees,
with the classes and wire codes of the SQLite store (store/_health.py):

- disk_full (SQLSTATE 53100): the server's disk is full -> `StorageFullError`
  (``storage_full``); nothing of the operation was stored;
- read_only_sql_transaction (25006, a standby or ``default_transaction_read_only``),
  insufficient_privilege (42501), class 58 (I/O errors on the server) -> `StorageError`
  (``storage``): the database cannot be written or read;
- data_corrupted / index_corrupted (XX001, XX002) -> `StorageError` saying so;
- a statement or a lock wait over its time limit (57014, 55P03) -> `StorageError` saying
  the database did not answer in time;
- no connection (refused, dropped, the pool gave none in time), the server shutting
  down -> `StorageError` naming the server;
- anything else (a constraint, a bad argument) stays a plain StoreError.

Serialization failures and deadlocks are not errors here: the worker runs the job
again (`RETRIED`), and only one that keeps failing reaches `failure`.
"""

from __future__ import annotations

import psycopg
import psycopg.errors as pg
import psycopg_pool

from navi_trio.errors import StorageError, StorageFullError, StoreError

# Failures after which the same transaction, run again, usually succeeds.
RETRIED: tuple[type[BaseException], ...] = (pg.SerializationFailure, pg.DeadlockDetected)
# By SQLSTATE (psycopg's classes do not group class 58 under one base).
_FULL = "53100"  # disk_full
_DAMAGED = ("XX001", "XX002")  # data_corrupted, index_corrupted
_UNWRITABLE = ("25006", "42501")  # read_only_sql_transaction, insufficient_privilege
_IO_CLASS = "58"  # system_error: I/O errors, missing or duplicate files on the server
_TOO_SLOW = ("57014", "55P03")  # query_canceled (statement_timeout), lock_not_available


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def failure(op: str, where: str, exc: BaseException) -> tuple[StoreError, str | None]:
    """The error a caller of `op` sees for what its job raised on the server `where`,
    and the condition it shows ("full", "unwritable", "unreachable"; None for a plain
    StoreError), which the store logs once until a later call succeeds."""
    if isinstance(exc, StoreError):
        return exc, None
    said = first_line(exc)
    state = str(getattr(exc, "sqlstate", None) or "")
    if state == _FULL:
        return StorageFullError(
            f"{op}: the disk holding the database {where} is full ({said}): nothing was "
            "stored; free some space on the server and try again"
        ), "full"
    if state in _DAMAGED:
        return StorageError(
            f"{op}: the database {where} is damaged ({said}): what it holds there cannot "
            "be read, so nothing is written to it; see the server's log"
        ), "unwritable"
    if state in _UNWRITABLE or state.startswith(_IO_CLASS):
        return StorageError(
            f"{op}: the database {where} cannot be written or read ({said}): check the "
            "server (a read-only standby, the role's privileges, its disk)"
        ), "unwritable"
    if state in _TOO_SLOW:
        return StorageError(
            f"{op}: the database {where} did not answer in time ({said}): nothing was "
            "stored; see the server's load and its locks (another daemon's long write, "
            "or one applying the schema)"
        ), "unreachable"
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg.OperationalError):
        return StorageError(
            f"{op}: cannot reach the database {where} ({said}): check that the server "
            "runs and accepts connections"
        ), "unreachable"
    return StoreError(f"{op} failed: {said}"), None
