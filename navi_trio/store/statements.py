"""The statements whose SQL is the same on both engines, written once over an `Engine`.

An `Engine` is what differs underneath: its placeholder (`?` for SQLite, `%s` for
psycopg; the SQL here is written with `?`), how it opens a write transaction (SQLite
takes the file's write lock, ``BEGIN IMMEDIATE``; a PostgreSQL job already runs in one)
and how a write checks its lease fence (store/fence.py). Each engine's statements
(store/sqlite.py `_SQLite`, store/postgres/store.py `_Postgres`) are its `Engine` and
its own functions where its SQL differs: PostgreSQL locks rows (``FOR UPDATE``,
advisory locks) and reads the server's clock, because several daemons write at once.
Every function runs on the engine's worker thread with its connection (`conn`).
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import Any

from navi_trio.errors import StoreError
from navi_trio.store._control_input import SCHEDULE_COLS, by_key, schedule_from
from navi_trio.store.base import USAGE_KINDS, ScheduleRow, SessionRow
from navi_trio.store.fence import Fence
from navi_trio.text import loads_clean

SESSION_COLS = "id, profile_id, title, user_id, created_at, updated_at, meta"
USER_COLS = "id, name, role, created_at"


def session_from(row: Any) -> SessionRow:
    return SessionRow(
        id=row[0], profile_id=row[1], title=row[2], user_id=row[3],
        created_at=row[4], updated_at=row[5], meta=json.loads(row[6]),
    )  # fmt: skip


def user_dict(row: Any) -> dict[str, Any]:
    return {"id": row[0], "name": row[1], "role": row[2], "created_at": row[3]}


class Engine:
    """An engine's placeholder, write transaction and fence check, and the statements
    both engines share (see the module)."""

    mark = "?"
    seq = "rowid"  # the column that numbers rows in the order they were inserted

    def q(self, text: str) -> str:
        """`text` with its `?` placeholders in this engine's style."""
        return text if self.mark == "?" else text.replace("?", self.mark)

    def flag(self, value: bool) -> object:
        """A boolean column's value (SQLite keeps 0 and 1)."""
        return int(value)

    def any_of(self, column: str, values: list[str]) -> tuple[str, list[Any]]:
        """A condition "`column` is one of `values`", with its parameters."""
        return f"{column} IN ({', '.join('?' for _ in values)})", list(values)

    def write(self, conn: Any) -> AbstractContextManager[object]:
        """One write transaction (nested: a savepoint, or nothing more)."""
        raise NotImplementedError

    def check_fence(self, conn: Any, fence: Fence | None) -> None:
        """Inside a write: LeaseLostError unless `fence` (if any) still holds its lease."""
        raise NotImplementedError

    # -- sessions -------------------------------------------------------------------

    def get_session(self, conn: Any, sid: str) -> SessionRow | None:
        sql = self.q(f"SELECT {SESSION_COLS} FROM sessions WHERE id = ?")
        row = conn.execute(sql, [sid]).fetchone()
        return None if row is None else session_from(row)

    def list_sessions(self, conn: Any, user_id: str | None) -> list[SessionRow]:
        where, params = ("WHERE user_id = ?", [user_id]) if user_id is not None else ("", [])
        sql = (
            f"SELECT {SESSION_COLS} FROM sessions {where} ORDER BY updated_at DESC, {self.seq} DESC"
        )
        return [session_from(r) for r in conn.execute(self.q(sql), params).fetchall()]

    def require_session(self, conn: Any, sid: str) -> None:
        if conn.execute(self.q("SELECT 1 FROM sessions WHERE id = ?"), [sid]).fetchone() is None:
            raise StoreError(f"no session {sid!r} in the store")

    def count_sessions(self, conn: Any, user_id: str) -> int:
        sql = self.q("SELECT COUNT(*) FROM sessions WHERE user_id = ?")
        return int(conn.execute(sql, [user_id]).fetchone()[0])

    def load_history(self, conn: Any, table: str, sid: str) -> list[dict[str, Any]]:
        # `table` is "messages" or "context", from store/methods.py, never from callers.
        self.require_session(conn, sid)
        sql = self.q(f"SELECT data FROM {table} WHERE session_id = ? ORDER BY position")
        # An older version stored lone surrogates: they come back as U+FFFD.
        return [loads_clean(r[0]) for r in conn.execute(sql, [sid]).fetchall()]

    # -- queued messages ------------------------------------------------------------

    def unqueue(self, conn: Any, key: str) -> bool:
        with self.write(conn):
            return bool(conn.execute(self.q("DELETE FROM queued WHERE key = ?"), [key]).rowcount)

    def queued_sessions(self, conn: Any) -> list[str]:
        rows = conn.execute("SELECT DISTINCT session_id FROM queued ORDER BY session_id")
        return [r[0] for r in rows.fetchall()]

    # -- kv -------------------------------------------------------------------------

    def kv_get(self, conn: Any, scope: str, key: str) -> Any | None:
        sql = self.q("SELECT value FROM kv WHERE scope = ? AND key = ?")
        row = conn.execute(sql, [scope, key]).fetchone()
        return None if row is None else json.loads(row[0])

    def kv_set(
        self, conn: Any, scope: str, key: str, value: str, now: float, fence: Fence | None = None
    ) -> None:
        with self.write(conn):
            self.check_fence(conn, fence)
            conn.execute(
                self.q(
                    "INSERT INTO kv (scope, key, value, updated_at) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value,"
                    " updated_at = excluded.updated_at"
                ),
                [scope, key, value, now],
            )

    def kv_delete(self, conn: Any, scope: str, key: str, fence: Fence | None = None) -> None:
        with self.write(conn):
            self.check_fence(conn, fence)
            conn.execute(self.q("DELETE FROM kv WHERE scope = ? AND key = ?"), [scope, key])

    # -- users ----------------------------------------------------------------------

    def user_by_digest(self, conn: Any, digest: str) -> dict[str, Any] | None:
        sql = self.q(f"SELECT {USER_COLS} FROM users WHERE token_sha256 = ?")
        row = conn.execute(sql, [digest]).fetchone()
        return None if row is None else user_dict(row)

    def list_users(self, conn: Any) -> list[dict[str, Any]]:
        sql = f"SELECT {USER_COLS} FROM users ORDER BY created_at, {self.seq}"
        return [user_dict(r) for r in conn.execute(sql).fetchall()]

    def user_by_id(self, conn: Any, user_id: str) -> dict[str, Any] | None:
        row = conn.execute(self.q(f"SELECT {USER_COLS} FROM users WHERE id = ?"), [user_id])
        found = row.fetchone()
        return None if found is None else user_dict(found)

    # -- leases ---------------------------------------------------------------------

    def release_lease(self, conn: Any, sid: str, owner: str) -> None:
        with self.write(conn):
            # Expired, not deleted: the generation must never go back (store/fence.py).
            conn.execute(
                self.q("UPDATE leases SET expires_at = 0 WHERE session_id = ? AND owner = ?"),
                [sid, owner],
            )

    # -- schedules ------------------------------------------------------------------

    def get_schedule(self, conn: Any, sid: str) -> ScheduleRow | None:
        sql = self.q(f"SELECT {', '.join(SCHEDULE_COLS)} FROM schedules WHERE id = ?")
        row = conn.execute(sql, [sid]).fetchone()
        return None if row is None else schedule_from(row, json.loads)

    def list_schedules(self, conn: Any, user_id: str | None) -> list[ScheduleRow]:
        cols = ", ".join(SCHEDULE_COLS)
        if user_id is None:
            rows = conn.execute(f"SELECT {cols} FROM schedules ORDER BY created_at, id")
        else:
            sql = self.q(f"SELECT {cols} FROM schedules WHERE user_id = ? ORDER BY created_at, id")
            rows = conn.execute(sql, [user_id])
        return [schedule_from(r, json.loads) for r in rows.fetchall()]

    def count_schedules(self, conn: Any, user_id: str) -> int:
        sql = self.q("SELECT COUNT(*) FROM schedules WHERE user_id = ?")
        return int(conn.execute(sql, [user_id]).fetchone()[0])

    def set_schedule(self, conn: Any, sid: str, paused: bool, next_due: float | None) -> bool:
        with self.write(conn):
            sql = self.q("UPDATE schedules SET paused = ?, next_due = ? WHERE id = ?")
            return bool(conn.execute(sql, [self.flag(paused), next_due, sid]).rowcount)

    def delete_schedule(self, conn: Any, sid: str) -> bool:
        with self.write(conn):
            return bool(conn.execute(self.q("DELETE FROM schedules WHERE id = ?"), [sid]).rowcount)

    # -- usage ----------------------------------------------------------------------

    def get_usage(self, conn: Any, keys: list[str]) -> dict[str, dict[str, float]]:
        where, params = self.any_of("key", keys)
        sql = f"SELECT key, {', '.join(USAGE_KINDS)} FROM usage WHERE {where}"
        return by_key(keys, conn.execute(sql, params).fetchall())
