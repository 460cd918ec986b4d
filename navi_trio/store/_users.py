"""The users table: who may connect, with which role; only a digest of each token.

`_Users` holds the store's user methods (mixed into `SQLiteStore`); below it, the
functions that run on the worker thread. A token is stored as its SHA-256 (tokens are
random secrets, so no salt is needed) and two users never share one.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import Any

from sqlite_utils import Database

from navi_trio.errors import StoreError
from navi_trio.store._core import _Core
from navi_trio.store._input import _check_text
from navi_trio.store._schema import _write_tx


class _Users(_Core):
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
        """Remove the user called `name` (their sessions stay); False when unknown."""
        _check_text(name, "user name")
        return await self._run(f"remove user {name!r}", lambda db: _remove_user(db, name))

    async def rotate_user_token(self, name: str, token: str) -> bool:
        """Replace the token of `name`: the old one stops working. False when unknown."""
        _check_text(name, "user name")
        digest = _token_digest(token)
        return await self._run(
            f"rotate token of {name!r}", lambda db: _rotate_token(db, name, digest)
        )


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
    return bool(db.execute("DELETE FROM users WHERE name = ?", [name]).rowcount)


def _rotate_token(db: Database, name: str, digest: str) -> bool:
    with _write_tx(db):
        if db.execute("SELECT 1 FROM users WHERE token_sha256 = ?", [digest]).fetchone():
            raise StoreError("a user with this token already exists; tokens must be unique")
        return bool(
            db.execute("UPDATE users SET token_sha256 = ? WHERE name = ?", [digest, name]).rowcount
        )
