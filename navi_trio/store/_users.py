"""The users table: who may connect, with which role; only a digest of each token.

The statements of the SQLite store (store/methods.py has the methods), run on the
worker thread. A token is stored as its SHA-256 (tokens are
random secrets, so no salt is needed) and two users never share one.

Every change of the table (add, remove, rotate) is signalled once it is committed: the
store rewrites the users marker beside the database (``navi.db-users``), which a daemon
on this file watches (store/_users_signal.py), so a token revoked by `navi users` in
another process reaches the daemon's open connections at once. Removing a user also
removes, in the same transaction, their schedules and their queued messages: nothing
of theirs runs again; their sessions stay until an admin deletes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlite_utils import Database

from navi_trio.errors import StoreError
from navi_trio.store._schema import _write_tx
from navi_trio.store.statements import TOKEN_TAKEN, USER_COLS, user_dict


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


def _insert_user(db: Database, user: dict[str, Any], digest: str) -> None:
    with _write_tx(db):
        if db.execute("SELECT 1 FROM users WHERE token_sha256 = ?", [digest]).fetchone():
            raise StoreError(TOKEN_TAKEN)
        db.execute(
            "INSERT INTO users (id, name, token_sha256, role, created_at) VALUES (?, ?, ?, ?, ?)",
            [user["id"], user["name"], digest, user["role"], user["created_at"]],
        )


def _user_where(db: Database, column: str, value: str) -> dict[str, Any] | None:
    # `column` is one of two literals from the callers above, never user input.
    row = db.execute(f"SELECT {USER_COLS} FROM users WHERE {column} = ?", [value]).fetchone()
    return None if row is None else user_dict(row)


def user_by_name(db: Database, name: str) -> dict[str, Any] | None:
    return _user_where(db, "name", name)


def _remove_user(db: Database, name: str) -> bool:
    with _write_tx(db):
        ids = [r[0] for r in db.execute("SELECT id FROM users WHERE name = ?", [name])]
        for user_id in ids:
            db.execute("DELETE FROM schedules WHERE user_id = ?", [user_id])
        rows = db.execute("SELECT key, data FROM queued").fetchall()
        for key in queued_of(rows, set(ids)):
            db.execute("DELETE FROM queued WHERE key = ?", [key])
        return bool(db.execute("DELETE FROM users WHERE name = ?", [name]).rowcount)
