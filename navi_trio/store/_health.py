"""When the database is unwell: SQLite's failures as storage errors, and the start-up check.

`failure(op, path, exc)` turns what a job raised into the StoreError its caller sees. The
failures that say the file itself is the problem get their own classes, so the layers
above can answer with a precise code and a sentence a user can act on:

- SQLITE_FULL: the disk (or its quota) is full -> `StorageFullError` (``storage_full``);
- SQLITE_READONLY, SQLITE_PERM, SQLITE_CANTOPEN, SQLITE_IOERR, SQLITE_NOLFS, SQLITE_AUTH:
  the file cannot be written or read -> `StorageError` (``storage``);
- SQLITE_CORRUPT, SQLITE_NOTADB: the file is damaged -> `StorageError` saying so.

Anything else (a constraint, a bad argument) stays a plain StoreError.

`quick_check(conn, seconds)` runs ``PRAGMA quick_check`` under a progress handler that
aborts it once `seconds` of real time have passed: a start-up on a large file waits at
most that long, and a check cut short says so rather than passing.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from navi_trio.errors import StorageError, StorageFullError, StoreError

# Primary result codes (https://sqlite.org/rescode.html); extended codes carry them in
# their low byte (SQLITE_IOERR_WRITE is 778 = 10 | 3 << 8).
SQLITE_PERM = 3
SQLITE_READONLY = 8
SQLITE_INTERRUPT = 9
SQLITE_IOERR = 10
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
SQLITE_CANTOPEN = 14
SQLITE_NOLFS = 22
SQLITE_AUTH = 23
SQLITE_NOTADB = 26
_UNWRITABLE = (
    SQLITE_PERM,
    SQLITE_READONLY,
    SQLITE_IOERR,
    SQLITE_CANTOPEN,
    SQLITE_NOLFS,
    SQLITE_AUTH,
)
_DAMAGED = (SQLITE_CORRUPT, SQLITE_NOTADB)
QUICK_CHECK_SEC = 5.0  # the start-up check gives up after this much real time
QUICK_CHECK_MAX = 20  # problems listed at most (the pragma stops there)
_PROGRESS_STEPS = 10_000  # VM steps between two looks at the clock


def primary_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def failure(op: str, path: Path, exc: BaseException) -> StoreError:
    """The error a caller of `op` sees for what its job raised."""
    if isinstance(exc, StoreError):
        return exc
    code = primary_code(exc)
    if code == SQLITE_FULL:
        return StorageFullError(
            f"{op}: the disk holding the database {path} is full ({exc}): nothing was "
            "stored; free some space and try again"
        )
    if code in _DAMAGED:
        return StorageError(
            f"{op}: the database {path} is damaged ({exc}): what it holds there cannot be "
            "read, so nothing is written to it; see `navi doctor`"
        )
    if code in _UNWRITABLE:
        return StorageError(
            f"{op}: the database {path} cannot be written or read ({exc}): check the file, "
            "its folder and the disk (permissions, read-only mount, immutable flag)"
        )
    return StoreError(f"{op} failed: {exc}")


def quick_check(conn: sqlite3.Connection, seconds: float = QUICK_CHECK_SEC) -> list[str] | None:
    """The problems ``PRAGMA quick_check`` finds, [] for none; None when cut short."""
    deadline = time.monotonic() + seconds

    def too_late() -> int:
        return 1 if time.monotonic() > deadline else 0

    conn.set_progress_handler(too_late, _PROGRESS_STEPS)
    try:
        rows = conn.execute(f"PRAGMA quick_check({QUICK_CHECK_MAX})").fetchall()
    except sqlite3.Error as exc:
        code = primary_code(exc)
        if code == SQLITE_INTERRUPT:
            return None
        if code in _DAMAGED:  # damaged past what the check itself can walk
            return [str(exc)]
        raise
    finally:
        conn.set_progress_handler(None, 0)
    lines = [line.strip() for row in rows for line in str(row[0]).splitlines()]
    return [line for line in lines if line and line != "ok" and not line.startswith("***")]


def check_summary(path: Path, problems: list[str] | None, seconds: float) -> str | None:
    """One line for the log and `navi doctor`; None when the file passed."""
    if problems is None:
        return (
            f"the database {path} was not checked: PRAGMA quick_check did not finish "
            f"within {seconds:g} s (a large file): `sqlite3 {path} 'PRAGMA quick_check'` "
            "checks it fully"
        )
    if not problems:
        return None
    shown = "; ".join(problems[:3]) + ("; …" if len(problems) > 3 else "")
    more = f"{len(problems)}+" if len(problems) >= QUICK_CHECK_MAX else str(len(problems))
    return (
        f"the database {path} is damaged: PRAGMA quick_check found {more} problem(s): "
        f"{shown}. A session whose messages cannot be read refuses new ones (error "
        "`storage`); the others work. Keep a copy of the file before repairing it"
    )
