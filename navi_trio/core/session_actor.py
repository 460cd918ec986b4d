"""Session actors: one per live session, started on demand by the registry.

A `SessionActor` owns its runs (a nursery inside the actor), the message queue
(background-tasks.md "Message queue": a message arriving while a run is active is
queued, ``message_queue_max`` deep, oldest dropped and counted in ``dropped_total``;
queued messages run in submit order when the run ends, whether or not anybody is
connected) and the fan-out of its events to subscribers. Queued messages are durable
(`core/queued.py`): each is stored before it is acknowledged, and a crash's leftovers
are adopted when the session's actor starts and run before anything new.

Every message's `accepted` (core/acceptance.py) is settled exactly once: ok when it is
committed (queued, or saved by its run), else the error that kept it out (the session
busy in another process, a full disk, a damaged database, a shutdown). The sender
answers with that outcome; a refused message never runs.

Every event of a run or compaction becomes a wire frame ``{"type", "session_id",
"seq", "epoch", ...}`` kept in a bounded replay buffer (`core/replay.py`: consecutive
deltas merged), so a subscriber that reconnects with the last seq it saw gets what it
missed. When what it missed has left the buffer, or it comes from another epoch (the
daemon restarted: seqs start again), its first frame is ``resync``: reload the history,
then the live frames follow. Never a silent gap. `task_update` frames are out-of-band:
sent to the subscribers of the moment, with no seq and not kept for replay (a client
re-syncs through the tasks list).

Commands are synchronous methods (atomic under trio): `send_message`, `stop`, `compact`,
`subscribe`. A subscriber too slow to keep up with its bounded channel is cut off: its
channel is closed after the frames already in it, and `Subscription.lagged` says from
which seq it missed frames, so its owner can tell the client why and subscribe again
from the last seq it delivered. The run and the other subscribers never wait for it.
While it is behind, its waiting text deltas merge into one frame (`core/fanout.py`), so
a long answer alone never cuts it off.
"""

from __future__ import annotations

import collections
import logging
import math
import secrets
from collections.abc import Callable
from typing import Any

import trio

from navi_trio.core.acceptance import stopped_before_saving
from navi_trio.core.agent import Agent, RunControl, UserMessage
from navi_trio.core.fanout import FrameReceiver, FrameSender, open_frame_channel
from navi_trio.core.queued import DurableQueue
from navi_trio.core.replay import ReplayBuffer
from navi_trio.core.steering import (
    SteerItem,
    busy_strategy,
    check_steer,
    refusal,
    steer_item,
)
from navi_trio.errors import (
    NaviError,
    NothingToCompactError,
    RequestError,
    StorageError,
)
from navi_trio.events import (
    AgentEvent,
    ErrorEvent,
    MessageQueued,
    StreamEnd,
    ToolResultEvent,
)
from navi_trio.profiles import OnBusy

log = logging.getLogger(__name__)

Frame = dict[str, Any]
# Turns an event into a wire frame: (event, session_id, seq or None, epoch) -> frame.
# The one encoder lives in api/protocol.py (`event_frame`); the runtime passes it in,
# since the core may not import the api layer.
Encode = Callable[[AgentEvent, str, "int | None", "str | None"], Frame]
# Told when a run ends: (session_id, its message, its stream_end).
RunEnded = Callable[[str, UserMessage, StreamEnd], None]
SUBSCRIBER_BUFFER = 1000
# A run cancelled under it (the runtime shutting down) still ends itself, shielded: its
# last events (the partial answer's stream_end) are read and published for this long.
END_DRAIN_SEC = 15.0


def new_epoch() -> str:
    """Names one life of the daemon: seqs of another epoch mean nothing here."""
    return secrets.token_hex(4)


class Subscription:
    """A subscriber's end: frames arrive on `frames`; `close()` unsubscribes.

    `lagged` is set when the subscriber fell behind and was cut off: ``(missed_from,
    missed_to)``, the seqs of the first and last frame it did not get at that moment.
    """

    def __init__(
        self,
        actor: SessionActor,
        send: FrameSender,
        frames: FrameReceiver,
    ) -> None:
        self._actor = actor
        self._send = send
        self.frames = frames
        self.lagged: tuple[int, int] | None = None

    def close(self) -> None:
        self._actor._subscribers.pop(self._send, None)
        self._actor._touch()
        self._send.close()
        self.frames.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SessionActor:
    def __init__(
        self,
        session_id: str,
        agent: Agent,
        *,
        encode: Encode,
        queue_max: int,
        idle_timeout: float = math.inf,
        first_seq: int = 0,
        epoch: str | None = None,
        on_retire: Callable[[SessionActor], None] | None = None,
        adopt: bool = False,
        on_run_end: RunEnded | None = None,
    ) -> None:
        self.session_id = session_id
        self._on_run_end = on_run_end
        self._adopt = adopt
        self.agent = agent
        self.encode = encode
        self.queue_max = queue_max
        self.idle_timeout = idle_timeout
        self._on_retire = on_retire
        self._changed = trio.Event()
        self.retired = trio.Event()
        self.pending: collections.deque[UserMessage] = collections.deque()
        self.queue = DurableQueue(
            session_id, agent.store, pid=agent.leases.pid, host=agent.leases.host
        )
        self.dropped_total = 0
        self.seq = first_seq
        self.epoch = epoch or new_epoch()
        self.replay = ReplayBuffer()
        self._subscribers: dict[FrameSender, Subscription] = {}
        self._nursery: trio.Nursery | None = None
        self._control: RunControl | None = None
        self.busy = False
        self.idle = trio.Event()
        self.idle.set()

    async def run(
        self, *, task_status: trio.TaskStatus[SessionActor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        # What a crash left queued runs first, in its order, before any new message.
        if self._adopt:
            self.pending.extend(await self.queue.adopt())
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started(self)
                if self.pending:
                    self._start_run(self.pending.popleft())
                try:
                    await self._live_until_retired()
                finally:
                    self._nursery = None
        finally:
            # Only once the runs are over: a run ended by a shutdown still publishes
            # its stream_end to whoever is subscribed.
            for send in list(self._subscribers):
                send.close()

    def _retirable(self) -> bool:
        return not self.busy and not self.pending and not self._subscribers

    def _touch(self) -> None:
        """Something changed that may start or cancel the idle countdown."""
        self._changed.set()

    async def _live_until_retired(self) -> None:
        # Idle (no run, no queue, nobody subscribed) for idle_timeout: retire, so a
        # long-running daemon does not keep every session it ever saw in memory.
        while True:
            self._changed = trio.Event()
            if not self._retirable():
                await self._changed.wait()
                continue
            with trio.move_on_after(self.idle_timeout):
                await self._changed.wait()
                continue
            if self._retirable():
                # Synchronously, before any checkpoint: from here on the registry
                # starts a new actor for this session.
                self.retired.set()
                if self._on_retire is not None:
                    self._on_retire(self)
                return

    # -- commands -------------------------------------------------------------------

    def send_message(self, message: str | UserMessage) -> OnBusy | None:
        """Run the message, or (the session busy) apply its `on_busy` strategy
        (core/steering.py); returns that strategy, None when it runs now. `reject`
        raises SessionBusyError."""
        msg = UserMessage(message) if isinstance(message, str) else message
        if not self.busy:
            self._start_run(msg)
            return None
        if self._nursery is None:
            raise RuntimeError(f"session actor {self.session_id} is not running")
        control = self._control
        strategy = busy_strategy(msg.on_busy, control)
        if strategy == "reject":
            raise refusal(self.session_id, control)
        # Stored before it is acknowledged: `msg.accepted` is ok once its row is in.
        if strategy == "steer" and control is not None:
            check_steer(msg.text, control)
            msg = self.queue.keep(self._nursery, msg)
            control.injections.steer(steer_item(msg, self.queue.written))
            return strategy
        if len(self.pending) >= self.queue_max:
            self.queue.drop(self._nursery, self.pending.popleft())
            self.dropped_total += 1
        msg = self.queue.keep(self._nursery, msg)
        if strategy == "interrupt" and control is not None:
            self.pending.appendleft(msg)  # next, ahead of the queue
            control.stop()
        else:
            self.pending.append(msg)
        position = 1 if strategy == "interrupt" else len(self.pending)
        self.publish(
            MessageQueued(text=msg.text, position=position, dropped_total=self.dropped_total)
        )
        return strategy

    @property
    def running(self) -> RunControl | None:
        """The control of the turn running now (None: idle, or compacting)."""
        return self._control

    def stop(self) -> bool:
        """Stop the running turn (queued messages stay queued). False when idle."""
        if self._control is None:
            return False
        self._control.stop()
        return True

    def compact(self) -> None:
        if self.busy:
            self.publish(
                ErrorEvent(
                    message="a run is active: stop it or wait before compacting", code="busy"
                )
            )
            return
        self._start(self._compact)

    def subscribe(self, last_seq: int | None = None, epoch: str | None = None) -> Subscription:
        """Frames after `last_seq` from the replay buffer, then live ones.

        With no `last_seq`, live frames only. When the frames after `last_seq` are no
        longer all here, or `epoch` is another daemon life's, the first frame is
        ``resync`` (reload the history; live frames go on from its seq).
        """
        backlog: list[Frame] = []
        if last_seq is not None:
            missed = (
                None if epoch not in (None, self.epoch) else self.replay.since(last_seq, self.seq)
            )
            backlog = [self.resync_frame()] if missed is None else missed
        # Room for the whole backlog on top of the usual margin: a replay must never
        # cut off the subscriber it is for.
        send, recv = open_frame_channel(SUBSCRIBER_BUFFER + len(backlog))
        sub = Subscription(self, send, recv)
        self._subscribers[send] = sub
        for frame in backlog:
            self._offer(send, frame)
        self._touch()
        return sub

    def resync_frame(self) -> Frame:
        return {
            "type": "resync",
            "session_id": self.session_id,
            "seq": self.seq,
            "epoch": self.epoch,
        }

    # -- fan-out --------------------------------------------------------------------

    def publish(self, event: AgentEvent) -> Frame:
        self.seq += 1
        frame = self.encode(event, self.session_id, self.seq, self.epoch)
        self.replay.append(frame)
        self._fan_out(frame)
        return frame

    def publish_out_of_band(self, event: AgentEvent) -> None:
        self._fan_out(self.encode(event, self.session_id, None, self.epoch))

    def _fan_out(self, frame: Frame) -> None:
        for send in list(self._subscribers):
            self._offer(send, frame)

    def _offer(self, send: FrameSender, frame: Frame) -> None:
        try:
            send.send_nowait(frame)
        except trio.WouldBlock:
            sub = self._subscribers.pop(send, None)
            seq = frame["seq"] if isinstance(frame.get("seq"), int) else self.seq
            if sub is not None:
                sub.lagged = (seq, max(seq, self.seq))
            log.warning(
                "session %s: a subscriber fell behind at seq %s; cut off", self.session_id, seq
            )
            send.close()
            self._touch()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._subscribers.pop(send, None)
            self._touch()

    # -- work -------------------------------------------------------------------------

    def _start(self, fn: Any, *args: Any) -> None:
        if self._nursery is None:
            raise RuntimeError(f"session actor {self.session_id} is not running")
        self.busy = True
        self._touch()
        # A queued run follows the last one: whoever waits for idle keeps waiting on the
        # same event until the queue is empty (a new event would strand them).
        if self.idle.is_set():
            self.idle = trio.Event()
        self._nursery.start_soon(fn, *args)

    def _done(self) -> None:
        if self._control is not None:
            self._requeue(self._control.injections.leftover())
        self.busy = False
        self._control = None
        self._touch()
        # At shutdown the nursery is gone: queued messages are not started (they stay
        # in the store and run after the restart), and the actor is idle.
        if self.pending and self._nursery is not None:
            self._start_run(self.pending.popleft())
        else:
            self.idle.set()

    def _requeue(self, steers: list[SteerItem]) -> None:
        """Steered messages the turn never took in run next, ahead of the queue."""
        kept = [item.origin for item in steers if not item.accepted.failed]
        self.pending.extendleft(reversed(kept))
        for position, msg in enumerate(kept, 1):
            self.publish(
                MessageQueued(text=msg.text, position=position, dropped_total=self.dropped_total)
            )

    def _start_run(self, msg: UserMessage) -> None:
        # The control exists before the task starts: a stop sent right after the
        # message (same tick) must land.
        control = RunControl()
        self._start(self._run, msg, control)
        self._control = control

    async def _run(self, msg: UserMessage, control: RunControl) -> None:
        # The one place a session's turns run (daemon and `navi run` alike): one at a
        # time, the rest queued. Across processes the lease keeps other owners out; it
        # is taken before the profile switch reads the session (holds nest with the
        # agent's own).
        run_log: RunLog | None = None
        dropped = False  # an acknowledged message whose run was refused: not to run again
        try:
            await self.queue.written(msg)  # its save moves its row: the row comes first
            if msg.accepted.failed:
                return  # refused (its sender was told): it never runs
            run_log = RunLog(self.session_id, msg)
            async with self.agent.leases.hold(self.session_id):
                await self._switch_profile(msg)
                async with self.agent.run_stream(self.session_id, msg, control=control) as ev:
                    try:
                        async for event in ev:
                            run_log.event(event)
                            self.publish(event)
                    finally:
                        with trio.move_on_after(END_DRAIN_SEC, shield=True):
                            async for event in ev:  # cancelled: the run's own ending
                                run_log.event(event)
                                self.publish(event)
        except NaviError as exc:  # busy (another process runs it), unknown profile, store
            msg.accepted.fail(exc)  # refused before its save (no-op for a queued one)
            # A queued message (acknowledged) that met a storage failure keeps its row:
            # it runs when the session's actor next starts. Any other refusal ends it.
            dropped = not isinstance(exc, StorageError)
            code = exc.code if isinstance(exc, RequestError) else "error"
            run_log = run_log or RunLog(self.session_id, msg)
            for event in (ErrorEvent(message=str(exc), code=code), StreamEnd(reason="error")):
                run_log.event(event)
                self.publish(event)
        finally:
            # Settled above in every other way; this is a shutdown before the save.
            msg.accepted.fail(stopped_before_saving())
            if dropped or msg.accepted.failed:
                # A refused message leaves no queue row behind: a restart cannot run it.
                await self.queue.ran(msg)
            if run_log is not None:
                run_log.end()
                if self._on_run_end is not None and run_log.last is not None:
                    self._on_run_end(self.session_id, msg, run_log.last)
            self._done()

    async def _switch_profile(self, msg: UserMessage) -> None:
        """`profile_id` names the profile of a new session, or switches an existing one."""
        wanted = msg.profile_id
        if wanted is None:
            return
        profiles = self.agent.config().profiles
        if wanted not in profiles:
            raise NaviError(f"unknown profile {wanted!r} (profiles: {', '.join(sorted(profiles))})")
        state = await self.agent.cache.get(self.session_id, profile_id=wanted)
        if state.profile_id != wanted:
            await self.agent.cache.set_profile(state, wanted)

    async def _compact(self) -> None:
        try:
            async with self.agent.compact_stream(self.session_id) as events:
                async for event in events:
                    self.publish(event)
        except NothingToCompactError as exc:
            self.publish(ErrorEvent(message=str(exc), code="nothing_to_compact"))
        finally:
            self._done()


class RunLog:
    """The log lines of one run (issue 8 "Logs"), at INFO with the session and user.

    One line when the run starts and when it ends (reason, duration), one per tool
    call (name, ok, duration; sub-agents' too) and one per error event.
    """

    def __init__(self, session_id: str, msg: UserMessage) -> None:
        info = msg.user_info or {}
        self.session_id = session_id
        self.user = str(info.get("name") or msg.user_id)
        self.reason = "cancelled"  # no StreamEnd: the runtime was shut down under it
        self.last: StreamEnd | None = None  # the run's own stream_end
        self.started = trio.current_time()
        log.info("session %s: run started (user %s)", session_id, self.user)

    def event(self, event: AgentEvent) -> None:
        where = f"session {self.session_id}" + (
            f" [{event.agent_id or 'sub-agent'}]" if event.is_subagent else ""
        )
        if isinstance(event, ToolResultEvent):
            log.info(
                "%s: tool %s %s in %d ms (user %s)", where, event.name,
                "ok" if event.ok else "failed", event.duration_ms, self.user,
            )  # fmt: skip
        elif isinstance(event, ErrorEvent):
            log.info("%s: error [%s] %s (user %s)", where, event.code, event.message, self.user)
        elif isinstance(event, StreamEnd) and not event.is_subagent:
            self.reason = event.reason
            self.last = event

    def end(self) -> None:
        took = trio.current_time() - self.started
        log.info(
            "session %s: run ended: %s in %.2f s (user %s)",
            self.session_id, self.reason, took, self.user,
        )  # fmt: skip


class SessionRegistry:
    """Starts a SessionActor per session on demand, in the registry's nursery."""

    def __init__(
        self,
        agent: Agent,
        *,
        encode: Encode,
        queue_max: int,
        idle_timeout: float = math.inf,
        on_run_end: RunEnded | None = None,
    ) -> None:
        self.agent = agent
        self.on_run_end = on_run_end  # every run's end (a scheduled run's notice)
        self.encode = encode
        self.queue_max = queue_max
        self.idle_timeout = idle_timeout
        self._actors: dict[str, SessionActor] = {}
        # The last seq of a retired actor: its successor goes on from there, so a
        # client never sees a seq it already had.
        self._last_seq: dict[str, int] = {}
        self._nursery: trio.Nursery | None = None
        self._starting: dict[str, trio.Event] = {}
        # Whether a starting actor takes over what a crash left queued: the daemon's
        # registry does; an embedded `navi run` leaves it to the daemon, since it
        # follows its own message's run only.
        self.adopt = False
        # Seqs restart with the daemon: the epoch tells a client its seq is another life's.
        self.epoch = new_epoch()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def get(self, session_id: str) -> SessionActor:
        actor = self._actors.get(session_id)
        if actor is not None:
            return actor
        if session_id in self._starting:
            await self._starting[session_id].wait()
            return self._actors[session_id]
        if self._nursery is None:
            raise RuntimeError("the session registry is not running")
        started = self._starting[session_id] = trio.Event()
        try:
            actor = SessionActor(
                session_id,
                self.agent,
                encode=self.encode,
                queue_max=self.queue_max,
                idle_timeout=self.idle_timeout,
                first_seq=self._last_seq.pop(session_id, 0),
                epoch=self.epoch,
                on_retire=self._retire,
                adopt=self.adopt,
                on_run_end=self.on_run_end,
            )
            await self._nursery.start(actor.run)
            self._actors[session_id] = actor
        finally:
            started.set()
            del self._starting[session_id]
        return actor

    def actor(self, session_id: str) -> SessionActor | None:
        return self._actors.get(session_id)

    async def resume_queued(self) -> int:
        """Start the actor of every session with messages queued in the store (a crash
        left them: they run now, whether or not anybody connects). The daemon sets
        `adopt` and calls it once it listens; each actor adopts only the rows of a dead
        process."""
        try:
            sids = await self.agent.store.queued_sessions()
        except NaviError as exc:
            log.warning("reading the sessions with queued messages failed: %s", exc)
            return 0
        for sid in sids:
            await self.get(sid)
        return len(sids)

    def _retire(self, actor: SessionActor) -> None:
        if self._actors.get(actor.session_id) is actor:
            del self._actors[actor.session_id]
            self._last_seq[actor.session_id] = actor.seq
            self.agent.cache.forget(actor.session_id)

    def attached(self, session_id: str) -> bool:
        """Whether a client is subscribed to the session (someone could answer it)."""
        actor = self._actors.get(session_id)
        return actor is not None and bool(actor._subscribers)

    def publish_task_update(self, session_id: str, event: AgentEvent) -> None:
        """TaskSupervisor's publish: out-of-band to the session's connected clients."""
        actor = self._actors.get(session_id)
        if actor is not None:
            actor.publish_out_of_band(event)
