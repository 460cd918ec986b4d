"""The queued table: user messages kept until their run appends them (an
acknowledged message survives a crash).

A message that arrives while its session runs is queued; the daemon acknowledges it
only once its row here is committed. The row leaves in the same transaction that
appends the message to the history when its run starts (`_append`'s `dequeue`), so a
message is in exactly one of the two places at every commit: never lost, never twice.

Each row names the process that queued it (pid, host), as a lease does: after a crash
another process adopts the rows of a dead one (`_adopt`), never those of a live one,
which runs them itself. A row of pid `HANDED_PID` is anyone's: handed to whoever runs
the session (by another daemon, or by a process that found its session taken over and
left its queue to the new owner: `release_queued`).

The queue's cap (`enqueue(keep=N)`) is the store's, in the insert's transaction: past
N rows the oldest go, and are returned, so that every process that queues counts the
same rows the same way.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from navi_trio.store._lease import pid_alive
from navi_trio.store._schema import SQLITE, _write_tx
from navi_trio.store.base import HANDED_PID, KeyClaim


def _enqueue(
    db: sqlite3.Connection,
    sid: str,
    key: str,
    data: str,
    pid: int,
    host: str,
    now: float,
    keep: int | None,
    claim: KeyClaim | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    with _write_tx(db):
        if claim is not None:
            SQLITE.claim_key(db, sid, claim, now)
        db.execute(
            "INSERT INTO queued (key, session_id, pid, host, data, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [key, sid, pid, host, data, now],
        )
        if keep is None:
            return []
        over = db.execute(
            "SELECT id, key, data FROM queued WHERE session_id = ? ORDER BY id DESC"
            " LIMIT -1 OFFSET ?",
            [sid, keep],
        ).fetchall()
        for row_id, _, _ in over:
            db.execute("DELETE FROM queued WHERE id = ?", [row_id])
        return [(k, json.loads(d)) for _, k, d in reversed(over)]


def _claim(db: sqlite3.Connection, sid: str, key: str) -> bool:
    """Inside an append's transaction: take the row off the queue; False when gone."""
    return bool(
        db.execute("DELETE FROM queued WHERE key = ? AND session_id = ?", [key, sid]).rowcount
    )


def _adopt(
    db: sqlite3.Connection, sid: str, pid: int, host: str, now: float
) -> list[tuple[str, dict[str, Any]]]:
    """The session's rows left by a dead process on this host, handed to anyone, or
    ours, or every row while we hold the session's lease (the holder runs the queue):
    now ours."""
    # Every actor start asks: without rows (nearly always) no write lock is taken.
    if db.execute("SELECT 1 FROM queued WHERE session_id = ? LIMIT 1", [sid]).fetchone() is None:
        return []
    with _write_tx(db):
        lease = db.execute(
            "SELECT pid, host, expires_at FROM leases WHERE session_id = ?", [sid]
        ).fetchone()
        holding = lease is not None and (lease[0], lease[1]) == (pid, host) and lease[2] > now
        rows = db.execute(
            "SELECT key, pid, host, data FROM queued WHERE session_id = ? ORDER BY id", [sid]
        ).fetchall()
        out: list[tuple[str, dict[str, Any]]] = []
        for key, row_pid, row_host, data in rows:
            other = row_pid not in (HANDED_PID, pid)
            if other and (row_host != host or pid_alive(row_pid)) and not holding:
                continue  # a live process (or one we cannot probe) runs it
            db.execute("UPDATE queued SET pid = ?, host = ? WHERE key = ?", [pid, host, key])
            out.append((key, json.loads(data)))
        return out
