"""The sessions table: create, read, list, update, count and delete a session.

`_Sessions` holds the store's session methods (mixed into `SQLiteStore`); below it,
the functions that run on the worker thread. Deleting a session deletes what hangs on
it: its history and context, its queued messages and the kv rows keyed by its id.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlite_utils import Database

from navi_trio.errors import LimitError, SessionExistsError, StoreError
from navi_trio.store._control_input import check_sessions_max, sessions_full
from navi_trio.store._core import _Core
from navi_trio.store._input import _check_meta, _check_text, _dump, check_session_id
from navi_trio.store._lease import check_fence
from navi_trio.store._schema import _HISTORY, _SESSION_COLS, _session_from, _write_tx
from navi_trio.store.base import SessionRow
from navi_trio.store.fence import Fence, fence_for


class _Sessions(_Core):
    async def create_session(
        self,
        session_id: str | None = None,
        *,
        profile_id: str,
        title: str = "",
        user_id: str = "local",
        meta: dict[str, Any] | None = None,
        sessions_max: int | None = None,
    ) -> SessionRow:
        sid = check_session_id(session_id) if session_id is not None else _new_session_id()
        most = check_sessions_max(sessions_max)
        now = self._now()
        row = SessionRow(
            id=sid,
            profile_id=_check_text(profile_id, "profile_id"),
            title=_check_text(title, "title", allow_empty=True),
            user_id=_check_text(user_id, "user_id"),
            created_at=now,
            updated_at=now,
            meta=dict(_check_meta(meta if meta is not None else {})),
        )
        meta_json = _dump(row.meta, "session meta")
        full = await self._run(
            f"create session {sid!r}", lambda db: _insert_session(db, row, meta_json, most)
        )
        if full is not None and most is not None:
            raise LimitError(sessions_full(full, most))
        return row

    async def get_session(self, session_id: str) -> SessionRow | None:
        sid = check_session_id(session_id)
        return await self._run(f"get session {sid!r}", lambda db: _get_session(db, sid))

    async def list_sessions(self, user_id: str | None = None) -> list[SessionRow]:
        if user_id is not None:
            _check_text(user_id, "user_id")
        return await self._run("list sessions", lambda db: _list_sessions(db, user_id))

    async def update_session(
        self,
        session_id: str,
        *,
        profile_id: str | None = None,
        title: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Change the given fields (meta is replaced whole) and bump updated_at."""
        sid = check_session_id(session_id)
        changes: dict[str, Any] = {"updated_at": self._now()}
        if profile_id is not None:
            changes["profile_id"] = _check_text(profile_id, "profile_id")
        if title is not None:
            changes["title"] = _check_text(title, "title", allow_empty=True)
        if meta is not None:
            changes["meta"] = _dump(_check_meta(meta), "session meta")
        fence = fence_for(sid)
        await self._run(
            f"update session {sid!r}", lambda db: _update_session(db, sid, changes, fence)
        )

    async def delete_session(self, session_id: str) -> bool:
        """Delete the session, its history, context and kv rows keyed `sid` or `sid:…`."""
        sid = check_session_id(session_id)
        return await self._run(f"delete session {sid!r}", lambda db: _delete_session(db, sid))

    async def count_sessions(self, user_id: str) -> int:
        _check_text(user_id, "user id")
        return await self._run(f"count sessions of {user_id}", lambda db: _count(db, user_id))


def _new_session_id() -> str:
    return "s-" + uuid.uuid4().hex[:12]


def _get_session(db: Database, sid: str) -> SessionRow | None:
    row = db.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE id = ?", [sid]).fetchone()
    return None if row is None else _session_from(row)


def _require_session(db: Database, sid: str) -> None:
    if db.execute("SELECT 1 FROM sessions WHERE id = ?", [sid]).fetchone() is None:
        raise StoreError(f"no session {sid!r} in the store")


def _insert_session(
    db: Database, row: SessionRow, meta_json: str, most: int | None = None
) -> int | None:
    """Insert the row; with `most`, not when the user has that many sessions already:
    then how many they have (else None)."""
    with _write_tx(db):
        if db.execute("SELECT 1 FROM sessions WHERE id = ?", [row.id]).fetchone() is not None:
            raise SessionExistsError(f"session {row.id!r} already exists")
        if most is not None and (count := _count(db, row.user_id)) >= most:
            return count
        db.execute(
            f"INSERT INTO sessions ({_SESSION_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [row.id, row.profile_id, row.title, row.user_id, row.created_at, row.updated_at,
             meta_json],
        )  # fmt: skip
    return None


def _list_sessions(db: Database, user_id: str | None) -> list[SessionRow]:
    where, params = ("WHERE user_id = ?", [user_id]) if user_id is not None else ("", [])
    rows = db.execute(
        f"SELECT {_SESSION_COLS} FROM sessions {where} ORDER BY updated_at DESC, rowid DESC",
        params,
    ).fetchall()
    return [_session_from(r) for r in rows]


def _update_session(
    db: Database, sid: str, changes: dict[str, Any], fence: Fence | None = None
) -> None:
    # Column names come from update_session's fixed keyword set, never from callers.
    sets = ", ".join(f"{col} = ?" for col in changes)
    with _write_tx(db):
        check_fence(db, fence)
        _require_session(db, sid)
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


def _count(db: Database, user_id: str) -> int:
    row = db.execute("SELECT COUNT(*) FROM sessions WHERE user_id = ?", [user_id]).fetchone()
    return int(row[0])
