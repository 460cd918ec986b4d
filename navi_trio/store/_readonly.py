"""`navi doctor`'s look at a database file: read-only, creating and changing nothing.

`read_only_stats` counts the rows of each table; `read_only_check` runs the same
bounded ``PRAGMA quick_check`` as the store's start-up (`_health`). Neither switches to
WAL, creates the schema or the parent folders, nor leaves a -wal file behind.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

from navi_trio.errors import StoreError
from navi_trio.store._health import QUICK_CHECK_SEC, check_summary, quick_check
from navi_trio.store._schema import _TABLES, SCHEMA_VERSION
from navi_trio.store._worker import BUSY_TIMEOUT_S


def read_only_stats(path: Path) -> dict[str, int]:
    """Row count per table of an existing database, opened read-only (blocking).

    For `navi doctor`, which must not create or change anything: no WAL switch, no
    schema, no parent folders. StoreError when the file is not a navi database.
    """
    conn = _connect_read_only(path)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{path} has schema version {version}; this navi knows {SCHEMA_VERSION}"
            )
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = [t for t in _TABLES if t not in names]
        if missing:
            raise StoreError(f"{path} is not a navi database (no table {', '.join(missing)})")
        return {t: int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in _TABLES}
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read {path}: {exc}") from None
    finally:
        conn.close()


def read_only_check(path: Path, seconds: float = QUICK_CHECK_SEC) -> dict[str, Any]:
    """`navi doctor`'s PRAGMA quick_check of an existing database (blocking, bounded in
    time, read-only): ``ok`` (no damage found), ``done`` (the check finished),
    ``problems`` and ``summary`` (the one line saying what is wrong, None when ok)."""
    try:
        conn = _connect_read_only(path)
    except StoreError as exc:
        return {"ok": False, "done": False, "problems": [], "summary": str(exc)}
    try:
        problems = quick_check(conn, seconds)
    except sqlite3.Error as exc:
        said = f"the database {path} could not be checked: {exc}"
        return {"ok": False, "done": False, "problems": [], "summary": said}
    finally:
        conn.close()
    return {
        "ok": not problems,
        "done": problems is not None,
        "problems": problems or [],
        "summary": check_summary(path, problems, seconds),
    }


def _connect_read_only(path: Path) -> sqlite3.Connection:
    # Read-only still creates the -wal and -shm files of a WAL database when they are
    # absent (the last close checkpointed and removed them). Then the main file holds
    # everything, and "immutable" reads it without creating anything.
    wal = path.with_name(path.name + "-wal")
    mode = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    uri = f"file:{urllib.parse.quote(str(path))}?{mode}"
    try:
        return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {path} read-only: {exc}") from None
