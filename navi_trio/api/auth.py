"""Who is talking: tokens, users, the local admin token file, the Origin and Host checks.

Tokens are random secrets (`new_token`); the store keeps only their SHA-256. Whose a
hello's token is, a server asks its `Tokens`: the store's users (`StoreTokens`, every
daemon), or the one user of a private server a command starts in its own process
(`OneToken`). The local convenience: on first start `navi serve` creates an admin user
and writes its token to ``data_dir/local-token`` with mode 0600, which local clients
read when no ``--token`` / ``NAVI_TOKEN`` is given.

Each data folder's local admin is its own user, named in ``data_dir/local-user``: the
first one of a database is ``local-admin``, another folder's (another machine, or a
second daemon of one machine, on a shared PostgreSQL) ``local-admin@HOST:KEY`` (KEY
from the folder's path). A folder whose token is missing or stale gets a new token for
its own user only: starting one daemon never breaks another folder's token file.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import attrs
import trio

from navi_trio.errors import AuthError, ConfigError

if TYPE_CHECKING:  # `navi run` reads the token file before it needs the store
    from navi_trio.store.methods import SessionStore

ROLES = ("admin", "user")
LOCAL_TOKEN_FILE = "local-token"
LOCAL_USER_FILE = "local-user"  # the name of this folder's local admin
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


async def authenticate(store: SessionStore, token: str) -> User:
    row = await store.get_user_by_token(token)
    if row is None:
        raise AuthError("unknown token: ask an admin for one (`navi users add NAME`)")
    return User.from_row(row)


class Tokens(Protocol):
    """Whose a token is, for a server: at the hello (`user`), and again after each change
    of the users table (`revoked`: why it no longer stands, or None)."""

    async def user(self, token: str) -> User: ...
    async def revoked(self, user: User, token: str) -> str | None: ...


@attrs.frozen
class StoreTokens:
    """The users of the store (`navi users`): the daemon's."""

    store: SessionStore

    async def user(self, token: str) -> User:
        return await authenticate(self.store, token)

    async def revoked(self, user: User, token: str) -> str | None:
        found = await self.store.get_user_by_token(token)
        if found is not None and str(found["id"]) == user.id:
            return None
        if await self.store.get_user(user.id) is None:
            return f"user {user.name} was removed"
        return f"the token of user {user.name} was replaced (navi users rotate)"


# The person at this shell, as a command that serves itself sees them: the admin of the
# data folder they own (docs/security.md, D4), the owner of what such a command creates.
LOCAL_USER = User(id="local", name="local", role="admin")


@attrs.frozen
class OneToken:
    """A private server's only user (`LOCAL_USER`), known by a token made for one command
    (`new_token`) that lives in that process's memory only: no store user, nobody else."""

    token: str = attrs.field(factory=new_token, repr=False)
    who: User = LOCAL_USER

    async def user(self, token: str) -> User:
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            raise AuthError("unknown token: this is a private server of one navi command")
        return self.who

    async def revoked(self, user: User, token: str) -> str | None:
        return None  # nobody can change it: it is in no table


def local_token_path(data_dir: Path) -> Path:
    return data_dir / LOCAL_TOKEN_FILE


def read_local_token(data_dir: Path) -> str | None:
    try:
        text = local_token_path(data_dir).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


def folder_admin_name(data_dir: Path) -> str:
    """The local admin's name for a data folder that is not the database's first."""
    key = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:8]
    return f"{LOCAL_ADMIN}@{socket.gethostname() or 'localhost'}:{key}"


async def ensure_local_token(store: SessionStore, data_dir: Path) -> Path:
    """This folder's local admin token file, created (0600) with its user when missing
    or stale (see the module: another folder's user is never touched)."""
    path = local_token_path(data_dir)
    lock = await trio.to_thread.run_sync(_lock_folder, data_dir)  # workers of one folder
    try:
        token = read_local_token(data_dir)
        if token is None or await store.get_user_by_token(token) is None:
            token = new_token()
            name = await _own_admin(store, data_dir)
            if name is not None:
                await store.rotate_user_token(name, token)
            else:
                first = await store.get_user_by_name(LOCAL_ADMIN) is None
                name = LOCAL_ADMIN if first else folder_admin_name(data_dir)
                if first or await store.get_user_by_name(name) is None:
                    await store.create_user(name, token, role="admin")
                else:
                    await store.rotate_user_token(name, token)
            await trio.to_thread.run_sync(_write_private, data_dir / LOCAL_USER_FILE, name)
        await trio.to_thread.run_sync(_write_private, path, token)
    finally:
        os.close(lock)
    return path


async def folder_admin(store: SessionStore, data_dir: Path) -> User | None:
    """This folder's local admin as a store user, if a daemon of the folder made one (its
    `local-user`, or the user of its token file); None when none was ever made. Reads
    only: a command serving itself writes no token file."""
    name = await _own_admin(store, data_dir)
    row = await store.get_user_by_name(name) if name is not None else None
    if row is None:
        token = read_local_token(data_dir)
        row = await store.get_user_by_token(token) if token else None
    if row is None or row.get("role") != "admin":
        return None
    return User.from_row(row)


async def _own_admin(store: SessionStore, data_dir: Path) -> str | None:
    """The admin user this folder's ``local-user`` names, if it still exists."""
    try:
        name = (data_dir / LOCAL_USER_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    row = await store.get_user_by_name(name) if name else None
    return name if row is not None and row.get("role") == "admin" else None


def _lock_folder(data_dir: Path) -> int:
    """An exclusive lock on the folder's token (blocking): one daemon writes it at a time."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / (LOCAL_TOKEN_FILE + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


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


# -- who may open a WebSocket: the Origin and Host headers ----------------------------


@attrs.frozen
class WebAccess:
    """Which names of the daemon (Host) and which browser pages (Origin) are admitted.

    The daemon's own names are the address the connection came in on (the bound one,
    or the interface a wildcard bind answered on), ``--host`` when it is a name, and, on
    loopback, ``localhost``, ``127.0.0.1`` and ``[::1]``.

    Host: one of the daemon's names, or a name in ``NAVI_WS_ALLOWED_HOSTS`` (``name``
    for any port, ``name:port`` for one). A page whose own name was pointed at
    127.0.0.1 (DNS rebinding) sends its own name, and is refused. The port of one of
    the daemon's own names is not checked: only a forwarder (``ssh -L``, a container's
    port map) makes it differ, and no page can use that against the daemon.

    Origin: none (not a browser); an origin listed exactly in
    ``NAVI_WS_ALLOWED_ORIGINS``; or the daemon's own pages, ``http://`` and either the
    very host and port the browser reached the daemon at (the Host header), or one of
    the daemon's names with its port. Anything else, another port of this machine,
    another scheme, ``null``, is refused.
    """

    origins: frozenset[str] = frozenset()  # normalised: lower case, no trailing "/"
    hosts: frozenset[tuple[str, int | None]] = frozenset()  # (name, port or any)
    bound_host: str = "127.0.0.1"

    @classmethod
    def from_settings(
        cls, origins: Iterable[str], hosts: Iterable[str], bound_host: str
    ) -> WebAccess:
        """The policy for these settings; `ConfigError` naming the variable on a bad entry."""
        kept: set[str] = set()
        for entry in origins:
            origin = _origin_key(entry)
            if origin is None:
                raise ConfigError(
                    f"NAVI_WS_ALLOWED_ORIGINS: {entry!r} is not an origin "
                    "(scheme://host[:port], like https://navi.example)"
                )
            kept.add(origin)
        names: set[tuple[str, int | None]] = set()
        for entry in hosts:
            parsed = _host_port(entry, default_port=None)
            if parsed is None:
                raise ConfigError(
                    f"NAVI_WS_ALLOWED_HOSTS: {entry!r} is not a host name (name or name:port)"
                )
            names.add(parsed)
        return cls(frozenset(kept), frozenset(names), bound_host)

    def own_names(self, local_address: str) -> set[str]:
        """The daemon's names for a connection that came in on `local_address`."""
        names = {_bare(local_address).lower()}
        if self.bound_host not in _WILDCARDS:
            names.add(_bare(self.bound_host).lower())
        if any(is_loopback(n) for n in names):
            names.update(_LOOPBACK_HOSTS)
        return names

    def host_allowed(self, host: str | None, local_address: str) -> bool:
        """A Host header naming the daemon, or a configured name."""
        parsed = None if host is None else _host_port(host, default_port=80)
        if parsed is None:
            return False  # HTTP/1.1 requires one; a bad one names nothing of ours
        name, port = parsed
        if (name, port) in self.hosts or (name, None) in self.hosts:
            return True
        return name in self.own_names(local_address)

    def origin_allowed(
        self, origin: str | None, host: str | None, local_address: str, port: int
    ) -> bool:
        """No Origin (not a browser), a configured one, or the daemon's own pages."""
        if origin is None:
            return True
        key = _origin_key(origin)
        if key is None:
            return False  # "null" (a file, a sandboxed frame), a malformed header
        if key in self.origins:
            return True
        parts = urlsplit(key)
        if parts.scheme != "http" or parts.hostname is None:
            return False
        page = (_bare(parts.hostname), parts.port or 80)
        if host is not None and page == _host_port(host, default_port=80):
            return self.host_allowed(host, local_address)
        return page[1] == port and page[0] in self.own_names(local_address)


_WILDCARDS = ("", "0.0.0.0", "::")


def _bare(host: str) -> str:
    """An address without IPv6 brackets; an IPv4 address mapped into IPv6 as IPv4."""
    host = host.strip().removeprefix("[").removesuffix("]")
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine only: "localhost" or a
    loopback address. Any other name may resolve anywhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _origin_key(origin: str) -> str | None:
    """`origin` as compared (lower case, no trailing "/"), or None when it is not
    scheme://host[:port] with nothing else."""
    text = origin.strip().lower().rstrip("/")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return None
    if not parts.scheme or not parts.hostname or parts.username is not None or parts.password:
        return None
    if parts.path or parts.query or parts.fragment:
        return None
    return text


def _host_port(text: str, *, default_port: int | None) -> tuple[str, int | None] | None:
    """A Host header (or a configured name) as (name, port), or None when malformed."""
    text = text.strip().lower()
    try:
        parts = urlsplit("//" + text)
        port = parts.port
    except ValueError:
        return None
    name = parts.hostname
    if not name or parts.netloc != text or parts.username is not None or parts.path:
        return None
    return _bare(name), default_port if port is None else port
