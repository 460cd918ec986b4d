"""The history tables: `messages` (what the user sees) and `context` (what the LLM sees).

The statements of the SQLite store (store/methods.py has the methods), run on the
worker thread. A save appends what is new, in one
transaction with the queued row it dequeues (`_queue`); only `replace_context`
(compression) rewrites. `load_session` repairs dangling tool calls (`repair`) and
stores the placeholders between their neighbours' positions, in the same job.
`rewrite_history` (a rewind, a branch brought back) cuts the display history after a
number of messages, appends others, swaps the context and writes the kv rows that keep
what was cut, all in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlite_utils import Database

from navi_trio.errors import StoreError
from navi_trio.store._input import (
    _prepare,
    _Rewrite,
    _Row,
    not_queued,
    page_end,
)
from navi_trio.store._lease import renew_lease
from navi_trio.store._queue import _claim
from navi_trio.store._schema import _HISTORY, SQLITE, _write_tx
from navi_trio.store.base import HistoryPage, LoadedSession
from navi_trio.store.fence import Fence
from navi_trio.store.repair import placeholder_positions, repair_dangling_tool_calls
from navi_trio.text import loads_clean


def _insert_history(
    db: Database,
    table: str,
    sid: str,
    rows: Sequence[_Row],
    positions: Sequence[float],
    now: float,
) -> None:
    db.conn.executemany(
        f"INSERT INTO {table} (session_id, position, role, content, is_plan, data, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (sid, pos, r.role, r.content, int(r.is_plan), r.data, now)
            for pos, r in zip(positions, rows, strict=True)
        ],
    )


def _next_positions(db: Database, table: str, sid: str, count: int) -> list[float]:
    top = db.execute(
        f"SELECT COALESCE(MAX(position), 0) FROM {table} WHERE session_id = ?", [sid]
    ).fetchone()[0]
    return [float(top) + i for i in range(1, count + 1)]


def _append(
    db: Database,
    sid: str,
    msg_rows: list[_Row],
    ctx_rows: list[_Row],
    now: float,
    dequeue: str | None = None,
    fence: Fence | None = None,
    *,
    durable: bool = True,
    renew: float | None = None,
) -> None:
    # `durable` is the worker's: it commits without the fsync (store/sqlite.py).
    with _write_tx(db):
        SQLITE.check_fence(db, fence)
        if renew is not None and fence is not None:  # the row is the fence's: just checked
            renew_lease(db, sid, fence.owner, renew, fence.generation, now)
        SQLITE.require_session(db, sid)
        if dequeue is not None and not _claim(db, sid, dequeue):
            raise not_queued(sid, dequeue)
        for table, rows in (("messages", msg_rows), ("context", ctx_rows)):
            if rows:
                positions = _next_positions(db, table, sid, len(rows))
                _insert_history(db, table, sid, rows, positions, now)
        db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", [now, sid])


def _load_page(
    db: Database, sid: str, after: float | None, limit: int, max_bytes: int
) -> HistoryPage:
    SQLITE.require_session(db, sid)
    where, params = ("AND position > ?", [after]) if after is not None else ("", [])
    # The sizes first, stepped lazily: the rows past the page are never read. The data is
    # ASCII JSON (store/_input.py `_dump`): its length is its size in bytes.
    sizes = db.execute(
        f"SELECT position, length(data) FROM messages WHERE session_id = ? {where}"
        " ORDER BY position LIMIT ?",
        [sid, *params, limit + 1],
    )
    try:
        end = page_end(sizes, limit, max_bytes)
    finally:
        sizes.close()
    if end is None:
        return HistoryPage(messages=[], next_after=None)
    last, more = end
    rows = db.execute(
        f"SELECT data FROM messages WHERE session_id = ? {where} AND position <= ?"
        " ORDER BY position",
        [sid, *params, last],
    ).fetchall()
    messages = [loads_clean(r[0]) for r in rows]  # an older version stored lone surrogates
    return HistoryPage(messages=messages, next_after=last if more else None)


def _replace_context(
    db: Database, sid: str, rows: list[_Row], now: float, fence: Fence | None
) -> None:
    with _write_tx(db):
        SQLITE.check_fence(db, fence)
        SQLITE.require_session(db, sid)
        db.execute("DELETE FROM context WHERE session_id = ?", [sid])
        _insert_history(db, "context", sid, rows, [float(i) for i in range(1, len(rows) + 1)], now)


def _rewrite(db: Database, sid: str, job: _Rewrite, now: float, fence: Fence | None) -> None:
    with _write_tx(db):
        SQLITE.check_fence(db, fence)  # a replaced owner must not rewind its successor's session
        SQLITE.require_session(db, sid)
        count = db.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", [sid]).fetchone()
        if job.keep > count[0]:
            raise StoreError(f"session {sid!r} has {count[0]} messages, not {job.keep} to keep")
        top = 0.0
        if job.keep:
            top = db.execute(
                "SELECT position FROM messages WHERE session_id = ? ORDER BY position"
                " LIMIT 1 OFFSET ?",
                [sid, job.keep - 1],
            ).fetchone()[0]
        db.execute("DELETE FROM messages WHERE session_id = ? AND position > ?", [sid, top])
        positions = [top + i for i in range(1, len(job.messages) + 1)]
        _insert_history(db, "messages", sid, job.messages, positions, now)
        _replace_context(db, sid, job.context, now, None)  # the fence is checked above
        for scope, key, value in job.kv_set:
            SQLITE.kv_set(db, scope, key, value, now)
        for scope, key in job.kv_delete:
            SQLITE.kv_delete(db, scope, key)
        db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", [now, sid])


def _load_session(db: Database, sid: str, now: float, fence: Fence | None) -> LoadedSession | None:
    row = SQLITE.get_session(db, sid)
    if row is None:
        return None
    loaded: dict[str, list[dict[str, Any]]] = {}
    repaired = 0
    # One job on the one thread: no append can slip between reading and repairing.
    with _write_tx(db):
        SQLITE.check_fence(db, fence)  # a replaced owner must not "repair" its successor's calls
        for table in _HISTORY:
            records = db.execute(
                f"SELECT position, data FROM {table} WHERE session_id = ? ORDER BY position",
                [sid],
            ).fetchall()
            items = [loads_clean(r[1]) for r in records]  # lone surrogates: U+FFFD
            fixed, inserted = repair_dangling_tool_calls(items)
            if inserted:
                positions = placeholder_positions([r[0] for r in records], inserted)
                rows = _prepare([ph for _, ph in inserted], f"{table} placeholders")
                _insert_history(db, table, sid, rows, positions, now)
            loaded[table] = fixed
            repaired += len(inserted)
    return LoadedSession(
        row=row, messages=loaded["messages"], context=loaded["context"], repaired=repaired
    )
