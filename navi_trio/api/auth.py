"""Who is talking: tokens, users, the local admin token file, and the Origin check.

Tokens are random secrets (`new_token`); the store keeps only their SHA-256. The
local convenience: on first start `navi serve` creates an admin user and writes its
token to ``data_dir/local-token`` with mode 0600, which local clients read when no
``--token`` / ``NAVI_TOKEN`` is given.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
import trio

from navi_trio.errors import AuthError, ConfigError

if TYPE_CHECKING:  # `navi run` reads the token file before it needs the store
    from navi_trio.store.sqlite import SQLiteStore

ROLES = ("admin", "user")
LOCAL_TOKEN_FILE = "local-token"
LOCAL_ADMIN = "local-admin"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@attrs.frozen
class User:
    id: str
    name: str
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def info(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "role": self.role}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> User:
        return cls(id=str(row["id"]), name=str(row["name"]), role=str(row["role"]))


def new_token() -> str:
    return "navi_" + secrets.token_urlsafe(32)


async def authenticate(store: SQLiteStore, token: str) -> User:
    row = await store.get_user_by_token(token)
    if row is None:
        raise AuthError("unknown token: ask an admin for one (`navi users add NAME`)")
    return User.from_row(row)


def local_token_path(data_dir: Path) -> Path:
    return data_dir / LOCAL_TOKEN_FILE


def read_local_token(data_dir: Path) -> str | None:
    try:
        text = local_token_path(data_dir).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


async def ensure_local_token(store: SQLiteStore, data_dir: Path) -> Path:
    """The local admin token file, created (0600) with its user when missing or stale."""
    path = local_token_path(data_dir)
    token = read_local_token(data_dir)
    if token is None or await store.get_user_by_token(token) is None:
        token = new_token()
        if await store.get_user_by_name(LOCAL_ADMIN) is None:
            await store.create_user(LOCAL_ADMIN, token, role="admin")
        else:
            await store.rotate_user_token(LOCAL_ADMIN, token)
    await trio.to_thread.run_sync(_write_private, path, token)
    return path


def _write_private(path: Path, token: str) -> None:
    """Write `token` to `path` readable by its owner only (0600), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def resolve_token(explicit: str | None, data_dir: Path, environ: dict[str, str]) -> str:
    """--token, else NAVI_TOKEN, else the local token file; ConfigError naming all three."""
    token = explicit or environ.get("NAVI_TOKEN") or read_local_token(data_dir)
    if not token:
        raise ConfigError(
            f"no token: pass --token, set NAVI_TOKEN, or start `navi serve` once so that "
            f"{local_token_path(data_dir)} exists"
        )
    return token


def origin_allowed(origin: str | None) -> bool:
    """No Origin (not a browser), or a page served from this machine's loopback."""
    if origin is None:
        return True
    try:
        parts = urlsplit(origin.strip())
        host = parts.hostname
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and host in _LOOPBACK_HOSTS
