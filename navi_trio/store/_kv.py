"""The kv table: JSON values under (scope, key) — task notes, memory, todo, scratchpad.

A write made inside a run carries the run's lease fence (store/fence.py
`current_fence`) and is refused with `LeaseLostError`, nothing stored, once another
process took the session over: the check is in the write's own transaction.

The statements of the SQLite store (store/methods.py has the methods), run on the
worker thread.
"""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database

from navi_trio.store._lease import check_fence
from navi_trio.store._schema import _write_tx
from navi_trio.store.fence import Fence


def _kv_get(db: Database, scope: str, key: str) -> Any | None:
    row = db.execute("SELECT value FROM kv WHERE scope = ? AND key = ?", [scope, key]).fetchone()
    return None if row is None else json.loads(row[0])


def _kv_set(
    db: Database, scope: str, key: str, value: str, now: float, fence: Fence | None = None
) -> None:
    with _write_tx(db):
        check_fence(db, fence)
        db.execute(
            "INSERT INTO kv (scope, key, value, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value,"
            " updated_at = excluded.updated_at",
            [scope, key, value, now],
        )


def _kv_delete(db: Database, scope: str, key: str, fence: Fence | None = None) -> None:
    with _write_tx(db):
        check_fence(db, fence)
        db.execute("DELETE FROM kv WHERE scope = ? AND key = ?", [scope, key])


def _kv_list(db: Database, scope: str, prefix: str) -> list[tuple[str, Any]]:
    rows = db.execute(
        "SELECT key, value FROM kv WHERE scope = ? AND substr(key, 1, ?) = ? ORDER BY key",
        [scope, len(prefix), prefix],
    ).fetchall()
    return [(r[0], json.loads(r[1])) for r in rows]
