"""Several daemons on one database: routing, events across daemons, failover.

    cluster = Cluster(bus, leases, settings)      # when the store has a bus (PostgreSQL)
    cluster.attach(registry, supervisor)
    await nursery.start(cluster.run)
    encode = cluster.tap(event_frame)             # every frame this daemon publishes

Only with a store that offers a bus (PostgreSQL's LISTEN / NOTIFY); with SQLite there is
one daemon and no Cluster. docs/pages/scaling.md describes the whole; the rules here:

- A session's owner is the daemon holding its lease. A message for a session another
  live daemon runs is written to its durable queue as nobody's row, under the queue's
  cap, and the owner is told on its channel (``nd_…``) to adopt it; the client's ``ok``
  comes once the row is committed, so it survives the owner dying. A stop, an approval
  and a task cancel ask the owner and wait for its answer (`OwnerCalls`).
- A daemon with clients on a session it does not run follows it (a ``follows`` row and a
  LISTEN on ``ns_…``). The owner publishes those frames in batches, each carrying the
  run's lease fence, checked in the statement that notifies: a run taken over reaches
  no other daemon's clients. A lease is let go only once the frames published so far
  are sent (`sent`): none goes out after another daemon claimed the session, and that
  daemon's claim waits until they are handed to the session here (`caught_up`). A break
  in the seqs or another epoch is a ``resync``. A turn's ``stream_end`` clears its
  lease's debt (store/base.py `end_owed`) in the commit that sends it, followed or not:
  a daemon taking a dead owner's lease over says that end only if nobody had it.
- A user's notice (``navi_notices``, every daemon listens) goes out through the same
  outbox, after the frames published before it; each daemon hands another's to its own
  clients of the user (`share_notices`).
- While the listener is down, what needs it is refused (``storage``); once back, every
  followed session is told ``resync`` and the failover scan runs at once.
- Failover: a lease is live while unexpired and, on this machine, its pid lives (watched
  through pidfds). The scan (every half TTL, and at once on a death or a reconnect)
  starts the actor of a session with queued messages and no live lease, which ends the
  dead owner's turn and adopts the queued rows; lost background jobs are reported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from navi_trio.core.cluster.owner_calls import ASK_TIMEOUT_SEC, Answers, OwnerCalls
from navi_trio.core.session import Dropped, to_row
from navi_trio.core.turn import SessionLeases, UserMessage
from navi_trio.errors import NaviError, StoreError
from navi_trio.events import AgentEvent, StreamEnd
from navi_trio.notices import Notice, UserNotices, notice_data, notice_of
from navi_trio.store.base import (
    HANDED_HOST,
    HANDED_PID,
    USERS_CHANNEL,
    ClusterBus,
    LeaseRow,
)
from navi_trio.store.fence import Fence, current_fence, pid_alive
from navi_trio.store.methods import SessionStore

log = logging.getLogger(__name__)

Frame = dict[str, Any]
# (channel, payload, the fence it must pass, whether it ends its fence's turn): no
# channel for a turn's end that no other daemon follows (its lease's debt only).
Outgoing = tuple["str | None", str, Fence | None, bool]
Encode = Callable[[AgentEvent, str, "int | None", "str | None"], Frame]
FOLLOW_CHANNEL = "navi_follow"
# How a mark of `caught_up` on this daemon's own channel starts, as json.dumps makes it:
# told apart from the other notifications as it arrives, without parsing each.
MARK_PREFIX = json.dumps({"k": "mark", "n": 0})[: -len("0}")]
DAEMONS_CHANNEL = "navi_daemons"  # a daemon started: (owner, pid, host), to be watched
NOTICES_CHANNEL = "navi_notices"  # a user's notice (a scheduled run ended), for every daemon
INBOX_MAX = 20_000  # notifications waiting for the handler; past it, dropped (a resync)
BATCH_MAX = 500  # frames per NOTIFY transaction
WATCH_MAX = 256  # daemons of this machine watched through pidfds
DROPPED_SAID = 20  # dropped rows named in one hand-over note (NOTIFY's 8000 bytes)
DROPPED_CHARS = 200  # what a note carries of each one's text
CAUGHT_UP_SEC = 5.0  # the longest a claim waits for the frames sent before it


def session_channel(session_id: str) -> str:
    return "ns_" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


def daemon_channel(owner: str) -> str:
    return "nd_" + hashlib.sha256(owner.encode()).hexdigest()[:40]


class ClusterRegistry(Protocol):
    def actor(self, session_id: str) -> Any: ...
    async def get(self, session_id: str) -> Any: ...


class LostJobs(Protocol):
    async def report_lost_jobs(self, live: set[tuple[int, str]] | None = None) -> int: ...
    def cancel(self, session_id: str, task_id: str) -> bool: ...


class Cluster:
    """This daemon's part in a cluster of daemons on one database (see the module)."""

    def __init__(
        self,
        bus: ClusterBus,
        store: SessionStore,
        leases: SessionLeases,
        ttl: float,
        *,
        queue_max: int | None = None,
        ask_timeout: float = ASK_TIMEOUT_SEC,
    ) -> None:
        self.bus = bus
        self.store = store
        self.leases = leases
        self.owner = leases.owner
        self.ttl = ttl
        self.queue_max = None if queue_max is None else max(queue_max, 1)
        self.registry: ClusterRegistry | None = None
        self.jobs: LostJobs | None = None
        # Approvals and task cancels answered by the daemon that holds them.
        self.calls = OwnerCalls(bus, store, self.owner, daemon_channel, ask_timeout)
        self._tag = secrets.token_hex(4)  # marks the frames this daemon publishes
        self._scan_soon = trio.Event()  # a daemon here died, the listener is back
        self._watched: set[str] = set()  # daemons of this machine watched (pidfds)
        # Sessions some other daemon follows: their frames are published.
        self._followers: dict[str, set[str]] = {}
        self._notes_meanwhile: list[tuple[str, str, bool]] | None = None
        self._following: set[str] = set()  # sessions this daemon listens to
        # One lock per session being followed or unfollowed: its listen, row and note
        # go in order; other sessions' do not wait (one lock for all made 500 sessions
        # started at once take their turns, one round trip after another, for 30 s).
        self._follow_locks: dict[str, trio.Lock] = {}
        self._out_send, self._out_recv = trio.open_memory_channel[Outgoing](INBOX_MAX)
        # Frames put in the outbox, and those of them the publisher is done with (sent or
        # dropped): a lease is released only once its hold's frames are out (`sent`).
        self._queued = 0
        self._done = 0
        self._done_news = trio.Event()
        self._publishing = False
        leases.before_release = self.sent
        leases.after_claim = self.caught_up
        # This daemon's marks on its own channel (`caught_up`): the session channel each
        # waits for, and the event set once that channel's earlier notifications are handled.
        self._marks: dict[int, tuple[str, trio.Event]] = {}
        self._marked = 0
        # Per channel with notifications in the inbox: [queued, handled] so far, and the
        # marks that wait until `handled` reaches a count.
        self._inbox: dict[str, list[int]] = {}
        self._waits: dict[str, list[tuple[int, trio.Event]]] = {}
        self._handling = False
        self._in_send, self._in_recv = trio.open_memory_channel[tuple[str, str]](INBOX_MAX)
        self._nursery: trio.Nursery | None = None
        # Told of each committed change of the users table (core/session/user_watch.py).
        self.users_changed: Callable[[], None] = lambda: None
        self.notices: UserNotices | None = None  # this daemon's clients' (`share_notices`)
        self.dropped = 0  # notifications dropped (inbox or outbox full)

    def attach(
        self, registry: ClusterRegistry, jobs: LostJobs | None, approvals: Answers | None = None
    ) -> None:
        self.registry = registry
        self.jobs = jobs
        self.calls.attach(approvals, jobs, self._stop_here)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.bus.on_message(self._received)
        self.bus.on_reconnect(self._reconnected)
        try:
            async with self.bus.listening():
                await self.bus.heartbeat(self.owner, self.leases.pid, self.leases.host, self.ttl)
                await self.bus.listen(daemon_channel(self.owner))
                await self.bus.listen(FOLLOW_CHANNEL)
                await self.bus.listen(USERS_CHANNEL)
                await self.bus.listen(DAEMONS_CHANNEL)
                await self.bus.listen(NOTICES_CHANNEL)
                for sid, owner in await self.bus.follows():
                    if owner != self.owner:
                        self._followers.setdefault(sid, set()).add(owner)
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    # The daemons up now are watched by the first scan, those that start
                    # later from their word here: no window where one dies unwatched.
                    here = {"o": self.owner, "p": self.leases.pid, "h": self.leases.host}
                    await self.bus.notify([(DAEMONS_CHANNEL, json.dumps(here))])
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
        """Every half TTL, or at once when asked: run what dead daemons left."""
        while True:
            with trio.move_on_after(self.ttl / 2):
                await self._scan_soon.wait()
            self._scan_soon = trio.Event()
            await self._take_orphans_quietly()

    async def _take_orphans_quietly(self) -> None:
        try:
            await self.take_orphans()
        except NaviError as exc:
            log.warning("looking for sessions to take over failed: %s", exc)

    async def take_orphans(self) -> int:
        """End the turns dead daemons left, start the sessions with queued messages and
        no live owner, and those with messages handed here; how many messages taken."""
        daemons = await self.bus.live_daemons()
        dead = [o for o, pid, host in daemons if self._here(o, host) and not pid_alive(pid)]
        for owner in dead:  # gone now, not at its row's expiry: what it held is nobody's
            await self.bus.leave(owner)
            log.warning("daemon %s of this machine is dead: taking its sessions over", owner)
            for sid, followers in list(self._followers.items()):
                followers.discard(owner)
                if not followers:
                    del self._followers[sid]
        self._watch(daemons)
        orphans = await self.bus.orphans(self.owner, dead)
        taken = 0
        if self.registry is not None:
            for sid in orphans:
                actor = await self.registry.get(sid)
                await actor.take_over()  # a turn a dead owner left: ended first
                taken += await actor.adopt_handed()
        if taken:
            log.info("took over %d queued message(s) of %d session(s)", taken, len(orphans))
        if self.jobs is not None:
            live = {(pid, host) for o, pid, host in daemons if o not in dead}
            await self.jobs.report_lost_jobs(live)
        return taken

    def _here(self, owner: str, host: str) -> bool:
        """Another daemon of this machine (its pid means something here)."""
        return host == self.leases.host and owner != self.owner

    def _watch(self, daemons: list[tuple[str, int, str]]) -> None:
        """Watch each other daemon of this machine: its death starts a scan at once."""
        if self._nursery is None:
            return
        for owner, pid, host in daemons:
            if not self._here(owner, host) or owner in self._watched:
                continue
            if len(self._watched) >= WATCH_MAX:
                break
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):
                continue  # gone already (the scan sees it), or no pidfds here
            self._watched.add(owner)
            self._nursery.start_soon(self._watch_one, owner, fd)

    async def _watch_one(self, owner: str, fd: int) -> None:
        try:
            await trio.lowlevel.wait_readable(fd)  # readable once the process ended
        finally:
            os.close(fd)
            self._watched.discard(owner)
        self._scan_soon.set()

    def _reconnected(self) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._resume)

    async def _resume(self) -> None:
        """What arrived while the listener was down is lost: every session followed here
        and run elsewhere resyncs its subscribers, the follows are read again, and the
        scan looks for messages handed here meanwhile. A change of the users announced
        meanwhile is lost too: the users are looked at again."""
        self.users_changed()
        if self.registry is not None:
            for sid in list(self._following):
                actor = self.registry.actor(sid)
                if actor is not None and not actor.busy:
                    actor.resync()
        self._notes_meanwhile = []  # follow notes heard while the rows are read
        try:
            followers: dict[str, set[str]] = {}
            for sid, owner in await self.bus.follows():
                if owner != self.owner:
                    followers.setdefault(sid, set()).add(owner)
            for note in self._notes_meanwhile:  # newer than the rows, or as new
                self._follow_note(followers, *note)
            self._followers = followers
        except NaviError as exc:
            log.warning("reading the other daemons' follows failed: %s", exc)
        finally:
            self._notes_meanwhile = None
        self._scan_soon.set()

    async def lease_state(self, session_id: str) -> tuple[str | None, LeaseRow | None]:
        """(the other daemon running the session now, or None; a lease a dead owner never
        released, or None). Live: not released, not expired, and on this machine its pid
        alive."""
        found = await self.bus.lease(session_id)
        if found is None:
            return None, None
        lease, now = found
        if lease.owner == self.owner or lease.expires_at == 0:
            return None, None
        if lease.expires_at <= now or self._dead_here(lease):
            return None, lease
        return lease.owner, None

    def _dead_here(self, lease: LeaseRow) -> bool:
        return lease.host == self.leases.host and not pid_alive(lease.pid)

    async def dead_turn(self, session_id: str) -> int | None:
        """Take over the lease a dead owner left on the session, if one did and no other
        daemon took it first: its new generation (the session actor then ends the dead
        turn under it: `Agent.end_dead_turn`), else None."""
        _, abandoned = await self.lease_state(session_id)
        if abandoned is None:
            return None
        leases = self.leases
        return await self.bus.take_abandoned(
            abandoned,
            self.owner,
            leases.pid,
            leases.host,
            self.ttl,
            dead=self._dead_here(abandoned),
        )

    async def owner_elsewhere(self, session_id: str) -> str | None:
        """The other daemon running the session now, if one does. A turn a dead owner
        left is ended first, and the messages handed to it are taken here, before the
        command goes on (behind them)."""
        owner, abandoned = await self.lease_state(session_id)
        if self.registry is None:
            return owner
        if abandoned is not None:  # its turn ended, then what was handed to it, in order
            actor = await self.registry.get(session_id)
            await actor.take_over()
            await actor.adopt_handed()
        elif owner is None and (actor := self.registry.actor(session_id)) is not None:
            actor.dead_turn_checked = True  # just looked: nothing to end
        return owner

    async def hand_over(self, owner: str, session_id: str, msg: UserMessage) -> None:
        """Queue `msg` for the daemon `owner` that runs the session, and tell it.

        Stored before this returns (the client's ok), under the queue's cap: if the
        owner dies first, whoever takes the session over runs it. A write that fails
        raises (the client's error: nothing stored); a note that fails after it does
        not (the failover finds the row within half a TTL)."""
        key = f"h-{self.owner.rsplit(':', 1)[-1]}-{trio.current_time():.6f}-{id(msg):x}"
        dropped = await self.store.enqueue(
            session_id,
            key,
            to_row(msg),
            pid=HANDED_PID,
            host=HANDED_HOST,
            keep=self.queue_max,
            claim=msg.key_claim(),
        )
        msg.accepted.ok()
        said = [[k, _said(row)] for k, row in dropped[-DROPPED_SAID:]]
        await self._tell_quietly(owner, "queued", session_id, {"d": said} if said else {})

    async def hand_back(self, session_id: str, keys: list[str]) -> None:
        """This daemon's run found the session taken: leave its queued rows (`keys`) to
        the daemon that runs it now, and tell it. NaviError when nobody else runs it
        now (a lease a dead owner left is nobody's: the caller ends its turn and runs
        them), or the store did not answer: the caller keeps them."""
        owner, _ = await self.lease_state(session_id)
        if owner is None:
            raise NaviError(f"session {session_id!r}: no other daemon runs it now")
        await self.store.release_queued(
            session_id, keys, pid=self.leases.pid, host=self.leases.host
        )
        await self._tell_quietly(owner, "queued", session_id)

    async def tell(self, owner: str, kind: str, session_id: str, **extra: Any) -> None:
        payload = json.dumps({"k": kind, "s": session_id, **extra})
        await self.bus.notify([(daemon_channel(owner), payload)])

    async def _tell_quietly(
        self, owner: str, kind: str, session_id: str, extra: dict[str, Any] | None = None
    ) -> None:
        try:
            await self.tell(owner, kind, session_id, **(extra or {}))
        except StoreError as exc:
            log.warning(
                "telling %s of session %s failed (the failover finds it): %s",
                owner,
                session_id,
                exc,
            )

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

    def share_notices(self, notices: UserNotices) -> None:
        """The users' notices published here reach their clients on the other daemons, and
        theirs the clients here. They go out through the same outbox as the frames, so a
        notice that follows a run's end (a scheduled run's ``schedule_run``) reaches
        another daemon after that end, as it does here."""
        self.notices = notices
        notices.elsewhere = self._publish_notice

    def _publish_notice(self, user_id: str, notice: Notice) -> None:
        data = {"u": user_id, "n": notice_data(notice), "d": self._tag}
        payload = json.dumps(data, ensure_ascii=False)
        if not self._out((NOTICES_CHANNEL, payload, None, False)):
            log.warning("a notice for user %s was not passed to the other daemons", user_id)

    def _out(self, item: Outgoing) -> bool:
        """Into the outbox, unless it is full (then counted as dropped): whether it went."""
        try:
            self._out_send.send_nowait(item)
        except trio.WouldBlock:
            self.dropped += 1
            return False
        self._queued += 1
        return True

    def tap(self, encode: Encode) -> Encode:
        """`encode`, and every frame it makes for a session followed elsewhere published. A
        turn's end said under a lease goes through the outbox in any case: its commit clears
        that lease's debt (`_publisher`), with the frame when another daemon follows."""

        def encode_and_publish(
            event: AgentEvent, session_id: str, seq: int | None, epoch: str | None
        ) -> Frame:
            frame = encode(event, session_id, seq, epoch)
            followed = session_id in self._followers
            ends = type(event) is StreamEnd and not event.is_subagent
            if not followed and not ends:
                return frame
            fence = self._frame_fence(session_id, ends)
            if followed:
                payload = json.dumps({"f": frame, "d": self._tag}, ensure_ascii=False)
                # Dropped (a full outbox): the followers see a gap (a resync), and the
                # lease still owes the end: a daemon taking it over says it.
                self._out((session_channel(session_id), payload, fence, ends))
            elif fence is not None:
                self._out((None, "", fence, True))
            return frame

        return encode_and_publish

    def _frame_fence(self, session_id: str, ends: bool) -> Fence | None:
        """The fence a frame of the session published now passes: the running run's
        (`SessionActor.frame_fence`), else, for a turn's end, the lease held where it is
        said (a dead owner's turn ended under the lease taken over)."""
        actor = self.registry.actor(session_id) if self.registry is not None else None
        fence = actor.frame_fence() if actor is not None else None
        if fence is None and ends:
            held = current_fence()
            fence = held if held is not None and held.session_id == session_id else None
        return fence

    async def sent(self) -> None:
        """Until the frames published so far are through the bus (or dropped): before a
        lease's release, so that a frame of its hold is never sent after another daemon
        claimed the session (its fence would refuse it there, or that daemon's run would
        take it for a replaced owner's late frame)."""
        target = self._queued
        while self._publishing and self._done < target:
            await self._done_news.wait()

    async def caught_up(self, session_id: str) -> None:
        """Until the session's frames other daemons sent before now are handed to its actor:
        after a claim of its lease, so that this daemon's run takes none of them for a
        replaced owner's late frame. A mark sent on this daemon's own channel comes back
        through the listener behind every notification committed before it, and the
        handler takes them in order; once it is back, this waits only for the session's own
        notifications that came before it, not for the handler's backlog of other sessions
        (`_mark_back`). Only for a session followed here, while the listener is up (down,
        what is sent meanwhile is lost anyway: a resync); bounded."""
        if session_id not in self._following or not self._handling or not self.bus.up:
            return
        self._marked += 1
        mark, back = self._marked, trio.Event()
        self._marks[mark] = (session_channel(session_id), back)
        try:
            with trio.move_on_after(CAUGHT_UP_SEC):
                payload = json.dumps({"k": "mark", "n": mark})  # starts with MARK_PREFIX
                await self.bus.notify([(daemon_channel(self.owner), payload)])
                await back.wait()
        except StoreError as exc:
            log.info("session %s: its frames sent before the claim: %s", session_id, exc)
        finally:
            del self._marks[mark]

    async def _publisher(self) -> None:
        self._publishing = True
        try:
            async for first in self._out_recv:
                batch = [first]
                while len(batch) < BATCH_MAX:
                    try:
                        batch.append(self._out_recv.receive_nowait())
                    except trio.WouldBlock:
                        break
                frames = [(c, p) for c, p, _, _ in batch if c is not None]
                fences = [f for c, _, f, _ in batch if c is not None]
                ended = [f for _, _, f, end in batch if end and f is not None]
                try:
                    await self.bus.notify(frames, fences, ended)
                except StoreError as exc:
                    self.dropped += len(batch)
                    log.warning("publishing %d frame(s) failed: %s", len(batch), exc)
                self._done += len(batch)
                self._tell_done()
        finally:
            self._publishing = False
            self._tell_done()

    def _tell_done(self) -> None:
        news, self._done_news = self._done_news, trio.Event()
        news.set()

    def _received(self, channel: str, payload: str) -> None:
        """From the bus's thread (through the trio token): queue it for the handler."""
        if channel == USERS_CHANNEL:  # never dropped behind a full inbox of frames
            self.users_changed()
            return
        if channel == daemon_channel(self.owner) and payload.startswith(MARK_PREFIX):
            self._mark_back(payload)  # (`caught_up`) not behind the inbox either
            return
        try:
            self._in_send.send_nowait((channel, payload))
        except trio.WouldBlock:
            self.dropped += 1
            return
        self._inbox.setdefault(channel, [0, 0])[0] += 1

    def _mark_back(self, payload: str) -> None:
        """A mark of `caught_up` came back: every notification committed before it has come
        too. Its wait ends once those of its session's channel are handled (now, when none
        waits in the inbox)."""
        data = _load(payload)
        mark = data.get("n") if data is not None else None
        entry = self._marks.get(mark) if isinstance(mark, int) else None
        if entry is None:
            return
        channel, back = entry
        count = self._inbox.get(channel)
        if count is None:
            back.set()
        else:
            self._waits.setdefault(channel, []).append((count[0], back))

    def _handled(self, channel: str) -> None:
        """One notification of `channel` handled: the marks waiting for it are back."""
        count = self._inbox.get(channel)
        if count is None:
            return
        count[1] += 1
        waits = self._waits.get(channel, [])
        for target, back in waits:
            if target <= count[1]:
                back.set()
        waits[:] = [(target, back) for target, back in waits if target > count[1]]
        if count[1] >= count[0]:  # none left in the inbox (nor a mark waiting for one)
            del self._inbox[channel]
            self._waits.pop(channel, None)

    async def _handler(self) -> None:
        self._handling = True
        try:
            async for channel, payload in self._in_recv:
                try:
                    await self._handle(channel, payload)
                except NaviError as exc:
                    log.warning("a cluster notification on %s failed: %s", channel, exc)
                finally:
                    self._handled(channel)
        finally:
            self._handling = False

    async def _handle(self, channel: str, payload: str) -> None:
        data = _load(payload)
        if data is None:
            return
        if channel == FOLLOW_CHANNEL:
            sid, owner = str(data.get("s")), str(data.get("o"))
            if owner != self.owner:
                self._follow_note(self._followers, sid, owner, bool(data.get("on")))
                if self._notes_meanwhile is not None:
                    self._notes_meanwhile.append((sid, owner, bool(data.get("on"))))
            return
        if channel == DAEMONS_CHANNEL:
            who, pid, host = data.get("o"), data.get("p"), data.get("h")
            if isinstance(who, str) and isinstance(pid, int) and isinstance(host, str):
                self._watch([(who, pid, host)])
            return
        if channel == daemon_channel(self.owner):
            if await self.calls.received(data):  # approvals, tasks (core/cluster/owner_calls.py)
                return
            await self._command(str(data.get("k")), str(data.get("s")), data)
            return
        ref = data.get("ref")
        if isinstance(ref, int):
            text = await self.bus.fetch_frame(ref)
            data = _load(text) if text is not None else None
            if data is None:
                return
        if channel == NOTICES_CHANNEL:
            self._notice(data)
            return
        frame = data.get("f")
        if not isinstance(frame, dict) or self.registry is None or data.get("d") == self._tag:
            return  # not a frame, or our own (we follow what we run too)
        actor = self.registry.actor(str(frame.get("session_id")))
        if actor is not None:
            actor.relay(frame)

    def _notice(self, data: dict[str, Any]) -> None:
        """A user's notice another daemon published: to the user's clients here."""
        user_id, notice = data.get("u"), notice_of(data.get("n"))
        if self.notices is None or data.get("d") == self._tag:
            return  # ours: its clients here had it when it was published
        if isinstance(user_id, str) and notice is not None:
            self.notices.publish_here(user_id, notice)

    @staticmethod
    def _follow_note(followers: dict[str, set[str]], sid: str, owner: str, on: bool) -> None:
        if on:
            followers.setdefault(sid, set()).add(owner)
            return
        owners = followers.get(sid, set())
        owners.discard(owner)
        if not owners:
            followers.pop(sid, None)

    async def _command(self, kind: str, session_id: str, data: dict[str, Any]) -> None:
        if self.registry is None:
            return
        if kind == "queued":
            actor = await self.registry.get(session_id)
            actor.dropped(_dropped(data.get("d")))  # what the cap dropped for it, said here
            await actor.adopt_handed()
        elif kind == "stop":  # from a daemon that does not wait for the answer
            self._stop_here(session_id)
        elif kind == "compact":
            actor = await self.registry.get(session_id)
            if not actor.busy:
                actor.compact()

    def _stop_here(self, session_id: str) -> bool:
        """Stop the session's turn if it runs here (asked by another daemon)."""
        actor = None if self.registry is None else self.registry.actor(session_id)
        return actor is not None and actor.stop()


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
