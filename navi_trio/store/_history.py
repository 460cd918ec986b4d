"""Sessions and their history on SQLite: the statements whose SQL is this engine's own,
run on the worker thread. A save appends what is new to `messages` (what the user sees)
and `context` (what the LLM sees), in one transaction with the queued row it dequeues.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import NoReturn

from navi_trio.store._input import (
    _Row,
    not_queued,
)
from navi_trio.store._queue import _claim
from navi_trio.store._schema import SQLITE, _write_tx
from navi_trio.store.base import KeyClaim
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
    claim: KeyClaim | None = None,
    owes_end: bool = False,
) -> None:
    """The append of a round, in few statements: the lease's renewal (when asked) is the
    fence's check, the session's ``updated_at`` its presence (and, without a renewal, the
    fence's check too), and each row takes its position in its own INSERT. Only when one
    of them finds nothing are the lease and the session read, to say which was missing."""
    # `durable` is the worker's: it commits without the fsync (store/sqlite.py).
    held = fence
    with _write_tx(db):
        if renew is not None and fence is not None:
            if not _renewed(db, fence, renew, now):
                _refuse(db, sid, fence)
            fence = None  # checked: the renewal matched its owner and generation
        if not _touched(db, sid, fence, now):
            _refuse(db, sid, fence)
        if owes_end and held is not None:
            SQLITE.owe_end(db, held)
        if dequeue is not None and not _claim(db, sid, dequeue):
            raise not_queued(sid, dequeue)
        if claim is not None:
            SQLITE.claim_key(db, sid, claim, now)
        for table, rows in (("messages", msg_rows), ("context", ctx_rows)):
            if rows:
                _insert_next(db, table, sid, rows, now)


def _renewed(db: sqlite3.Connection, fence: Fence, ttl: float, now: float) -> bool:
    """The fence's lease renewed to `ttl` s from `now`: False when its row is no longer
    the fence's (`renew_lease` naming the generation, without its own savepoint)."""
    cursor = db.execute(
        "UPDATE leases SET expires_at = ? + ? WHERE session_id = ? AND owner = ?"
        " AND generation = ?",
        [now, ttl, fence.session_id, fence.owner, fence.generation],
    )
    return cursor.rowcount == 1


def _touched(db: sqlite3.Connection, sid: str, fence: Fence | None, now: float) -> bool:
    """The session's ``updated_at`` set to `now`; False when it is not there or (with
    `fence`) its lease is not the fence's."""
    if fence is None:
        sql, params = "UPDATE sessions SET updated_at = ? WHERE id = ?", [now, sid]
    else:
        sql = (
            "UPDATE sessions SET updated_at = ? WHERE id = ? AND EXISTS (SELECT 1 FROM leases"
            " WHERE session_id = ? AND owner = ? AND generation = ?)"
        )
        params = [now, sid, fence.session_id, fence.owner, fence.generation]
    return db.execute(sql, params).rowcount == 1


def _refuse(db: sqlite3.Connection, sid: str, fence: Fence | None) -> NoReturn:
    """Why a write found no row: the lease lost (LeaseLostError) before no session
    (StoreError), as the checks one by one would say."""
    SQLITE.check_fence(db, fence)
    SQLITE.require_session(db, sid)
    raise AssertionError(f"session {sid!r}: a write matched no row, yet both checks pass")


def _insert_next(
    db: sqlite3.Connection, table: str, sid: str, rows: Sequence[_Row], now: float
) -> None:
    """`rows` after the session's last in `table`, at the next whole positions: each
    INSERT reads the position the one before it wrote."""
    db.executemany(
        f"INSERT INTO {table} (session_id, position, role, content, is_plan, data, created_at)"
        f" SELECT ?, COALESCE(MAX(position), 0) + 1.0, ?, ?, ?, ?, ? FROM {table}"
        " WHERE session_id = ?",
        [(sid, r.role, r.content, int(r.is_plan), r.data, now, sid) for r in rows],
    )
