"""The session registry: starts a `SessionActor` per session on demand, retires idle ones.

It keeps the daemon's epoch and each retired actor's last seq, so a successor goes on
from there and a client never sees a seq it already had. Frames are built by functions
the runtime passes in: the core may not import the api.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import partial

import trio

from navi_trio.actor import NurseryHolder
from navi_trio.core.session.broadcast import Encode, LocalBroadcast, Resync, new_epoch
from navi_trio.core.session.session_actor import (
    DeadTurn,
    HandOver,
    RunEnded,
    SessionActor,
    SessionParts,
)
from navi_trio.core.turn import Agent, MergeCount
from navi_trio.errors import NaviError
from navi_trio.events import AgentEvent

log = logging.getLogger(__name__)


class SessionRegistry(NurseryHolder):
    """Starts a SessionActor per session on demand, in the registry's nursery."""

    def __init__(
        self,
        agent: Agent,
        *,
        encode: Encode,
        resync: Resync,
        queue_max: int,
        idle_timeout: float = math.inf,
        on_run_end: RunEnded | None = None,
    ) -> None:
        self.parts = SessionParts.of(agent)
        self.on_run_end = on_run_end  # every run's end (a scheduled run's notice)
        self.encode = encode
        self.resync = resync
        self.queue_max = queue_max
        self.idle_timeout = idle_timeout
        self._actors: dict[str, SessionActor] = {}
        # The last seq of a retired actor: its successor goes on from there.
        self._last_seq: dict[str, int] = {}
        self._starting: dict[str, trio.Event] = {}
        # Whether a starting actor takes over what a crash left queued (the daemon's
        # registry does; an embedded `navi run` does not).
        self.adopt = False
        self.epoch = new_epoch()
        # Set by the cluster: broadcasts that relay other daemons' frames, a word when an
        # actor retires, the look for a turn a dead daemon left, the queue's hand-over.
        self.broadcast_class: type[LocalBroadcast] = LocalBroadcast
        # Deltas merged for slow subscribers, every session's (the daemon's metric).
        self.frames_merged = MergeCount()
        self.on_retire: Callable[[str], None] | None = None
        self.dead_turn: DeadTurn | None = None  # a turn a dead daemon left (the cluster)
        self.hand_over: HandOver | None = None

    async def get(self, session_id: str) -> SessionActor:
        actor = self._actors.get(session_id)
        if actor is not None:
            return actor
        if session_id in self._starting:
            await self._starting[session_id].wait()
            return self._actors[session_id]
        nursery = self.nursery  # RuntimeError when the registry is not running
        started = self._starting[session_id] = trio.Event()
        try:
            broadcast = partial(
                self.broadcast_class,
                encode=self.encode,
                resync=self.resync,
                first_seq=self._last_seq.pop(session_id, 0),
                epoch=self.epoch,
                merges=self.frames_merged,
            )
            actor = SessionActor(
                session_id,
                self.parts,
                broadcast,
                queue_max=self.queue_max,
                idle_timeout=self.idle_timeout,
                on_retire=self._retire,
                adopt=self.adopt,
                on_run_end=self.on_run_end,
                dead_turn=self.dead_turn,
                hand_over=self.hand_over,
            )
            await nursery.start(actor.run)
            self._actors[session_id] = actor
        finally:
            started.set()
            del self._starting[session_id]
        return actor

    def actor(self, session_id: str) -> SessionActor | None:
        return self._actors.get(session_id)

    def counts(self) -> tuple[int, int, int]:
        """(live sessions, running turns, messages queued) in this process, now."""
        actors = list(self._actors.values())
        return len(actors), sum(a.busy for a in actors), sum(len(a.pending) for a in actors)

    def revoke_users(self, user_ids: set[str]) -> None:
        """These users were removed: the turns they started here stop (no message of
        theirs runs any more, anywhere: each run asks the store first)."""
        for actor in list(self._actors.values()):
            actor.revoke(user_ids)

    async def resume_queued(self) -> int:
        """Start the actor of every session with messages queued in the store, so what a crash
        left runs whether or not anybody connects; each actor adopts only a dead process's rows."""
        try:
            sids = await self.parts.store.queued_sessions()
        except NaviError as exc:
            log.warning("reading the sessions with queued messages failed: %s", exc)
            return 0
        for sid in sids:
            await self.get(sid)
        return len(sids)

    def _retire(self, actor: SessionActor) -> None:
        if self._actors.get(actor.session_id) is actor:
            del self._actors[actor.session_id]
            floor = getattr(actor.broadcast, "seq_floor", actor.seq)
            self._last_seq[actor.session_id] = max(actor.seq, floor)
            self.forget(actor.session_id)
            if self.on_retire is not None:
                self.on_retire(actor.session_id)

    def forget(self, session_id: str) -> None:
        """Drop the session's cached state (it was deleted, or its actor retired)."""
        self.parts.forget(session_id)

    def attached(self, session_id: str) -> bool:
        """Whether a client is subscribed to the session (someone could answer it)."""
        actor = self._actors.get(session_id)
        return actor is not None and actor.broadcast.subscribed

    def publish_task_update(self, session_id: str, event: AgentEvent) -> None:
        """TaskSupervisor's publish: out-of-band to the session's connected clients."""
        actor = self._actors.get(session_id)
        if actor is not None:
            actor.broadcast.publish_out_of_band(event)
