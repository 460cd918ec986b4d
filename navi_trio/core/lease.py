"""One owner runs a session at a time, across processes: the session lease.

    leases = SessionLeases(store)
    async with leases.hold(session_id):   # SessionBusyError if another process runs it
        ...                               # load, run, save the session

Every `navi run` and every daemon that shares a database holds a lease row (owner,
pid, host, expires_at) for each session it runs. While held, a task renews it every
third of the TTL; leaving `hold` releases it (shielded, bounded). A process that dies
without releasing blocks the session until its lease expires, or not at all on its own
host (a dead pid is taken over at once).

Take the lease *before* loading the session: loading repairs tool calls that look
dangling, and another process's in-flight calls look exactly like that.

While held, every write to the session carries the lease's fence (owner, generation:
store/fence.py): when another process took the lease over meanwhile (this one was
paused past its TTL), the store refuses those writes with `LeaseLostError`. A claim
that comes back with another generation than this runtime last held means another
process may have written the session since: `on_takeover(session_id)` (the agent's
session cache forgets its copy) runs before the block, so the run reloads it.

Within one process, holds nest: runs of one session in the same runtime share one
lease (the session actor runs them one at a time), and it is released when the last ends.
A second process gets `SessionBusyError` at once rather than waiting: a command-line
run should not hang without saying why; the message names the session and the holder.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from navi_trio.errors import SessionBusyError, StorageError, StoreError
from navi_trio.store._lease import pid_alive as pid_alive
from navi_trio.store.base import LeaseRow, SessionStore
from navi_trio.store.fence import Fence, fenced

log = logging.getLogger(__name__)

LEASE_TTL_SEC = 30.0
RELEASE_DEADLINE_SEC = 10.0


def busy_message(session_id: str, holder: LeaseRow) -> str:
    where = "this process" if holder.pid == os.getpid() else f"pid {holder.pid}"
    return (
        f"session {session_id!r} is busy: another navi run ({where} on {holder.host}) is "
        "running it; try again when it has finished"
    )


@attrs.define
class _Holds:
    count: int = 0  # holds of one session open in this runtime
    claimed: bool = False  # one of them won the claim: the row is ours to release


class SessionLeases:
    """This runtime's leases. One per runtime (its owner id), never module-level."""

    def __init__(
        self,
        store: SessionStore,
        *,
        ttl: float = LEASE_TTL_SEC,
        on_takeover: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self.ttl = ttl
        self.on_takeover = on_takeover
        # The generation of each session's lease as this runtime last held it.
        self._generations: dict[str, int] = {}
        self.pid = os.getpid()
        self.host = socket.gethostname() or "localhost"
        self.owner = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:12]}"
        self._holds: dict[str, _Holds] = {}  # session id -> its holds in this runtime

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """Hold the session's lease for the block; raise SessionBusyError if taken."""
        entry = self._holds.setdefault(session_id, _Holds())
        entry.count += 1
        try:
            holder = await self._store.claim_lease(
                session_id, owner=self.owner, pid=self.pid, host=self.host, ttl=self.ttl
            )
            if holder.owner != self.owner:
                raise SessionBusyError(busy_message(session_id, holder))
            entry.claimed = True
            if self._generations.get(session_id) != holder.generation:
                self._generations[session_id] = holder.generation
                if self.on_takeover is not None and entry.count == 1:
                    self.on_takeover(session_id)
            fence = Fence(session_id, self.owner, holder.generation)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._renew, session_id)
                    try:
                        with fenced(fence):
                            yield
                    finally:
                        nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                # The renewer never raises: a group holds the block's one exception.
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise
        finally:
            entry.count -= 1
            if not entry.count:
                del self._holds[session_id]
                if entry.claimed:  # not after a refused or failed claim: no row of ours
                    await self._release(session_id)

    def generation(self, session_id: str) -> int | None:
        """The generation of the session's lease as this runtime last held it."""
        return self._generations.get(session_id)

    async def _renew(self, session_id: str) -> None:
        lost = False
        while True:
            await trio.sleep(self.ttl / 3)
            try:
                ours = await self._store.renew_lease(session_id, owner=self.owner, ttl=self.ttl)
            except StoreError as exc:
                say = log.info if isinstance(exc, StorageError) else log.warning
                say("session %s: renewing the lease failed: %s", session_id, exc)
                continue
            if not ours and not lost:
                lost = True  # said once: the run goes on, its saves still append safely
                log.warning(
                    "session %s: the lease was taken over while this run was live "
                    "(the process was suspended past %g s?)",
                    session_id,
                    self.ttl,
                )

    async def _release(self, session_id: str) -> None:
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + RELEASE_DEADLINE_SEC
            try:
                await self._store.release_lease(session_id, owner=self.owner)
            except StoreError as exc:
                # A full or unwritable disk is logged once by the store, not per run.
                say = log.info if isinstance(exc, StorageError) else log.warning
                say("session %s: releasing the lease failed: %s", session_id, exc)
