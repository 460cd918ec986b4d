"""The store's methods for queued messages, kv, users and leases (mixed into `PostgresStore`).

Each method checks its input on the caller's side (`store/_input`, shared with the
SQLite store), names its operation and runs one job on the workers (`_core._run`); the
statements are `_tables`'.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from navi_trio.store._input import _check_text, _dump, check_keep, check_session_id
from navi_trio.store._users import _token_digest
from navi_trio.store.base import LeaseRow
from navi_trio.store.fence import current_fence
from navi_trio.store.postgres import _history as h
from navi_trio.store.postgres import _tables as t
from navi_trio.store.postgres._core import _Core
from navi_trio.store.postgres._workers import Conn


class _Tables(_Core):
    # -- queued messages ---------------------------------------------------------------

    async def enqueue(
        self, session_id: str, key: str, message: dict[str, Any], *, pid: int, host: str,
        keep: int | None = None,
    ) -> list[tuple[str, dict[str, Any]]]:  # fmt: skip
        """Keep a queued user message until its run appends it (`append(dequeue=key)`);
        with `keep`, the session's oldest rows beyond the newest `keep` go: (key, message)
        of each, oldest first."""
        sid = check_session_id(session_id)
        _check_text(key, "queued message key")
        data = _dump(message, f"queued message of {sid!r}")
        cap = check_keep(keep)
        now = self._now()
        return await self._run(
            f"queue a message in {sid!r}",
            lambda c: t.enqueue(c, sid, key, data, pid, host, now, cap),
        )

    async def release_queued(
        self, session_id: str, keys: Sequence[str], *, pid: int, host: str
    ) -> int:
        """Hand these queued rows of (pid, host) to whoever runs the session: they become
        anyone's (`HANDED_PID`). How many were (the others are no longer theirs)."""
        sid = check_session_id(session_id)
        wanted = [_check_text(k, "queued message key") for k in keys]
        return await self._run(
            f"release queued messages of {sid!r}",
            lambda c: t.release_queued(c, sid, wanted, pid, host),
        )

    async def unqueue(self, key: str) -> bool:
        """Forget a queued message (dropped from a full queue). False when not there."""
        _check_text(key, "queued message key")
        return await self._run(f"unqueue message {key!r}", lambda c: t.unqueue(c, key))

    async def adopt_queued(
        self, session_id: str, *, pid: int, host: str
    ) -> list[tuple[str, dict[str, Any]]]:
        """(key, message) of the session's queued messages that no live process owns
        (theirs: same host, pid gone; or ours), in queued order, now owned by `pid`."""
        sid = check_session_id(session_id)
        return await self._run(
            f"adopt queued messages of {sid!r}", lambda c: t.adopt(c, sid, pid, host)
        )

    async def queued_sessions(self) -> list[str]:
        """Ids of the sessions with queued messages."""
        return await self._run("list sessions with queued messages", t.queued_sessions, write=False)

    # -- kv -------------------------------------------------------------------------

    async def kv_get(self, scope: str, key: str) -> Any | None:
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        return await self._run(
            f"kv get {scope}/{key}", lambda c: t.kv_get(c, scope, key), write=False
        )

    async def kv_set(self, scope: str, key: str, value: Any) -> None:
        """Set the value; inside a run, fenced by its lease (`store.fence`)."""
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        data = _dump(value, f"kv value for {scope}/{key}")
        now = self._now()
        fence = current_fence()

        def job(c: Conn) -> None:
            h.check_fence(c, fence)
            t.kv_set(c, scope, key, data, now)

        await self._run(f"kv set {scope}/{key}", h.fenced(fence, job))

    async def kv_delete(self, scope: str, key: str) -> None:
        """Delete the value; inside a run, fenced by its lease (`store.fence`)."""
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        fence = current_fence()

        def job(c: Conn) -> None:
            h.check_fence(c, fence)
            t.kv_delete(c, scope, key)

        await self._run(f"kv delete {scope}/{key}", h.fenced(fence, job))

    async def kv_list(self, scope: str, prefix: str = "") -> list[tuple[str, Any]]:
        _check_text(scope, "kv scope")
        _check_text(prefix, "kv prefix", allow_empty=True)
        return await self._run(
            f"kv list {scope}/{prefix}*", lambda c: t.kv_list(c, scope, prefix), write=False
        )

    # -- users ----------------------------------------------------------------------

    async def create_user(self, name: str, token: str, role: str = "user") -> dict[str, Any]:
        """Add a user; only a SHA-256 of the token is stored (tokens are random secrets)."""
        _check_text(name, "user name")
        _check_text(role, "user role")
        user = {"id": "u-" + uuid.uuid4().hex[:12], "name": name, "role": role,
                "created_at": self._now()}  # fmt: skip
        digest = _token_digest(token)
        await self._run(f"create user {name!r}", lambda c: t.insert_user(c, user, digest))
        return dict(user)

    async def get_user_by_token(self, token: str) -> dict[str, Any] | None:
        digest = _token_digest(token)
        return await self._run(
            "find user by token", lambda c: t.user_by_digest(c, digest), write=False
        )

    async def list_users(self) -> list[dict[str, Any]]:
        """Every user (id, name, role, created_at), oldest first; never a token."""
        return await self._run("list users", t.list_users, write=False)

    async def get_user(self, user_id: str) -> dict[str, Any] | None:
        _check_text(user_id, "user id")
        return await self._run(
            f"get user {user_id}", lambda c: t.user_by_id(c, user_id), write=False
        )

    async def get_user_by_name(self, name: str) -> dict[str, Any] | None:
        _check_text(name, "user name")
        return await self._run(f"get user {name!r}", lambda c: t.user_by_name(c, name), write=False)

    async def remove_user(self, name: str) -> bool:
        """Remove the user called `name`, with their schedules and queued messages (their
        sessions stay); False when unknown."""
        _check_text(name, "user name")
        return await self._run(f"remove user {name!r}", lambda c: t.remove_user(c, name))

    async def rotate_user_token(self, name: str, token: str) -> bool:
        """Replace the token of `name`: the old one stops working. False when unknown."""
        _check_text(name, "user name")
        digest = _token_digest(token)
        return await self._run(
            f"rotate token of {name!r}", lambda c: t.rotate_token(c, name, digest)
        )

    async def count_sessions(self, user_id: str) -> int:
        _check_text(user_id, "user id")
        return await self._run(
            f"count sessions of {user_id}", lambda c: t.count_sessions(c, user_id), write=False
        )

    # -- leases ---------------------------------------------------------------------

    async def claim_lease(
        self, session_id: str, *, owner: str, pid: int, host: str, ttl: float
    ) -> LeaseRow:
        """Take the session's lease for `ttl` s unless a live owner holds it (see base)."""
        sid = check_session_id(session_id)
        _check_text(owner, "lease owner")
        _check_text(host, "lease host")
        return await self._run(
            f"claim lease of {sid!r}", lambda c: t.claim_lease(c, sid, owner, pid, host, ttl)
        )

    async def renew_lease(
        self, session_id: str, *, owner: str, ttl: float, generation: int | None = None
    ) -> bool:
        """Extend our lease by `ttl` s from now; False when it is no longer ours (with
        `generation`: no longer ours as that generation)."""
        sid = check_session_id(session_id)
        return await self._run(
            f"renew lease of {sid!r}",
            lambda c: t.renew_lease(c, sid, owner, ttl, generation),
            durable=False,  # a renewal lost to a crash only makes the lease end sooner
        )

    async def release_lease(self, session_id: str, *, owner: str) -> None:
        sid = check_session_id(session_id)
        await self._run(f"release lease of {sid!r}", lambda c: t.release_lease(c, sid, owner))
