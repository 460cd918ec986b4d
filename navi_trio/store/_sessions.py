"""The sessions table: create, read, list, update, count and delete a session.

The statements of the SQLite store (store/methods.py has the methods), run on the
worker thread. Deleting a session deletes what hangs on
it: its history and context, its queued messages and the kv rows keyed by its id.
"""

from __future__ import annotations

from typing import Any

from sqlite_utils import Database

from navi_trio.errors import SessionExistsError
from navi_trio.store._schema import _HISTORY, SQLITE, _write_tx
from navi_trio.store.base import SessionRow
from navi_trio.store.fence import Fence
from navi_trio.store.statements import SESSION_COLS


def _insert_session(
    db: Database, row: SessionRow, meta_json: str, most: int | None = None
) -> int | None:
    """Insert the row; with `most`, not when the user has that many sessions already:
    then how many they have (else None)."""
    with _write_tx(db):
        if db.execute("SELECT 1 FROM sessions WHERE id = ?", [row.id]).fetchone() is not None:
            raise SessionExistsError(f"session {row.id!r} already exists")
        if most is not None and (count := SQLITE.count_sessions(db, row.user_id)) >= most:
            return count
        db.execute(
            f"INSERT INTO sessions ({SESSION_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                row.id,
                row.profile_id,
                row.title,
                row.user_id,
                row.created_at,
                row.updated_at,
                meta_json,
            ],
        )
    return None


def _update_session(
    db: Database, sid: str, changes: dict[str, Any], fence: Fence | None = None
) -> None:
    # Column names come from update_session's fixed keyword set, never from callers.
    sets = ", ".join(f"{col} = ?" for col in changes)
    with _write_tx(db):
        SQLITE.check_fence(db, fence)
        SQLITE.require_session(db, sid)
        db.execute(f"UPDATE sessions SET {sets} WHERE id = ?", [*changes.values(), sid])


def _delete_session(db: Database, sid: str) -> bool:
    with _write_tx(db):
        for table in _HISTORY:
            db.execute(f"DELETE FROM {table} WHERE session_id = ?", [sid])
        db.execute("DELETE FROM queued WHERE session_id = ?", [sid])
        db.execute("DELETE FROM wakes WHERE session_id = ?", [sid])
        db.execute("DELETE FROM usage WHERE key = ?", [f"session:{sid}"])
        db.execute("DELETE FROM usage_holds WHERE key = ?", [f"session:{sid}"])
        db.execute("DELETE FROM schedules WHERE session_id = ?", [sid])
        # substr, not LIKE: ids may contain LIKE's wildcard `_`.
        db.execute(
            "DELETE FROM kv WHERE key = ? OR substr(key, 1, ?) = ?", [sid, len(sid) + 1, sid + ":"]
        )
        return bool(db.execute("DELETE FROM sessions WHERE id = ?", [sid]).rowcount)
