"""The statements whose SQL is the same on both engines, written once over an `Engine`.

An `Engine` is what differs underneath: its placeholder (`?` for SQLite, `%s` for
psycopg; the SQL here is written with `?`), how it opens a write transaction (SQLite
takes the file's write lock, ``BEGIN IMMEDIATE``; a PostgreSQL job already runs in one)
and how a write checks its lease fence (store/fence.py); PostgreSQL locks rows (``FOR
UPDATE``, advisory locks) and reads the server's clock, because several daemons write at
once. Each engine adds the statements whose SQL is its own. Every function runs on the
engine's worker thread with its connection (`conn`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from navi_trio.errors import DuplicateMessageError, SessionExistsError, StoreError
from navi_trio.store._control_input import (
    SCHEDULE_COLS,
    by_key,
    decide,
    schedule_from,
    sessions_full,
    taken,
)
from navi_trio.store._input import _prepare, _Rewrite, _Row, page_end
from navi_trio.store.base import (
    HANDED_HOST,
    HANDED_PID,
    KEYS_KEPT,
    USAGE_KINDS,
    Claimed,
    HistoryPage,
    KeyClaim,
    LeaseRow,
    LoadedSession,
    RunUsage,
    ScheduleRow,
    SessionRow,
    UsageAsk,
    UsageGrant,
    UsageLine,
    UsageRequest,
)
from navi_trio.store.fence import Fence, pid_alive
from navi_trio.store.repair import placeholder_positions, repair_dangling_tool_calls
from navi_trio.text import loads_clean

SESSION_COLS = "id, profile_id, title, user_id, created_at, updated_at, meta"
USER_COLS = "id, name, role, created_at"
LEASE_COLS = "session_id, owner, pid, host, expires_at, generation"
Queued = list[tuple[str, dict[str, Any]]]  # (key, message) of queued rows, oldest first
Usage = dict[str, dict[str, float]]  # each key's counters
TOKEN_TAKEN = "a user with this token already exists; tokens must be unique"
KV_UPSERT = (
    "INSERT INTO kv (scope, key, value, updated_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value,"
    " updated_at = excluded.updated_at"
)


def session_from(row: Any) -> SessionRow:
    return SessionRow(
        id=row[0],
        profile_id=row[1],
        title=row[2],
        user_id=row[3],
        created_at=row[4],
        updated_at=row[5],
        meta=json.loads(row[6]),
    )


def queued_of(rows: Iterable[Sequence[Any]], user_ids: set[str]) -> list[str]:
    """The keys of the queued rows (key, data) whose message was sent by one of `user_ids`."""
    keys = []
    for key, data in rows:
        try:
            sender = json.loads(data).get("user_id")
        except (ValueError, AttributeError):
            continue  # not a message of ours: nobody's
        if sender in user_ids:
            keys.append(str(key))
    return keys


def lease_from(row: Any) -> LeaseRow:  # a row of LEASE_COLS
    return LeaseRow(row[0], row[1], row[2], row[3], float(row[4]), int(row[5]))


def user_dict(row: Any) -> dict[str, Any]:
    return {"id": row[0], "name": row[1], "role": row[2], "created_at": row[3]}


class Engine:
    """An engine's placeholder, write transaction and fence check, and the statements
    both engines share (see the module). The statements whose SQL is each engine's own
    are declared here and given by the engine (store/sqlite.py, postgres/store.py)."""

    # (conn, table, sid, rows, positions, now): the rows at those positions, one statement
    insert_history: Callable[[Any, str, str, Sequence[_Row], Sequence[float], float], None]
    # (conn, sid, key, data, pid, host, now, keep, claim)
    enqueue: Callable[[Any, str, str, str, int, str, float, int | None, KeyClaim | None], Queued]
    adopt: Callable[[Any, str, int, str, float], Queued]  # sid, pid, host, now
    kv_list: Callable[[Any, str, str], list[tuple[str, Any]]]
    claim_lease: Callable[[Any, str, str, int, str, float, float], LeaseRow]

    def append(
        self,
        conn: Any,
        sid: str,
        msg_rows: list[_Row],
        ctx_rows: list[_Row],
        now: float,
        dequeue: str | None,
        fence: Fence | None,
        /,
        *,
        durable: bool,
        renew: float | None,
        claim: KeyClaim | None = None,
        owes_end: bool = False,
    ) -> None:
        """New history rows, with the queued row `dequeue` taken off the queue (and the
        client key `claim` taken: `claim_key`); with `renew`, the fence's lease extended
        to `renew` s from now; with `owes_end`, the fence's lease marked as owing the
        session a turn's end (`owe_end`)."""
        raise NotImplementedError

    mark = "?"
    seq = "rowid"  # the column that numbers rows in the order they were inserted
    size = "length"  # a text's size in bytes (the history's data is ASCII JSON)
    for_update = ""  # what holds a row read in a write to the commit
    clock = "?"  # the time in SQL: the caller's `now` (`at`) or the server's clock

    def at(self, now: float) -> list[float]:
        """The parameters of `clock`."""
        return [now]

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

    def lock_session(self, conn: Any, sid: str) -> None:
        """Inside a write: hold the session's row to the commit (SQLite's write
        transaction holds the whole file already)."""

    def session_there(self, conn: Any, sid: str, *, hold: bool = True) -> bool:
        """Whether the session is there; with `hold` (inside a write) its row is held to
        the commit."""
        sql = self.q(f"SELECT 1 FROM sessions WHERE id = ?{self.for_update if hold else ''}")
        return conn.execute(sql, [sid]).fetchone() is not None

    def hold_session(self, conn: Any, sid: str) -> None:
        """Inside a write: `require_session`, its row held to the commit."""
        self.require_session(conn, sid, hold=True)

    def count_sessions_locked(self, conn: Any, user_id: str) -> int:
        """Inside a write: the user's sessions, counted so that two transactions that
        may create one of theirs count one after the other (SQLite: the write lock)."""
        return self.count_sessions(conn, user_id)

    def lock_usage(self, conn: Any, keys: list[str], now: float) -> None:
        """Inside a write: hold the keys' usage rows to the commit, in key order (SQLite's
        write transaction holds the whole file already)."""

    def users_changed(self, conn: Any) -> None:
        """Inside a write that changed the users table (SQLite signals it after the
        commit instead: store/sqlite.py)."""

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

    def insert_session(
        self, conn: Any, row: SessionRow, meta_json: str, most: int | None
    ) -> int | None:
        """Insert the row; with `most`, not when the user has that many sessions already:
        then how many they have (else None)."""
        sql = self.q(
            f"INSERT INTO sessions ({SESSION_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO NOTHING"
        )
        with self.write(conn):
            if self.session_there(conn, row.id):
                raise SessionExistsError(f"session {row.id!r} already exists")
            if (
                most is not None
                and (count := self.count_sessions_locked(conn, row.user_id)) >= most
            ):
                return count
            values = [row.id, row.profile_id, row.title, row.user_id, row.created_at]
            # No row: made meanwhile by another daemon (its check ran before our insert).
            if not conn.execute(sql, [*values, row.updated_at, meta_json]).rowcount:
                raise SessionExistsError(f"session {row.id!r} already exists")
        return None

    def update_session(
        self, conn: Any, sid: str, changes: dict[str, Any], fence: Fence | None
    ) -> None:
        # Column names come from update_session's fixed keyword set, never from callers.
        sets = ", ".join(f"{col} = ?" for col in changes)
        with self.write(conn):
            self.check_fence(conn, fence)
            self.hold_session(conn, sid)
            sql = self.q(f"UPDATE sessions SET {sets} WHERE id = ?")
            conn.execute(sql, [*changes.values(), sid])

    def delete_session(self, conn: Any, sid: str) -> bool:
        """The session and what hangs on it: history, context, queued messages, wake-ups,
        usage, schedules, and the kv rows `sid` / `sid:…` (even of a session gone)."""
        with self.write(conn):
            there = self.session_there(conn, sid)
            for table in ("messages", "context", "queued", "wakes", "schedules", "message_keys"):
                conn.execute(self.q(f"DELETE FROM {table} WHERE session_id = ?"), [sid])
            for table in ("usage", "usage_holds"):
                conn.execute(self.q(f"DELETE FROM {table} WHERE key = ?"), [f"session:{sid}"])
            # substr, not LIKE: ids may contain LIKE's wildcard `_`.
            conn.execute(
                self.q("DELETE FROM kv WHERE key = ? OR substr(key, 1, ?) = ?"),
                [sid, len(sid) + 1, sid + ":"],
            )
            conn.execute(self.q("DELETE FROM sessions WHERE id = ?"), [sid])
            return there

    def require_session(self, conn: Any, sid: str, *, hold: bool = False) -> None:
        """StoreError when the session is not there (`session_there`)."""
        if not self.session_there(conn, sid, hold=hold):
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

    def load_page(
        self, conn: Any, sid: str, after: float | None, limit: int, max_bytes: int
    ) -> HistoryPage:
        """One page of the display history: the sizes first, stepped lazily (the rows
        past the page are never read), then the data of that page alone."""
        self.require_session(conn, sid)
        where, params = ("AND position > ?", [after]) if after is not None else ("", [])
        sizes = conn.execute(
            self.q(
                f"SELECT position, {self.size}(data) FROM messages WHERE session_id = ? {where}"
                " ORDER BY position LIMIT ?"
            ),
            [sid, *params, limit + 1],
        )
        try:
            end = page_end(sizes, limit, max_bytes)
        finally:
            sizes.close()
        if end is None:
            return HistoryPage(messages=[], next_after=None)
        last, more = end
        rows = conn.execute(
            self.q(
                f"SELECT data FROM messages WHERE session_id = ? {where} AND position <= ?"
                " ORDER BY position"
            ),
            [sid, *params, last],
        ).fetchall()
        messages = [loads_clean(r[0]) for r in rows]  # an older version stored lone surrogates
        return HistoryPage(messages=messages, next_after=last if more else None)

    def replace_context(
        self, conn: Any, sid: str, rows: list[_Row], now: float, fence: Fence | None
    ) -> None:
        with self.write(conn):
            self.check_fence(conn, fence)
            self.hold_session(conn, sid)
            conn.execute(self.q("DELETE FROM context WHERE session_id = ?"), [sid])
            positions = [float(i) for i in range(1, len(rows) + 1)]
            self.insert_history(conn, "context", sid, rows, positions, now)

    def rewrite(self, conn: Any, sid: str, job: _Rewrite, now: float, fence: Fence | None) -> None:
        """A rewind or a branch brought back (SessionStore.rewrite_history), in one write."""
        with self.write(conn):
            self.check_fence(conn, fence)  # a replaced owner must not rewind its successor's
            self.hold_session(conn, sid)
            sql = self.q("SELECT position FROM messages WHERE session_id = ? ORDER BY position")
            positions = [r[0] for r in conn.execute(sql, [sid]).fetchall()]
            if job.keep > len(positions):
                have = len(positions)
                raise StoreError(f"session {sid!r} has {have} messages, not {job.keep} to keep")
            top = float(positions[job.keep - 1]) if job.keep else 0.0
            sql = self.q("DELETE FROM messages WHERE session_id = ? AND position > ?")
            conn.execute(sql, [sid, top])
            after = [top + i for i in range(1, len(job.messages) + 1)]
            self.insert_history(conn, "messages", sid, job.messages, after, now)
            self.replace_context(conn, sid, job.context, now, None)  # the fence is checked above
            for scope, key, value in job.kv_set:
                self.kv_set(conn, scope, key, value, now)
            for scope, key in job.kv_delete:
                self.kv_delete(conn, scope, key)
            conn.execute(self.q("UPDATE sessions SET updated_at = ? WHERE id = ?"), [now, sid])

    def load_session(
        self, conn: Any, sid: str, now: float, fence: Fence | None
    ) -> LoadedSession | None:
        """The session, its dangling tool calls repaired and the placeholders stored
        between their neighbours' positions, in one write: no append slips in between."""
        with self.write(conn):
            self.check_fence(conn, fence)  # a replaced owner must not "repair" its successor's
            sql = self.q(f"SELECT {SESSION_COLS} FROM sessions WHERE id = ?{self.for_update}")
            row = conn.execute(sql, [sid]).fetchone()
            if row is None:
                return None
            loaded: dict[str, list[dict[str, Any]]] = {}
            repaired = 0
            for table in ("messages", "context"):
                sql = f"SELECT position, data FROM {table} WHERE session_id = ? ORDER BY position"
                records = conn.execute(self.q(sql), [sid]).fetchall()
                items = [loads_clean(r[1]) for r in records]  # lone surrogates: U+FFFD
                fixed, inserted = repair_dangling_tool_calls(items)
                if inserted:
                    positions = placeholder_positions([r[0] for r in records], inserted)
                    rows = _prepare([ph for _, ph in inserted], f"{table} placeholders")
                    self.insert_history(conn, table, sid, rows, positions, now)
                loaded[table] = fixed
                repaired += len(inserted)
        return LoadedSession(session_from(row), loaded["messages"], loaded["context"], repaired)

    def claim_key(self, conn: Any, sid: str, claim: KeyClaim, now: float) -> None:
        """Inside the write that stores a message: the session's client key `claim.key`
        is its message's now, or was already (the same message saved again); another
        message's raises `DuplicateMessageError`, which rolls the whole write back. The
        session's keys older than its newest `KEYS_KEPT` go."""
        added = conn.execute(
            self.q(
                "INSERT INTO message_keys (session_id, key, message_id, reply, at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id, key) DO NOTHING"
            ),
            [sid, claim.key, claim.message_id, json.dumps(claim.reply), now],
        ).rowcount
        if not added:
            row = conn.execute(
                self.q("SELECT message_id FROM message_keys WHERE session_id = ? AND key = ?"),
                [sid, claim.key],
            ).fetchone()
            if row is None or row[0] != claim.message_id:
                raise DuplicateMessageError(
                    f"session {sid!r}: a message with key {claim.key!r} was taken already"
                )
            return
        conn.execute(
            self.q(
                f"DELETE FROM message_keys WHERE session_id = ? AND {self.seq} < (SELECT"
                f" {self.seq} FROM message_keys WHERE session_id = ? ORDER BY {self.seq} DESC"
                " LIMIT 1 OFFSET ?)"
            ),
            [sid, sid, KEYS_KEPT - 1],
        )

    def message_key(self, conn: Any, sid: str, key: str) -> dict[str, Any] | None:
        row = conn.execute(
            self.q("SELECT reply FROM message_keys WHERE session_id = ? AND key = ?"), [sid, key]
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def insert_queued(self, conn: Any, values: tuple[Any, ...], now: float) -> None:
        conn.execute(
            self.q(
                "INSERT INTO queued (key, session_id, pid, host, data, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)"
            ),
            [*values, now],
        )

    def enqueue_wake(
        self,
        conn: Any,
        values: tuple[Any, ...],
        kv: tuple[str, str, str] | None,
        limit: int,
        since: float,
        now: float,
    ) -> bool:
        """Store the note `kv`; queue the wake-up `values` unless its session was woken
        `limit` times since `since`: True when queued. The session's row is held first,
        so two writers never both pass the bound."""
        sid = values[1]
        with self.write(conn):
            self.lock_session(conn, sid)
            if kv is not None:
                conn.execute(self.q(KV_UPSERT), [*kv, now])
            conn.execute(self.q("DELETE FROM wakes WHERE session_id = ? AND at <= ?"), [sid, since])
            count = conn.execute(self.q("SELECT COUNT(*) FROM wakes WHERE session_id = ?"), [sid])
            if int(count.fetchone()[0]) >= limit:
                return False
            self.insert_queued(conn, values, now)
            conn.execute(self.q("INSERT INTO wakes (session_id, at) VALUES (?, ?)"), [sid, now])
            return True

    def unqueue(self, conn: Any, key: str) -> bool:
        with self.write(conn):
            return bool(conn.execute(self.q("DELETE FROM queued WHERE key = ?"), [key]).rowcount)

    def queued_sessions(self, conn: Any) -> list[str]:
        rows = conn.execute("SELECT DISTINCT session_id FROM queued ORDER BY session_id")
        return [r[0] for r in rows.fetchall()]

    def release_queued(self, conn: Any, sid: str, keys: list[str], pid: int, host: str) -> int:
        """Hand the process's rows `keys` to whoever runs the session (`HANDED_PID`)."""
        where, params = self.any_of("key", keys)
        sql = self.q(
            "UPDATE queued SET pid = ?, host = ? WHERE session_id = ?"
            f" AND {where} AND pid = ? AND host = ?"
        )
        with self.write(conn):
            cursor = conn.execute(sql, [HANDED_PID, HANDED_HOST, sid, *params, pid, host])
            return int(cursor.rowcount)

    def kv_get(self, conn: Any, scope: str, key: str) -> Any | None:
        sql = self.q("SELECT value FROM kv WHERE scope = ? AND key = ?")
        row = conn.execute(sql, [scope, key]).fetchone()
        return None if row is None else json.loads(row[0])

    def kv_set(
        self, conn: Any, scope: str, key: str, value: str, now: float, fence: Fence | None = None
    ) -> None:
        with self.write(conn):
            self.check_fence(conn, fence)
            conn.execute(self.q(KV_UPSERT), [scope, key, value, now])

    def kv_delete(self, conn: Any, scope: str, key: str, fence: Fence | None = None) -> None:
        with self.write(conn):
            self.check_fence(conn, fence)
            conn.execute(self.q("DELETE FROM kv WHERE scope = ? AND key = ?"), [scope, key])

    def user_by_digest(self, conn: Any, digest: str) -> dict[str, Any] | None:
        sql = self.q(f"SELECT {USER_COLS} FROM users WHERE token_sha256 = ?")
        row = conn.execute(sql, [digest]).fetchone()
        return None if row is None else user_dict(row)

    def list_users(self, conn: Any) -> list[dict[str, Any]]:
        sql = f"SELECT {USER_COLS} FROM users ORDER BY created_at, {self.seq}"
        return [user_dict(r) for r in conn.execute(sql).fetchall()]

    def rotate_token(self, conn: Any, name: str, digest: str) -> bool:
        with self.write(conn):
            if conn.execute(
                self.q("SELECT 1 FROM users WHERE token_sha256 = ?"), [digest]
            ).fetchone():
                raise StoreError(TOKEN_TAKEN)
            sql = self.q("UPDATE users SET token_sha256 = ? WHERE name = ?")
            if not conn.execute(sql, [digest, name]).rowcount:
                return False
            self.users_changed(conn)
            return True

    def insert_user(self, conn: Any, user: dict[str, Any], digest: str) -> None:
        sql = self.q(
            "INSERT INTO users (id, name, token_sha256, role, created_at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (token_sha256) DO NOTHING"
        )
        values = [user["id"], user["name"], digest, user["role"], user["created_at"]]
        with self.write(conn):
            if not conn.execute(sql, values).rowcount:
                raise StoreError(TOKEN_TAKEN)
            self.users_changed(conn)

    def user_by_name(self, conn: Any, name: str) -> dict[str, Any] | None:
        sql = f"SELECT {USER_COLS} FROM users WHERE name = ? ORDER BY {self.seq} LIMIT 1"
        row = conn.execute(self.q(sql), [name]).fetchone()
        return None if row is None else user_dict(row)

    def remove_user(self, conn: Any, name: str) -> bool:
        """The user, their schedules and their queued messages; their sessions stay."""
        with self.write(conn):
            rows = conn.execute(self.q("SELECT id FROM users WHERE name = ?"), [name])
            ids = [str(r[0]) for r in rows.fetchall()]
            if not ids:
                return False
            for user_id in ids:
                conn.execute(self.q("DELETE FROM schedules WHERE user_id = ?"), [user_id])
            rows = conn.execute("SELECT key, data FROM queued").fetchall()
            for key in queued_of(rows, set(ids)):
                conn.execute(self.q("DELETE FROM queued WHERE key = ?"), [key])
            conn.execute(self.q("DELETE FROM users WHERE name = ?"), [name])
            self.users_changed(conn)
            return True

    def user_by_id(self, conn: Any, user_id: str) -> dict[str, Any] | None:
        row = conn.execute(self.q(f"SELECT {USER_COLS} FROM users WHERE id = ?"), [user_id])
        found = row.fetchone()
        return None if found is None else user_dict(found)

    def renew_lease(
        self, conn: Any, sid: str, owner: str, ttl: float, generation: int | None, now: float
    ) -> bool:
        """Extend `owner`'s lease to `ttl` s from now, only while it holds `generation`
        (when given): a replaced owner renews nothing."""
        sql = self.q(
            f"UPDATE leases SET expires_at = {self.clock} + ? WHERE session_id = ? AND owner = ?"
            " AND (CAST(? AS BIGINT) IS NULL OR generation = CAST(? AS BIGINT))"
        )
        with self.write(conn):
            cursor = conn.execute(sql, [*self.at(now), ttl, sid, owner, generation, generation])
            return bool(cursor.rowcount)

    def release_lease(self, conn: Any, sid: str, owner: str) -> None:
        with self.write(conn):
            # Expired, not deleted: the generation must never go back (store/fence.py).
            # Released, it owes no turn's end: what its hold said was sent before.
            conn.execute(
                self.q(
                    "UPDATE leases SET expires_at = 0, end_owed = ? WHERE session_id = ?"
                    " AND owner = ?"
                ),
                [self.flag(False), sid, owner],
            )

    def owe_end(self, conn: Any, fence: Fence) -> None:
        """Inside a write: the fence's lease owes the session a turn's end (`append`'s
        `owes_end`); nothing when its row is no longer the fence's."""
        conn.execute(
            self.q(
                "UPDATE leases SET end_owed = ? WHERE session_id = ? AND owner = ?"
                " AND generation = ?"
            ),
            [self.flag(True), fence.session_id, fence.owner, fence.generation],
        )

    def end_owed(self, conn: Any, sid: str) -> bool:
        row = conn.execute(self.q("SELECT end_owed FROM leases WHERE session_id = ?"), [sid])
        found = row.fetchone()
        return found is not None and bool(found[0])

    def get_schedule(self, conn: Any, sid: str) -> ScheduleRow | None:
        sql = self.q(f"SELECT {', '.join(SCHEDULE_COLS)} FROM schedules WHERE id = ?")
        row = conn.execute(sql, [sid]).fetchone()
        return None if row is None else schedule_from(row, json.loads)

    def create_schedule(self, conn: Any, values: tuple[Any, ...], row: ScheduleRow) -> ScheduleRow:
        marks = ", ".join("?" for _ in SCHEDULE_COLS)
        sql = self.q(
            f"INSERT INTO schedules ({', '.join(SCHEDULE_COLS)}) VALUES ({marks})"
            " ON CONFLICT (id) DO NOTHING"
        )
        with self.write(conn):
            if not conn.execute(sql, list(values)).rowcount:
                raise StoreError(f"create schedule {row.id!r}: it already exists")
        return row

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

    def claim(
        self,
        conn: Any,
        sid: str,
        due: float,
        next_due: float | None,
        run: tuple[Any, ...] | None,
        new: tuple[Any, ...] | None,
        most: int | None,
        now: float,
    ) -> Claimed:
        """Move the schedule from `due` (compare and set: a second claimer waits for the
        first one's row lock, then finds next_due moved and claims nothing); with `run`,
        queue it, creating `new` first unless its user has `most` sessions."""
        with self.write(conn):
            cursor = conn.execute(
                self.q(
                    "UPDATE schedules SET next_due = ? WHERE id = ? AND next_due = ? AND paused = ?"
                ),
                [next_due, sid, due, self.flag(False)],
            )
            if not cursor.rowcount:
                return Claimed(False)
            if run is None:
                return Claimed(True)
            if new is not None and most is not None:
                count = self.count_sessions_locked(conn, new[3])
                if count >= most:
                    why = sessions_full(count, most)
                    conn.execute(
                        self.q("UPDATE schedules SET last_skip = ?, last_skip_at = ? WHERE id = ?"),
                        [why, due, sid],
                    )
                    return Claimed(True, why)
            conn.execute(
                self.q(
                    "UPDATE schedules SET runs = runs + 1, last_run_at = ?, last_session_id = ?,"
                    " last_skip = NULL, last_skip_at = NULL WHERE id = ?"
                ),
                [now, run[1], sid],
            )
            if new is not None:
                conn.execute(
                    self.q(
                        "INSERT INTO sessions (id, profile_id, title, user_id, created_at,"
                        " updated_at, meta) VALUES (?, ?, ?, ?, ?, ?, '{}')"
                    ),
                    [*new, now, now],
                )
            self.insert_queued(conn, run, now)
            return Claimed(True)

    def delete_schedule(self, conn: Any, sid: str) -> bool:
        with self.write(conn):
            return bool(conn.execute(self.q("DELETE FROM schedules WHERE id = ?"), [sid]).rowcount)

    def record_run_usage(self, conn: Any, usage: RunUsage, now: float, day: str) -> None:
        u = usage
        sql = self.q(
            "INSERT INTO run_usage (at, day, session_id, user_id, profile, model, kind,"
            " tokens_in, tokens_out, llm_sec, tool_sec) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        values = [
            now,
            day,
            u.session_id,
            u.user_id,
            u.profile,
            u.model,
            u.kind,
            u.tokens_in,
            u.tokens_out,
            u.llm_sec,
            u.tool_sec,
        ]
        with self.write(conn):
            conn.execute(sql, values)

    def usage_report(self, conn: Any, by: str, where: list[tuple[str, Any]]) -> list[UsageLine]:
        """Sums by (`by`'s column, model, kind); `where`: (column, value) pairs, ANDed,
        ``at`` meaning at or after."""
        column = {"session": "session_id", "user": "user_id"}.get(by, by)
        tests = [f"{c} >= ?" if c == "at" else f"{c} = ?" for c, _ in where]
        sql = (
            f"SELECT {column}, model, kind, COUNT(*), SUM(tokens_in), SUM(tokens_out),"
            " SUM(llm_sec), SUM(tool_sec) FROM run_usage"
            + (f" WHERE {' AND '.join(tests)}" if tests else "")
            + f" GROUP BY {column}, model, kind ORDER BY {column}, model, kind"
        )
        rows = conn.execute(self.q(sql), [v for _, v in where]).fetchall()
        return [
            UsageLine(
                str(r[0]),
                str(r[1]),
                str(r[2]),
                int(r[3]),
                int(r[4]),
                int(r[5]),
                float(r[6]),
                float(r[7]),
            )
            for r in rows
        ]

    def get_usage(self, conn: Any, keys: list[str]) -> dict[str, dict[str, float]]:
        where, params = self.any_of("key", keys)
        sql = f"SELECT key, {', '.join(USAGE_KINDS)} FROM usage WHERE {where}"
        return by_key(keys, conn.execute(sql, params).fetchall())

    def add_usage(self, conn: Any, keys: list[str], adds: dict[str, float], now: float) -> None:
        """Add in place (``n = usage.n + excluded.n``): concurrent adds never lose one."""
        cols = ", ".join(USAGE_KINDS)
        sets = ", ".join(f"{k} = usage.{k} + excluded.{k}" for k in USAGE_KINDS)
        sql = self.q(
            f"INSERT INTO usage (key, {cols}, updated_at) VALUES (?, ?, ?, ?, ?, ?)"
            f" ON CONFLICT (key) DO UPDATE SET {sets}, updated_at = excluded.updated_at"
        )
        with self.write(conn):
            for key in sorted(keys):  # one order for every writer: no deadlock between two
                conn.execute(sql, [key, *(adds[k] for k in USAGE_KINDS), now])

    def live_holds(self, conn: Any, keys: list[str], host: str, now: float) -> Usage:
        """Each key's live holds, summed; expired ones and those of a dead process on this
        host are deleted first (a crashed run's holds count no more)."""
        where, params = self.any_of("key", keys)
        sql = self.q(f"DELETE FROM usage_holds WHERE {where} AND expires_at <= {self.clock}")
        conn.execute(sql, [*params, *self.at(now)])
        sql = self.q(f"SELECT DISTINCT pid FROM usage_holds WHERE {where} AND host = ?")
        for (pid,) in conn.execute(sql, [*params, host]).fetchall():
            if not pid_alive(int(pid)):
                sql = self.q("DELETE FROM usage_holds WHERE pid = ? AND host = ?")
                conn.execute(sql, [pid, host])
        sums = ", ".join(f"SUM({k})" for k in USAGE_KINDS)
        sql = f"SELECT key, {sums} FROM usage_holds WHERE {where} GROUP BY key"
        return by_key(keys, conn.execute(sql, params).fetchall())

    def reserve(self, conn: Any, asks: list[UsageAsk], req: UsageRequest, now: float) -> UsageGrant:
        """Check and take in one write (see `SessionStore.reserve_usage`)."""
        keys = sorted(a.key for a in asks)  # one lock order for every reserver
        with self.write(conn):
            self.lock_usage(conn, keys, now)
            held = self.live_holds(conn, keys, req.host, now)
            spent = self.get_usage(conn, keys)
            granted, refused = decide(asks, req, spent, held)
            if refused is not None:
                return UsageGrant({}, refused, spent, held)
            amounts = taken(keys, granted, req, spent, held)
            if req.hold is None:
                self.add_usage(conn, keys, amounts, now)
                return UsageGrant(granted, None, spent, held)
            sql = self.q(
                f"INSERT INTO usage_holds (hold, key, {', '.join(USAGE_KINDS)}, pid, host,"
                f" expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, {self.clock} + ?)"
            )
            for key in keys:
                at = [*amounts.values(), req.pid, req.host, *self.at(now), req.ttl]
                conn.execute(sql, [req.hold, key, *at])
            return UsageGrant(granted, None, spent, held)

    def settle(self, conn: Any, adds: Usage, holds: list[str], now: float) -> Usage:
        """Add what calls used and drop their holds, in one write; the counters after."""
        if not holds and not any(any(a.values()) for a in adds.values()):
            return self.get_usage(conn, list(adds)) if adds else {}  # nothing to write
        with self.write(conn):
            for key in sorted(adds):
                if any(adds[key].values()):
                    self.add_usage(conn, [key], adds[key], now)
            if holds:
                where, params = self.any_of("hold", holds)
                conn.execute(f"DELETE FROM usage_holds WHERE {where}", params)
            return self.get_usage(conn, list(adds)) if adds else {}
