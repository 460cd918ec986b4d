"""The users table: who may connect, with which role; only a digest of each token.

`_Users` holds the store's user methods (mixed into `SQLiteStore`); below it, the
functions that run on the worker thread. A token is stored as its SHA-256 (tokens are
random secrets, so no salt is needed) and two users never share one.

Every change of the table (add, remove, rotate) is signalled once it is committed: the
store rewrites the users marker beside the database (``navi.db-users``), which a daemon
on this file watches (store/_users_signal.py), so a token revoked by `navi users` in
another process reaches the daemon's open connections at once. Removing a user also
removes, in the same transaction, their schedules and their queued messages: nothing
of theirs runs again; their sessions stay until an admin deletes them.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import trio
from sqlite_utils import Database

from navi_trio.errors import StoreError
from navi_trio.store._core import _Core
from navi_trio.store._input import _check_text
from navi_trio.store._schema import _write_tx
from navi_trio.store._users_signal import (
    signal_users_changed,
    users_marker,
    watch_users_marker,
)


class _Users(_Core):
    @property
    def users_marker(self) -> Path:
        """The file rewritten after every change of the users table (see the module)."""
        return users_marker(self.path)

    async def _users_changed(self) -> None:
        await trio.to_thread.run_sync(signal_users_changed, self.users_marker)

    async def watch_users(
        self,
        changed: Callable[[], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call `changed()` after each committed change of the users table, whichever
        process made it, until cancelled; started once the watch is in place."""
        await watch_users_marker(self.users_marker, changed, task_status=task_status)

    async def create_user(self, name: str, token: str, role: str = "user") -> dict[str, Any]:
        """Add a user; only a SHA-256 of the token is stored (tokens are random secrets)."""
        _check_text(name, "user name")
        _check_text(role, "user role")
        user = {
            "id": "u-" + uuid.uuid4().hex[:12],
            "name": name,
            "role": role,
            "created_at": self._now(),
        }
        digest = _token_digest(token)
        await self._run(f"create user {name!r}", lambda db: _insert_user(db, user, digest))
        await self._users_changed()
        return dict(user)

    async def get_user_by_token(self, token: str) -> dict[str, Any] | None:
        digest = _token_digest(token)
        return await self._run("find user by token", lambda db: _user_by_digest(db, digest))

    async def list_users(self) -> list[dict[str, Any]]:
        """Every user (id, name, role, created_at), oldest first; never a token."""
        return await self._run("list users", _list_users)

    async def get_user(self, user_id: str) -> dict[str, Any] | None:
        _check_text(user_id, "user id")
        return await self._run(f"get user {user_id}", lambda db: _user_where(db, "id", user_id))

    async def get_user_by_name(self, name: str) -> dict[str, Any] | None:
        _check_text(name, "user name")
        return await self._run(f"get user {name!r}", lambda db: _user_where(db, "name", name))

    async def remove_user(self, name: str) -> bool:
        """Remove the user called `name`, with their schedules and queued messages (their
        sessions stay); False when unknown."""
        _check_text(name, "user name")
        removed = await self._run(f"remove user {name!r}", lambda db: _remove_user(db, name))
        if removed:
            await self._users_changed()
        return removed

    async def rotate_user_token(self, name: str, token: str) -> bool:
        """Replace the token of `name`: the old one stops working. False when unknown."""
        _check_text(name, "user name")
        digest = _token_digest(token)
        rotated = await self._run(
            f"rotate token of {name!r}", lambda db: _rotate_token(db, name, digest)
        )
        if rotated:
            await self._users_changed()
        return rotated


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


def _token_digest(token: object) -> str:
    token = _check_text(token, "user token")
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _insert_user(db: Database, user: dict[str, Any], digest: str) -> None:
    with _write_tx(db):
        if db.execute("SELECT 1 FROM users WHERE token_sha256 = ?", [digest]).fetchone():
            raise StoreError("a user with this token already exists; tokens must be unique")
        db.execute(
            "INSERT INTO users (id, name, token_sha256, role, created_at) VALUES (?, ?, ?, ?, ?)",
            [user["id"], user["name"], digest, user["role"], user["created_at"]],
        )


def _user_by_digest(db: Database, digest: str) -> dict[str, Any] | None:
    row = db.execute(
        "SELECT id, name, role, created_at FROM users WHERE token_sha256 = ?", [digest]
    ).fetchone()
    if row is None:
        return None
    return {"id": row[0], "name": row[1], "role": row[2], "created_at": row[3]}


_USER_COLS = "id, name, role, created_at"


def _user_dict(row: Sequence[Any]) -> dict[str, Any]:
    return {"id": row[0], "name": row[1], "role": row[2], "created_at": row[3]}


def _list_users(db: Database) -> list[dict[str, Any]]:
    rows = db.execute(f"SELECT {_USER_COLS} FROM users ORDER BY created_at, rowid").fetchall()
    return [_user_dict(r) for r in rows]


def _user_where(db: Database, column: str, value: str) -> dict[str, Any] | None:
    # `column` is one of two literals from the callers above, never user input.
    row = db.execute(f"SELECT {_USER_COLS} FROM users WHERE {column} = ?", [value]).fetchone()
    return None if row is None else _user_dict(row)


def _remove_user(db: Database, name: str) -> bool:
    with _write_tx(db):
        ids = [r[0] for r in db.execute("SELECT id FROM users WHERE name = ?", [name])]
        for user_id in ids:
            db.execute("DELETE FROM schedules WHERE user_id = ?", [user_id])
        rows = db.execute("SELECT key, data FROM queued").fetchall()
        for key in queued_of(rows, set(ids)):
            db.execute("DELETE FROM queued WHERE key = ?", [key])
        return bool(db.execute("DELETE FROM users WHERE name = ?", [name]).rowcount)


def _rotate_token(db: Database, name: str, digest: str) -> bool:
    with _write_tx(db):
        if db.execute("SELECT 1 FROM users WHERE token_sha256 = ?", [digest]).fetchone():
            raise StoreError("a user with this token already exists; tokens must be unique")
        return bool(
            db.execute("UPDATE users SET token_sha256 = ? WHERE name = ?", [digest, name]).rowcount
        )
