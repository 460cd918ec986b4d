"""Sessions and their history on SQLite: the statements whose SQL is this engine's own,
run on the worker thread. A save appends what is new to `messages` (what the user sees)
and `context` (what the LLM sees), in one transaction with the queued row it dequeues.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from navi_trio.store._input import (
    _Row,
    not_queued,
)
from navi_trio.store._queue import _claim
from navi_trio.store._schema import SQLITE, _write_tx
from navi_trio.store.fence import Fence


def _insert_history(
    db: sqlite3.Connection,
    table: str,
    sid: str,
    rows: Sequence[_Row],
    positions: Sequence[float],
    now: float,
) -> None:
    db.executemany(
        f"INSERT INTO {table} (session_id, position, role, content, is_plan, data, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (sid, pos, r.role, r.content, int(r.is_plan), r.data, now)
            for pos, r in zip(positions, rows, strict=True)
        ],
    )


def _next_positions(db: sqlite3.Connection, table: str, sid: str, count: int) -> list[float]:
    top = db.execute(
        f"SELECT COALESCE(MAX(position), 0) FROM {table} WHERE session_id = ?", [sid]
    ).fetchone()[0]
    return [float(top) + i for i in range(1, count + 1)]


def _append(
    db: sqlite3.Connection,
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
            SQLITE.renew_lease(db, sid, fence.owner, renew, fence.generation, now)
        SQLITE.require_session(db, sid)
        if dequeue is not None and not _claim(db, sid, dequeue):
            raise not_queued(sid, dequeue)
        for table, rows in (("messages", msg_rows), ("context", ctx_rows)):
            if rows:
                positions = _next_positions(db, table, sid, len(rows))
                _insert_history(db, table, sid, rows, positions, now)
        db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", [now, sid])
