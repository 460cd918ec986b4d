"""The queued table: user messages kept until their run appends them (issue 11: an
acknowledged message survives a crash).

A message that arrives while its session runs is queued; the daemon acknowledges it
only once its row here is committed. The row leaves in the same transaction that
appends the message to the history when its run starts (`_append`'s `dequeue`), so a
message is in exactly one of the two places at every commit: never lost, never twice.

Each row names the process that queued it (pid, host), as a lease does: after a crash
another process adopts the rows of a dead one (`_adopt`), never those of a live one,
which runs them itself.

`_Queue` holds the store's queue methods (mixed into `SQLiteStore`); below it, the
functions that run on the worker thread.
"""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database

from navi_trio.store._core import _Core
from navi_trio.store._input import _check_text, _dump, check_session_id
from navi_trio.store._lease import pid_alive
from navi_trio.store._schema import _write_tx


class _Queue(_Core):
    async def enqueue(
        self, session_id: str, key: str, message: dict[str, Any], *, pid: int, host: str
    ) -> None:
        """Keep a queued user message until its run appends it (`append(dequeue=key)`)."""
        sid = check_session_id(session_id)
        _check_text(key, "queued message key")
        data = _dump(message, f"queued message of {sid!r}")
        now = self._now()
        await self._run(
            f"queue a message in {sid!r}", lambda db: _enqueue(db, sid, key, data, pid, host, now)
        )

    async def unqueue(self, key: str) -> bool:
        """Forget a queued message (dropped from a full queue). False when not there."""
        _check_text(key, "queued message key")
        return await self._run(f"unqueue message {key!r}", lambda db: _unqueue(db, key))

    async def adopt_queued(
        self, session_id: str, *, pid: int, host: str
    ) -> list[tuple[str, dict[str, Any]]]:
        """(key, message) of the session's queued messages that no live process owns
        (theirs: same host, pid gone; or ours), in queued order, now owned by `pid`."""
        sid = check_session_id(session_id)
        return await self._run(
            f"adopt queued messages of {sid!r}", lambda db: _adopt(db, sid, pid, host)
        )

    async def queued_sessions(self) -> list[str]:
        """Ids of the sessions with queued messages."""
        return await self._run("list sessions with queued messages", _queued_sessions)


def _enqueue(db: Database, sid: str, key: str, data: str, pid: int, host: str, now: float) -> None:
    with _write_tx(db):
        db.execute(
            "INSERT INTO queued (key, session_id, pid, host, data, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [key, sid, pid, host, data, now],
        )


def _unqueue(db: Database, key: str) -> bool:
    with _write_tx(db):
        return bool(db.execute("DELETE FROM queued WHERE key = ?", [key]).rowcount)


def _adopt(db: Database, sid: str, pid: int, host: str) -> list[tuple[str, dict[str, Any]]]:
    """The session's rows left by a dead process on this host (or by us), now ours."""
    # Every actor start asks: without rows (nearly always) no write lock is taken.
    if db.execute("SELECT 1 FROM queued WHERE session_id = ? LIMIT 1", [sid]).fetchone() is None:
        return []
    with _write_tx(db):
        rows = db.execute(
            "SELECT key, pid, host, data FROM queued WHERE session_id = ? ORDER BY id", [sid]
        ).fetchall()
        out: list[tuple[str, dict[str, Any]]] = []
        for key, row_pid, row_host, data in rows:
            if row_pid != pid and (row_host != host or pid_alive(row_pid)):
                continue  # a live process (or one we cannot probe) runs it
            db.execute("UPDATE queued SET pid = ?, host = ? WHERE key = ?", [pid, host, key])
            out.append((key, json.loads(data)))
        return out


def _queued_sessions(db: Database) -> list[str]:
    rows = db.execute("SELECT DISTINCT session_id FROM queued ORDER BY session_id").fetchall()
    return [r[0] for r in rows]
