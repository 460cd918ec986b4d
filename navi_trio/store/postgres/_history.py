"""Sessions, their history and context on PostgreSQL: the statements, on a worker thread.

Each function runs inside the job's transaction (`_workers.Job`); `append`, the write of
every round, is one statement instead (navi_append, migrations/0005): one round trip,
its own transaction. Every write to one session's history first locks that session's row
(``UPDATE … `` or ``SELECT … FOR UPDATE``): writers of one session take turns, so the
next position is read after the previous writer committed, and a load that repairs
sees no append slip in between. Writers of different sessions never wait for each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import psycopg
import psycopg.errors as pg
from psycopg import sql

from navi_trio.errors import SessionExistsError, StoreError
from navi_trio.store._input import _prepare, _Rewrite, _Row, not_queued, page_end
from navi_trio.store.base import HistoryPage, LoadedSession, SessionRow
from navi_trio.store.fence import Fence
from navi_trio.store.postgres import _tables as t
from navi_trio.store.postgres._tables import check_fence
from navi_trio.store.postgres._workers import Conn
from navi_trio.store.repair import placeholder_positions, repair_dangling_tool_calls
from navi_trio.store.statements import session_from
from navi_trio.text import loads_clean

T = TypeVar("T")
HISTORY = ("messages", "context")
_COLS = "id, profile_id, title, user_id, created_at, updated_at, meta"


NO_SESSION = "NV002"  # navi_append's, for a session that is not there (migrations/0005)


def insert_session(
    conn: Conn, row: SessionRow, meta_json: str, most: int | None = None
) -> int | None:
    """Insert the row; with `most`, not when the user has that many sessions already:
    then how many they have (else None)."""
    if most is not None and (count := t.PG.count_sessions_locked(conn, row.user_id)) >= most:
        return count
    inserted = conn.execute(
        f"INSERT INTO sessions ({_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (id) DO NOTHING RETURNING 1",
        [row.id, row.profile_id, row.title, row.user_id, row.created_at, row.updated_at, meta_json],
    ).fetchone()
    if inserted is None:
        raise SessionExistsError(f"session {row.id!r} already exists")
    return None


def update_session(
    conn: Conn, sid: str, changes: dict[str, Any], fence: Fence | None = None
) -> None:
    check_fence(conn, fence)
    # Column names come from update_session's fixed keyword set, never from callers.
    sets = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in changes)
    query = sql.SQL("UPDATE sessions SET {} WHERE id = %s RETURNING 1").format(sets)
    if conn.execute(query, [*changes.values(), sid]).fetchone() is None:
        raise StoreError(f"no session {sid!r} in the store")


def delete_session(conn: Conn, sid: str) -> bool:
    """The session, its history, context, queued messages and kv rows `sid` / `sid:…`."""
    if conn.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", [sid]).fetchone() is None:
        deleted = False
    else:
        deleted = True
        conn.execute("DELETE FROM messages WHERE session_id = %s", [sid])
        conn.execute("DELETE FROM context WHERE session_id = %s", [sid])
        conn.execute("DELETE FROM queued WHERE session_id = %s", [sid])
        conn.execute("DELETE FROM wakes WHERE session_id = %s", [sid])
        conn.execute("DELETE FROM usage WHERE key = %s", [f"session:{sid}"])
        conn.execute("DELETE FROM usage_holds WHERE key = %s", [f"session:{sid}"])
        conn.execute("DELETE FROM schedules WHERE session_id = %s", [sid])
        conn.execute("DELETE FROM sessions WHERE id = %s", [sid])
    # starts_with, not LIKE: ids may contain LIKE's wildcard `_`. Rows of a session that
    # is gone go too (the SQLite store does the same).
    conn.execute("DELETE FROM kv WHERE key = %s OR starts_with(key, %s)", [sid, sid + ":"])
    return deleted


def pg_text(text: str | None) -> str | None:
    """A query column's copy of a text: PostgreSQL text cannot hold NUL (`data` keeps it)."""
    return None if text is None else text.replace("\x00", "\ufffd")


def _columns(rows: Sequence[_Row]) -> list[str]:
    """`rows` as four array literals, role, content, is_plan and data: the parameters of
    an INSERT of many rows (`_insert_history`, navi_append), each cast to its array type
    in the query. Written here, not left to psycopg's list adapter: its escaping of each
    element (a regular expression per element) was most of an append's Python work."""
    return [
        t.text_array(pg_text(r.role) for r in rows),
        t.text_array(pg_text(r.content) for r in rows),
        "{" + ",".join("t" if r.is_plan else "f" for r in rows) + "}",
        t.text_array(r.data for r in rows),
    ]


def _insert_history(
    conn: Conn,
    table: str,
    sid: str,
    rows: Sequence[_Row],
    positions: Sequence[float],
    now: float,
) -> None:
    """One INSERT for all `rows`, at `positions` (an append's go after the last rows, in
    navi_append)."""
    if not rows:
        return
    query = sql.SQL(
        "INSERT INTO {} (session_id, position, role, content, is_plan, data, created_at)"
        " SELECT %s, (%s::float8[])[t.ord], t.role, t.content, t.is_plan, t.data, %s"
        " FROM unnest(%s::text[], %s::text[], %s::bool[], %s::text[])"
        " WITH ORDINALITY AS t(role, content, is_plan, data, ord)"
    ).format(sql.Identifier(table))
    conn.execute(query, [sid, list(positions), now, *_columns(rows)])


def append(
    conn: Conn,
    sid: str,
    msg_rows: list[_Row],
    ctx_rows: list[_Row],
    now: float,
    dequeue: str | None,
    fence: Fence | None = None,
    *,
    durable: bool = True,
    renew: float | None = None,
) -> None:
    """navi_append (migrations/0005): it fences, locks the session's row and inserts
    after the last rows; one statement, its own transaction (an autocommit job). With
    `dequeue`, a transaction of three: the fence and the session's row first (in that
    order, as navi_append), then the queued row taken off the queue, compare and set
    (NotQueuedError, nothing stored, when another daemon took it first or the cap
    dropped it), then navi_append. With `renew` (and a fence), the lease's expiry is
    extended first, in the same transaction: the row it names stays locked to the
    commit, and a lease that is not the fence's is left alone and refused by the fence."""
    owner, generation = (fence.owner, fence.generation) if fence is not None else (None, None)
    try:
        if renew is not None and fence is not None:
            t.renew_lease(conn, sid, fence.owner, renew, fence.generation, now)
        if dequeue is not None:
            check_fence(conn, fence)
            t.PG.lock_session(conn, sid)
            taken = conn.execute(
                "DELETE FROM queued WHERE key = %s AND session_id = %s RETURNING 1", [dequeue, sid]
            ).fetchone()
            if taken is None:
                raise not_queued(sid, dequeue)
        conn.execute(
            "SELECT navi_append(%s, %s, %s, %s, %s, %s, %s::text[], %s::text[], %s::bool[],"
            " %s::text[], %s::text[], %s::text[], %s::bool[], %s::text[])",
            [sid, owner, generation, now, None, durable, *_columns(msg_rows), *_columns(ctx_rows)],
        )
    except psycopg.Error as exc:
        if exc.sqlstate == NO_SESSION or isinstance(exc, pg.ForeignKeyViolation):
            raise StoreError(f"no session {sid!r} in the store") from None
        raise


def load_page(conn: Conn, sid: str, after: float | None, limit: int, max_bytes: int) -> HistoryPage:
    """One page of the display history: the sizes first (octet_length reads a stored
    value's length without its data), then the data of that page alone."""
    t.PG.require_session(conn, sid)
    where, params = ("AND position > %s", [after]) if after is not None else ("", [])
    sizes = conn.execute(
        f"SELECT position, octet_length(data) FROM messages WHERE session_id = %s {where}"
        " ORDER BY position LIMIT %s",
        [sid, *params, limit + 1],
    ).fetchall()
    end = page_end(sizes, limit, max_bytes)
    if end is None:
        return HistoryPage(messages=[], next_after=None)
    last, more = end
    rows = conn.execute(
        f"SELECT data FROM messages WHERE session_id = %s {where} AND position <= %s"
        " ORDER BY position",
        [sid, *params, last],
    )
    messages = [loads_clean(r[0]) for r in rows]
    return HistoryPage(messages=messages, next_after=last if more else None)


def replace_context(
    conn: Conn, sid: str, rows: list[_Row], now: float, fence: Fence | None = None
) -> None:
    check_fence(conn, fence)
    t.PG.lock_session(conn, sid)
    conn.execute("DELETE FROM context WHERE session_id = %s", [sid])
    _insert_history(conn, "context", sid, rows, [float(i) for i in range(1, len(rows) + 1)], now)


def rewrite(conn: Conn, sid: str, job: _Rewrite, now: float, fence: Fence | None = None) -> None:
    """A rewind or a branch brought back (SessionStore.rewrite_history), under the lock."""
    check_fence(conn, fence)  # a replaced owner must not rewind its successor's session
    t.PG.lock_session(conn, sid)
    positions = [
        r[0]
        for r in conn.execute(
            "SELECT position FROM messages WHERE session_id = %s ORDER BY position", [sid]
        )
    ]
    if job.keep > len(positions):
        raise StoreError(f"session {sid!r} has {len(positions)} messages, not {job.keep} to keep")
    top = float(positions[job.keep - 1]) if job.keep else 0.0
    conn.execute("DELETE FROM messages WHERE session_id = %s AND position > %s", [sid, top])
    after = [top + i for i in range(1, len(job.messages) + 1)]
    _insert_history(conn, "messages", sid, job.messages, after, now)
    replace_context(conn, sid, job.context, now)
    for scope, key, value in job.kv_set:
        t.PG.kv_set(conn, scope, key, value, now)
    for scope, key in job.kv_delete:
        t.PG.kv_delete(conn, scope, key)
    conn.execute("UPDATE sessions SET updated_at = %s WHERE id = %s", [now, sid])


def load_session(
    conn: Conn, sid: str, now: float, fence: Fence | None = None
) -> LoadedSession | None:
    check_fence(conn, fence)  # a replaced owner must not "repair" its successor's calls
    row = conn.execute(f"SELECT {_COLS} FROM sessions WHERE id = %s FOR UPDATE", [sid]).fetchone()
    if row is None:
        return None
    loaded: dict[str, list[dict[str, Any]]] = {}
    repaired = 0
    for table in HISTORY:
        query = sql.SQL(
            "SELECT position, data FROM {} WHERE session_id = %s ORDER BY position"
        ).format(sql.Identifier(table))
        records = conn.execute(query, [sid]).fetchall()
        items = [loads_clean(r[1]) for r in records]  # lone surrogates: U+FFFD
        fixed, inserted = repair_dangling_tool_calls(items)
        if inserted:
            positions = placeholder_positions([r[0] for r in records], inserted)
            rows = _prepare([ph for _, ph in inserted], f"{table} placeholders")
            _insert_history(conn, table, sid, rows, positions, now)
        loaded[table] = fixed
        repaired += len(inserted)
    return LoadedSession(
        row=session_from(row),
        messages=loaded["messages"],
        context=loaded["context"],
        repaired=repaired,
    )
