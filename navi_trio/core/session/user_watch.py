"""Revocation reaches what is open: the users table, looked at again after each change.

A token is checked once, at hello, so the store signals every committed change of the
users table; this actor reads the users again and bumps `generation`. Each connection
then checks its own token again (a rotated token or a removed user closes it), and
the users gone go to `on_removed`, which stops their turns and jobs here. Whether a
run may start is asked of the store itself (`role_now`), never of a list kept here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from navi_trio.errors import NaviError
from navi_trio.store.methods import SessionStore

log = logging.getLogger(__name__)

RETRY_SEC = 1.0  # a failed read of the users is tried again after this
# Whom an embedded run (``navi run`` in its own process) is for: the person at the
# shell, the local admin, who has no row in the users table (a stored user's id is
# ``u-`` and hex: never this).
EMBEDDED_USER = "local"
EMBEDDED_ROLE = "admin"


async def role_now(store: SessionStore, user_id: str) -> str | None:
    """The role `user_id` has now, as the store says; None when there is no such user
    (removed). The embedded run's user is the local admin."""
    if user_id == EMBEDDED_USER:
        return EMBEDDED_ROLE
    user = await store.get_user(user_id)
    return None if user is None else str(user["role"])


class UserWatch:
    """The daemon's view of the users table after each change (see the module)."""

    def __init__(self, store: SessionStore, on_removed: Callable[[set[str]], None]) -> None:
        self.store = store
        self.on_removed = on_removed
        self.generation = 0  # bumped after each look at the users
        self._known: set[str] = set()
        self._wake = trio.Event()
        self._looked = trio.Event()

    def signal(self) -> None:
        """The users table changed (the store's signal): look again."""
        self._wake.set()

    async def wait(self, seen: int) -> int:
        """Until a look at the users that began after generation `seen` was current; the
        generation then."""
        while self.generation <= seen:
            await self._looked.wait()
        return self.generation

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            self._known = await self._ids()
        except NaviError as exc:
            log.warning(
                "reading the users failed (%s): removals are seen from the next change", exc
            )
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            try:
                ids = await self._ids()
            except NaviError as exc:
                log.warning("reading the users after a change failed (%s): trying again", exc)
                self._wake.set()
                await trio.sleep(RETRY_SEC)
                continue
            gone, self._known = self._known - ids, ids
            self.generation += 1
            if gone:
                log.info("users removed: %s: their runs stop here", ", ".join(sorted(gone)))
                self.on_removed(gone)
            self._looked.set()
            self._looked = trio.Event()

    async def _ids(self) -> set[str]:
        return {str(u["id"]) for u in await self.store.list_users()}
