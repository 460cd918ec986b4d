"""One owner runs a session at a time, across processes: the session lease.

    async with leases.hold(session_id):   # SessionBusyError if another process runs it
        ...                               # load, run, save the session

Take the lease *before* loading the session: loading repairs tool calls that look
dangling, and another process's in-flight calls look exactly like that. A task renews
it every third of the TTL; a dead owner's lease expires (on its own host, at once).
Every write carries the lease's fence, so a process paused past its TTL has its writes
refused (`LeaseLostError`); a claim with a new generation makes `on_takeover` forget
the cached session first. `HeldLease.confirm()` renews before each tool call, and
`held()` answers at once while the lease is surely ours. Holds nest within a process;
a second process gets `SessionBusyError` at once, naming the holder, rather than hang.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from navi_trio.errors import LeaseLostError, SessionBusyError, StorageError, StoreError
from navi_trio.store._lease import pid_alive as pid_alive
from navi_trio.store.base import LeaseRow
from navi_trio.store.fence import Fence, current_fence, fenced
from navi_trio.store.methods import SessionStore

log = logging.getLogger(__name__)

LEASE_TTL_SEC = 30.0
RELEASE_DEADLINE_SEC = 10.0


def busy_message(session_id: str, holder: LeaseRow) -> str:
    where = "this process" if holder.pid == os.getpid() else f"pid {holder.pid}"
    return (
        f"session {session_id!r} is busy: another navi run ({where} on {holder.host}) is "
        "running it; try again when it has finished"
    )


class HeldLease:
    """A hold of a session's lease as the run sees it (see the module): its fence,
    until when it is surely still ours, and whether another process took it over."""

    def __init__(self, fence: Fence, valid_until: float) -> None:
        self.fence = fence
        self.valid_until = valid_until  # trio time
        self.lost = False
        self.released = False  # the hold ended, the lease still ours: nothing to check
        # The hold's end leaves the row as it is, not released: the run's message is kept
        # to run again here (`SessionLeases.hold`).
        self.keep = False
        self._ask = trio.Event()  # someone wants a renewal now
        self._news = trio.Event()  # set after each renewal attempt
        self.started = 0  # renewal attempts started, and finished
        self.finished = 0

    def surely_held(self) -> bool:
        """Whether the lease is surely ours now, with nothing to ask (False: `held`)."""
        return not self.lost and (self.released or trio.current_time() < self.valid_until)

    async def held(self) -> bool:
        """Whether the lease is ours: at once while surely so; else after a renewal."""
        while not self.lost:
            if self.surely_held():
                return True
            await self._renewal()
        return False

    async def confirm(self) -> None:
        """A renewal in the store now, naming the generation; LeaseLostError when
        another process has the lease. A store that does not answer leaves it to
        `held` (the lease is ours until it could have expired)."""
        if self.released:
            return
        target = self.started + 1
        while self.finished < target and not self.lost:
            await self._renewal()
        if not await self.held():
            raise taken_over(self.fence)

    async def _renewal(self) -> None:
        news = self._news
        self._ask.set()
        await news.wait()

    def _told(self) -> None:
        news, self._news = self._news, trio.Event()
        news.set()


def taken_over(fence: Fence) -> LeaseLostError:
    return LeaseLostError(
        f"session {fence.session_id!r} was taken over by another daemon while this one was "
        f"not answering (its generation {fence.generation} is gone): this run stops here and "
        "does nothing more; the session goes on there"
    )


@attrs.define
class _Holds:
    count: int = 0  # holds of one session open in this runtime
    claimed: bool = False  # one of them won the claim: the row is ours to release
    lease: HeldLease | None = None  # the one all holds of this generation share


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
        # Awaited before a lease is released (the cluster: until the frames published
        # so far are on its bus, so the daemon that claims the lease next has them).
        self.before_release: Callable[[], Awaitable[None]] | None = None
        # Awaited once a claim won a lease another runtime held last (or one not held here
        # before), before the block starts: the cluster, until the session's frames other
        # daemons sent before the claim are handed to its actor.
        self.after_claim: Callable[[str], Awaitable[None]] | None = None

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[HeldLease]:
        """Hold the session's lease for the block; raise SessionBusyError if taken,
        LeaseLostError when another process took it over during the block. Released at
        the end unless the block set `HeldLease.keep`."""
        entry = self._holds.setdefault(session_id, _Holds())
        entry.count += 1
        try:
            sent = trio.current_time()
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
                if self.after_claim is not None:
                    await self.after_claim(session_id)
            fence = Fence(session_id, self.owner, holder.generation)
            lease = entry.lease
            if lease is None or lease.fence != fence or lease.lost:
                lease = entry.lease = HeldLease(fence, sent + self._sure_for())
            stopped = trio.CancelScope()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._renew, lease, stopped)
                    try:
                        with fenced(fence), stopped:
                            yield lease
                    finally:
                        nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                # The renewer never raises: a group holds the block's one exception.
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise
            if lease.lost:  # the block was cancelled for it: say why
                raise taken_over(fence)
        finally:
            entry.count -= 1
            if not entry.count:
                del self._holds[session_id]
                if entry.lease is not None:
                    entry.lease.released = not entry.lease.lost
                    entry.lease._told()  # whoever waits for news: the hold is over
                kept = entry.lease is not None and entry.lease.keep
                if entry.claimed and not kept:  # (a refused or failed claim: no row of ours)
                    await self._release(session_id)

    def generation(self, session_id: str) -> int | None:
        """The generation of the session's lease as this runtime last held it."""
        return self._generations.get(session_id)

    async def confirm_current(self) -> None:
        """Before a side effect of the run this task belongs to (a tool call): its lease
        confirmed in the store (`HeldLease.confirm`). Nothing outside a run's hold."""
        fence = current_fence()
        if fence is None:
            return
        entry = self._holds.get(fence.session_id)
        lease = entry.lease if entry is not None else None
        if lease is None or lease.fence != fence:
            raise taken_over(fence)  # a newer hold of this runtime replaced this one
        await lease.confirm()

    async def renewing(
        self, session_id: str, write: Callable[[float | None], Awaitable[bool]]
    ) -> bool:
        """A write to `session_id` that renews the run's lease in its own transaction (`write(ttl)`
        says whether it wrote); True when it did, so the next call needs no confirmation. Outside
        a run's hold of that session: a plain `write(None)`, and False."""
        fence = current_fence()
        entry = self._holds.get(session_id) if fence is not None else None
        lease = entry.lease if entry is not None else None
        if lease is None or lease.fence != fence or lease.released or lease.lost:
            await write(None)
            return False
        sent = trio.current_time()
        if not await write(self.ttl):  # the fenced write: LeaseLostError when not ours
            return False
        lease.valid_until = max(lease.valid_until, sent + self._sure_for())
        return True

    def _sure_for(self) -> float:
        """How long after a renewal is sent the lease is surely still ours: its TTL, less
        a margin for the two clocks' rates."""
        return self.ttl - min(1.0, self.ttl / 10)

    async def _renew(self, lease: HeldLease, stopped: trio.CancelScope) -> None:
        """Every third of the TTL, or at once when asked: extend the lease, naming its
        generation. Lost: cancel the block (`stopped`) and end."""
        session_id = lease.fence.session_id
        while True:
            with trio.move_on_after(self.ttl / 3):
                await lease._ask.wait()
            lease._ask = trio.Event()
            lease.started += 1
            sent = trio.current_time()
            ours: bool | None = None  # None: the store did not answer
            try:
                ours = await self._store.renew_lease(
                    session_id, owner=self.owner, ttl=self.ttl, generation=lease.fence.generation
                )
            except StoreError as exc:
                say = log.info if isinstance(exc, StorageError) else log.warning
                say("session %s: renewing the lease failed: %s", session_id, exc)
            lease.finished += 1
            if ours:
                lease.valid_until = max(lease.valid_until, sent + self._sure_for())
            lease.lost = ours is not None and not ours
            lease._told()
            if ours is None:
                await trio.sleep(min(1.0, self.ttl / 10))  # not a storm while the store is down
            if not lease.lost:
                continue
            log.warning(
                "session %s: the lease was taken over while this run was live (the process "
                "was suspended past %g s?): the run stops",
                session_id,
                self.ttl,
            )
            stopped.cancel()
            return

    async def _release(self, session_id: str) -> None:
        if self.before_release is not None:
            with trio.move_on_after(RELEASE_DEADLINE_SEC, shield=True):
                await self.before_release()
        with trio.move_on_after(RELEASE_DEADLINE_SEC, shield=True):
            try:
                await self._store.release_lease(session_id, owner=self.owner)
            except StoreError as exc:
                # A full or unwritable disk is logged once by the store, not per run.
                say = log.info if isinstance(exc, StorageError) else log.warning
                say("session %s: releasing the lease failed: %s", session_id, exc)
