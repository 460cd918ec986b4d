"""Several daemons on one database: routing, events across daemons, failover.

    cluster = Cluster(bus, leases, settings)      # when the store has a bus (PostgreSQL)
    cluster.attach(registry, supervisor)
    await nursery.start(cluster.run)
    encode = cluster.tap(event_frame)             # every frame this daemon publishes

Only with a store that offers a bus (`store.base.ClusterBus`: PostgreSQL's LISTEN /
NOTIFY); with SQLite there is one daemon and no Cluster. What it does:

**Who owns a session.** The daemon holding its lease (core/lease.py), i.e. running it
now. Between runs nobody does, and the next command is run by whichever daemon gets it.

**Any daemon takes any command.** A message for a session another live daemon runs is
handed over through the store: it is written to the session's durable queue as
nobody's row (pid 0), under the queue's cap (the rows it dropped go with the note),
and the owner is told on its own channel (``nd_…``) to adopt it. The client gets its
``ok`` (queued) once the row is committed, so an acknowledged message survives the
owner dying too: the next owner adopts it. A daemon whose run finds its session taken
by another one leaves its queued messages the same way (`hand_back`): they run there,
in their order, never here too (taking a row off the queue is a compare and set). Stop
and compact go to the owner the same way (a notification; nothing to store); an
approval and a task cancel ask the owner and wait for its answer (core/owner_calls.py).
Why through the database and not a WebSocket to the owner (the peer link): every
daemon already reaches PostgreSQL, the hand-over is the durable queue that failover
needs anyway, no daemon needs another's address or a token to act for a user, and
frames do not travel twice.

**Events reach every daemon.** A daemon with clients on a session it does not run
*follows* it: a ``follows`` row (and a note on ``navi_follow`` so owners know at once)
and a ``LISTEN`` on the session's channel (``ns_…``). An owner publishes the frames of
a session that another daemon follows (`tap`), in batches, one transaction per batch,
in order; a frame over NOTIFY's limit goes as a pointer to a ``frames`` row. A frame
of a run carries the run's lease fence, checked in the statement that notifies: a run
that another daemon took over under it (this one was paused past its lease) reaches no
other daemon's clients, even before it knows. The
follower's session actor `relay`s each frame into its own broadcast, seq and epoch
unchanged: its clients get the same frames, replay and lagged rules as the owner's. A
break in the seqs, or another epoch (another daemon, or a restart), is a ``resync`` to
its subscribers first: reload the history, never a silent gap.

**Failover.** Each daemon renews its ``daemons`` row every third of the lease TTL. Every
half TTL it looks for sessions with queued messages and no live lease (their owner
died, or was handed a message as it went): it starts their actor, which adopts the rows
and runs them in order (a dead daemon's rows are adopted once its row has expired; on
its own host, at once). A dead owner's lease expires within the TTL
(``NAVI_LEASE_TTL_SEC``); the next command takes the session over, repairing dangling
tool calls as any load does. Background jobs of dead daemons are reported lost
(`TaskSupervisor.report_lost_jobs`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from navi_trio.core.agent import UserMessage
from navi_trio.core.lease import SessionLeases
from navi_trio.core.owner_calls import Answers, OwnerCalls
from navi_trio.core.queued import Dropped, to_row
from navi_trio.errors import NaviError, StoreError
from navi_trio.events import AgentEvent
from navi_trio.store.base import HANDED_HOST, HANDED_PID, ClusterBus, SessionStore
from navi_trio.store.fence import Fence

log = logging.getLogger(__name__)

Frame = dict[str, Any]
Outgoing = tuple[str, str, Fence | None]  # channel, payload, the fence it must pass
Encode = Callable[[AgentEvent, str, "int | None", "str | None"], Frame]
FOLLOW_CHANNEL = "navi_follow"
INBOX_MAX = 20_000  # notifications waiting for the handler; past it, dropped (a resync)
BATCH_MAX = 500  # frames per NOTIFY transaction
DROPPED_SAID = 20  # dropped rows named in one hand-over note (NOTIFY's 8000 bytes)
DROPPED_CHARS = 200  # what a note carries of each one's text


def session_channel(session_id: str) -> str:
    return "ns_" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


def daemon_channel(owner: str) -> str:
    return "nd_" + hashlib.sha256(owner.encode()).hexdigest()[:40]


class ClusterActor(Protocol):
    """What the cluster needs of a session actor (core/session_actor.py)."""

    busy: bool

    def relay(self, frame: Frame) -> None: ...
    def frame_fence(self) -> Fence | None: ...
    def dropped(self, rows: Dropped) -> None: ...
    async def adopt_handed(self) -> int: ...
    def stop(self) -> bool: ...
    def compact(self) -> None: ...


class ClusterRegistry(Protocol):
    def actor(self, session_id: str) -> Any: ...
    async def get(self, session_id: str) -> Any: ...


class LostJobs(Protocol):
    async def report_lost_jobs(self, live: set[tuple[int, str]] | None = None) -> int: ...
    def cancel(self, session_id: str, task_id: str) -> bool: ...


class Cluster:
    """This daemon's part in a cluster of daemons on one database (see the module)."""

    def __init__(
        self, bus: ClusterBus, store: SessionStore, leases: SessionLeases, ttl: float,
        *, queue_max: int | None = None,
    ) -> None:  # fmt: skip
        self.bus = bus
        self.store = store
        self.leases = leases
        self.owner = leases.owner
        self.ttl = ttl
        self.queue_max = None if queue_max is None else max(queue_max, 1)
        self.registry: ClusterRegistry | None = None
        self.jobs: LostJobs | None = None
        # Approvals and task cancels answered by the daemon that holds them.
        self.calls = OwnerCalls(bus, store, self.owner, daemon_channel)
        # Sessions some other daemon follows: their frames are published.
        self._followers: dict[str, set[str]] = {}
        self._following: set[str] = set()  # sessions this daemon listens to
        # One lock per session being followed or unfollowed: its listen, row and note
        # go in order; other sessions' do not wait (one lock for all made 500 sessions
        # started at once take their turns, one round trip after another, for 30 s).
        self._follow_locks: dict[str, trio.Lock] = {}
        self._out_send, self._out_recv = trio.open_memory_channel[Outgoing](INBOX_MAX)
        self._in_send, self._in_recv = trio.open_memory_channel[tuple[str, str]](INBOX_MAX)
        self._nursery: trio.Nursery | None = None
        self.dropped = 0  # notifications dropped (inbox or outbox full)
        self.published = 0
        self.relayed = 0

    def attach(
        self, registry: ClusterRegistry, jobs: LostJobs | None, approvals: Answers | None = None
    ) -> None:
        self.registry = registry
        self.jobs = jobs
        self.calls.attach(approvals, jobs)

    # -- the actor --------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.bus.on_message(self._received)
        try:
            async with self.bus.listening():
                await self.bus.heartbeat(self.owner, self.leases.pid, self.leases.host, self.ttl)
                await self.bus.listen(daemon_channel(self.owner))
                await self.bus.listen(FOLLOW_CHANNEL)
                for sid, owner in await self.bus.follows():
                    if owner != self.owner:
                        self._followers.setdefault(sid, set()).add(owner)
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._take_orphans_quietly)  # what a dead one left
                    nursery.start_soon(self._heartbeat)
                    nursery.start_soon(self._publisher)
                    nursery.start_soon(self._handler)
                    nursery.start_soon(self._failover)
                    task_status.started()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                try:
                    await self.bus.leave(self.owner)
                except StoreError as exc:
                    log.warning("leaving the cluster failed: %s", exc)

    async def _heartbeat(self) -> None:
        while True:
            await trio.sleep(self.ttl / 3)
            try:
                await self.bus.heartbeat(self.owner, self.leases.pid, self.leases.host, self.ttl)
            except StoreError as exc:
                log.warning("renewing this daemon's row failed: %s", exc)

    async def _failover(self) -> None:
        """Every half TTL: run queues nobody runs; report dead daemons' jobs lost."""
        while True:
            await trio.sleep(self.ttl / 2)
            await self._take_orphans_quietly()

    async def _take_orphans_quietly(self) -> None:
        try:
            await self.take_orphans()
        except NaviError as exc:
            log.warning("looking for sessions to take over failed: %s", exc)

    async def take_orphans(self) -> int:
        """Start the sessions with queued messages and no live owner; how many."""
        orphans = await self.bus.orphaned_queues()
        taken = 0
        if self.registry is not None:
            for sid in orphans:
                actor = await self.registry.get(sid)
                taken += await actor.adopt_handed()
        if taken:
            log.info("took over %d queued message(s) of %d session(s)", taken, len(orphans))
        if self.jobs is not None:
            live = {(pid, host) for _, pid, host in await self.bus.live_daemons()}
            await self.jobs.report_lost_jobs(live)
        return taken

    # -- routing ------------------------------------------------------------------------

    async def owner_elsewhere(self, session_id: str) -> str | None:
        """The other daemon running the session now, if one does."""
        holder = await self.bus.live_holder(session_id)
        if holder is None or holder[0] == self.owner:
            return None
        return holder[0]

    async def hand_over(self, owner: str, session_id: str, msg: UserMessage) -> None:
        """Queue `msg` for the daemon `owner` that runs the session, and tell it.

        Stored before this returns (the client's ok), under the queue's cap: if the
        owner dies first, whoever takes the session over runs it. A write that fails
        raises (the client's error: nothing stored); a note that fails after it does
        not (the failover finds the row within half a TTL)."""
        key = f"h-{self.owner.rsplit(':', 1)[-1]}-{trio.current_time():.6f}-{id(msg):x}"
        dropped = await self.store.enqueue(
            session_id, key, to_row(msg), pid=HANDED_PID, host=HANDED_HOST, keep=self.queue_max
        )
        msg.accepted.ok()
        said = [[k, _said(row)] for k, row in dropped[-DROPPED_SAID:]]
        await self._tell_quietly(owner, "queued", session_id, {"d": said} if said else {})

    async def hand_back(self, session_id: str, keys: list[str]) -> None:
        """This daemon's run found the session taken: leave its queued rows (`keys`) to
        the daemon that runs it now, and tell it. NaviError when nobody else runs it
        now, or the store did not answer: the caller keeps them."""
        holder = await self.bus.live_holder(session_id)
        if holder is None or holder[0] == self.owner:
            raise NaviError(f"session {session_id!r}: no other daemon runs it now")
        await self.store.release_queued(
            session_id, keys, pid=self.leases.pid, host=self.leases.host
        )
        await self._tell_quietly(holder[0], "queued", session_id)

    async def tell(self, owner: str, kind: str, session_id: str, **extra: Any) -> None:
        payload = json.dumps({"k": kind, "s": session_id, **extra})
        await self.bus.notify([(daemon_channel(owner), payload)])

    async def _tell_quietly(
        self, owner: str, kind: str, session_id: str, extra: dict[str, Any] | None = None
    ) -> None:
        try:
            await self.tell(owner, kind, session_id, **(extra or {}))
        except StoreError as exc:
            log.warning("telling %s of session %s failed (the failover finds it): %s",
                        owner, session_id, exc)  # fmt: skip

    # -- limits counted across daemons ---------------------------------------------------

    async def take(
        self, kind: str, claims: list[tuple[str, int]], rate: tuple[str, int, float] | None = None
    ) -> tuple[str, str | None]:
        """A new slot of `kind` in every (scope, cap) of `claims` (and under `rate`):
        (its key, None) when taken, else (key, the scope that is full, or "rate")."""
        key = f"{kind}-{secrets.token_hex(8)}"
        full = await self.bus.take_slot(key, kind, self.owner, claims, rate)
        return key, full

    async def free(self, key: str, *, keep: bool = False) -> None:
        """Give a slot back (`keep`: it still counts in rate windows). Never raises."""
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            try:
                await self.bus.free_slot(key, keep=keep)
            except StoreError as exc:
                log.warning("giving back slot %s failed: %s", key, exc)

    # -- following ----------------------------------------------------------------------

    async def follow(self, session_id: str) -> None:
        """Listen to the session's frames, wherever it runs (idempotent)."""
        if session_id in self._following:
            return
        async with self._follow_lock(session_id):
            if session_id in self._following:
                return
            await self.bus.listen(session_channel(session_id))
            await self.bus.follow(session_id, self.owner, True)
            note = json.dumps({"s": session_id, "o": self.owner, "on": True})
            await self.bus.notify([(FOLLOW_CHANNEL, note)])
            self._following.add(session_id)

    @asynccontextmanager
    async def _follow_lock(self, session_id: str) -> AsyncIterator[None]:
        """The session's follow lock, forgotten once nobody holds or waits for it."""
        lock = self._follow_locks.setdefault(session_id, trio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._follow_locks.pop(session_id, None)

    def unfollow_soon(self, session_id: str) -> None:
        """The session's actor retired here: stop following it (in the background)."""
        if self._nursery is not None and session_id in self._following:
            self._nursery.start_soon(self._unfollow_quietly, session_id)

    async def _unfollow_quietly(self, session_id: str) -> None:
        try:
            await self.unfollow(session_id)
        except NaviError as exc:
            log.warning("unfollowing session %s failed: %s", session_id, exc)

    async def unfollow(self, session_id: str) -> None:
        async with self._follow_lock(session_id):
            if session_id not in self._following:
                return
            self._following.discard(session_id)
            await self.bus.unlisten(session_channel(session_id))
            await self.bus.follow(session_id, self.owner, False)
            note = json.dumps({"s": session_id, "o": self.owner, "on": False})
            await self.bus.notify([(FOLLOW_CHANNEL, note)])

    # -- publishing ---------------------------------------------------------------------

    def tap(self, encode: Encode) -> Encode:
        """`encode`, and every frame it makes for a session followed elsewhere published."""

        def encode_and_publish(
            event: AgentEvent, session_id: str, seq: int | None, epoch: str | None
        ) -> Frame:
            frame = encode(event, session_id, seq, epoch)
            if session_id in self._followers:
                payload = json.dumps({"f": frame}, ensure_ascii=False)
                actor = self.registry.actor(session_id) if self.registry is not None else None
                fence = actor.frame_fence() if actor is not None else None
                try:
                    self._out_send.send_nowait((session_channel(session_id), payload, fence))
                except trio.WouldBlock:
                    self.dropped += 1  # the followers see a gap: a resync
            return frame

        return encode_and_publish

    async def _publisher(self) -> None:
        async for first in self._out_recv:
            batch = [first]
            while len(batch) < BATCH_MAX:
                try:
                    batch.append(self._out_recv.receive_nowait())
                except trio.WouldBlock:
                    break
            try:
                await self.bus.notify([(c, p) for c, p, _ in batch], [f for _, _, f in batch])
                self.published += len(batch)
            except StoreError as exc:
                self.dropped += len(batch)
                log.warning("publishing %d frame(s) failed: %s", len(batch), exc)

    # -- what arrives -------------------------------------------------------------------

    def _received(self, channel: str, payload: str) -> None:
        """From the bus's thread (through the trio token): queue it for the handler."""
        try:
            self._in_send.send_nowait((channel, payload))
        except trio.WouldBlock:
            self.dropped += 1

    async def _handler(self) -> None:
        async for channel, payload in self._in_recv:
            try:
                await self._handle(channel, payload)
            except NaviError as exc:
                log.warning("a cluster notification on %s failed: %s", channel, exc)

    async def _handle(self, channel: str, payload: str) -> None:
        data = _load(payload)
        if data is None:
            return
        if channel == FOLLOW_CHANNEL:
            sid, owner = str(data.get("s")), str(data.get("o"))
            if owner == self.owner:
                return
            if data.get("on"):
                self._followers.setdefault(sid, set()).add(owner)
            else:
                owners = self._followers.get(sid, set())
                owners.discard(owner)
                if not owners:
                    self._followers.pop(sid, None)
            return
        if channel == daemon_channel(self.owner):
            if await self.calls.received(data):  # approvals, tasks (core/owner_calls.py)
                return
            await self._command(str(data.get("k")), str(data.get("s")), data)
            return
        ref = data.get("ref")
        if isinstance(ref, int):
            text = await self.bus.fetch_frame(ref)
            data = _load(text) if text is not None else None
            if data is None:
                return
        frame = data.get("f")
        if not isinstance(frame, dict) or self.registry is None:
            return
        actor = self.registry.actor(str(frame.get("session_id")))
        if actor is not None:
            actor.relay(frame)
            self.relayed += 1

    async def _command(self, kind: str, session_id: str, data: dict[str, Any]) -> None:
        if self.registry is None:
            return
        if kind == "queued":
            actor = await self.registry.get(session_id)
            actor.dropped(_dropped(data.get("d")))  # what the cap dropped for it, said here
            await actor.adopt_handed()
        elif kind == "stop":
            actor = self.registry.actor(session_id)
            if actor is not None:
                actor.stop()
        elif kind == "compact":
            actor = await self.registry.get(session_id)
            if not actor.busy:
                actor.compact()


def _said(row: dict[str, Any]) -> dict[str, Any]:
    """What a hand-over note carries of a row the cap dropped: enough to name it."""
    return {"text": str(row.get("text", ""))[:DROPPED_CHARS], "kind": str(row.get("kind", ""))}


def _dropped(value: Any) -> Dropped:
    """The dropped rows a note names (another daemon's JSON: each one checked)."""
    if not isinstance(value, list):
        return []
    rows: Dropped = []
    for item in value[:DROPPED_SAID]:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
            row = item[1] if isinstance(item[1], dict) else {}
            rows.append((item[0][:100], _said(row)))
    return rows


def _load(payload: str) -> dict[str, Any] | None:
    try:
        value = json.loads(payload)
    except ValueError:
        log.warning("a cluster notification that is not JSON: %.80r", payload)
        return None
    return value if isinstance(value, dict) else None
