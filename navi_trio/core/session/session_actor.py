"""Session actors: one per live session, started on demand by the registry.

A `SessionActor` runs its session's turns one at a time in its own nursery; a message
arriving meanwhile is queued (durably, `queued.py`), steered in or interrupts, as its
`on_busy` says, and queued messages run in submit order whether or not anybody is
connected. A message whose run finds rows queued before it in the store goes behind
them (`_queue_ahead`): the daemon holding the lease runs the queue in its order.

An acknowledged message is never dropped for a failure: one that met a storage failure
keeps its place and runs again first (`_wait_to_retry`); one whose session another
daemon took is handed to that daemon with every message behind it. A run whose lease
was taken over under it publishes nothing more and ends with one ``session_busy``.
Every message's `accepted` is settled exactly once.

Events go out through the session's broadcast (the `SessionBroadcast` protocol, the seam
scale-out implements); what the actor needs of the core is one frozen `SessionParts`.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from functools import partial
from typing import Any, Protocol, TypeVar

import attrs
import trio

from navi_trio.backoff import backoff_delay
from navi_trio.core.session.broadcast import Frame as Frame
from navi_trio.core.session.broadcast import SessionBroadcast
from navi_trio.core.session.broadcast import Subscription as Subscription
from navi_trio.core.session.queued import Dropped, DurableQueue, dropped_warning
from navi_trio.core.session.run_log import RunLog
from navi_trio.core.session.user_watch import role_now
from navi_trio.core.turn import (
    DELTAS,
    Agent,
    Observer,
    RunControl,
    SteerItem,
    UserMessage,
    busy_strategy,
    check_steer,
    not_the_starter,
    refusal,
    steer_item,
    stopped_before_saving,
)
from navi_trio.errors import (
    AuthError,
    NaviError,
    RequestError,
    SessionBusyError,
    StorageError,
)
from navi_trio.events import AgentEvent, ErrorEvent, MessageQueued, StreamEnd, WarningEvent
from navi_trio.profiles import NaviConfig, OnBusy
from navi_trio.store.fence import Fence
from navi_trio.store.methods import SessionStore

log = logging.getLogger(__name__)

# A run cancelled under it (the runtime shutting down) still ends itself, shielded: its
# last events (the partial answer's stream_end) are read and published for this long.
T = TypeVar("T")
END_DRAIN_SEC = 15.0
# An acknowledged (queued) message whose run could not save it (a full disk) keeps its
# place: it runs again after KEPT_RETRY_FIRST_SEC, doubling up to KEPT_RETRY_MAX_SEC,
# or at once when another message arrives; the messages after it wait behind it.
KEPT_RETRY_FIRST_SEC = 1.0
KEPT_RETRY_MAX_SEC = 60.0


class RunStream(Protocol):
    """`Agent.run_stream`: one turn's events; the run takes the session's lease."""

    def __call__(
        self, session_id: str, message: str | UserMessage, *, control: RunControl | None = None
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[AgentEvent]]: ...


# `Agent.end_dead_turn`: (session_id, the generation of the lease taken over, publish); the
# events that end its turn, if it ends one, are published under the lease.
EndDeadTurn = Callable[[str, int, Callable[[list[AgentEvent]], None]], Awaitable[None]]
# The cluster's take-over of a lease a dead owner left: its new generation, else None.
DeadTurn = Callable[[str], Awaitable["int | None"]]
# `Agent.compact_stream` with `nothing_as_event`: a forced compaction's events, nothing to
# compact among them (said inside the lease's hold).
CompactStream = Callable[[str], AbstractAsyncContextManager[trio.abc.ReceiveChannel[AgentEvent]]]
# Makes a session's broadcast: (session_id, on_change: a subscriber came or went).
BroadcastFactory = Callable[[str, Callable[[], None]], SessionBroadcast]
# Told when a run ends: (session_id, its message, its stream_end).
RunEnded = Callable[[str, UserMessage, StreamEnd], None]
# Leaves queued messages (their keys) to the daemon that runs the session now, or raises
# a NaviError.
HandOver = Callable[[str, list[str]], Awaitable[None]]


@attrs.frozen(kw_only=True)
class SessionParts:
    """What session actors (and their registry) need of the core, and nothing more."""

    store: SessionStore
    pid: int  # who writes the queue rows (a crash's leftovers are adopted by pid)
    host: str
    config: Callable[[], NaviConfig]
    run_stream: RunStream
    compact_stream: CompactStream
    end_dead_turn: EndDeadTurn
    forget: Callable[[str], None]  # drop a retired session's cached state
    observer: Observer  # sees every event published (the daemon's metrics)

    @classmethod
    def of(cls, agent: Agent) -> SessionParts:
        return cls(
            store=agent.store,
            pid=agent.leases.pid,
            host=agent.leases.host,
            config=agent.config,
            run_stream=agent.run_stream,
            compact_stream=partial(agent.compact_stream, nothing_as_event=True),
            end_dead_turn=agent.end_dead_turn,
            forget=agent.cache.forget,
            observer=agent.parts.observer,
        )


class SessionActor:
    def __init__(
        self,
        session_id: str,
        parts: SessionParts,
        broadcast: BroadcastFactory,
        *,
        queue_max: int,
        idle_timeout: float = math.inf,
        on_retire: Callable[[SessionActor], None] | None = None,
        adopt: bool = False,
        on_run_end: RunEnded | None = None,
        dead_turn: DeadTurn | None = None,
        hand_over: HandOver | None = None,
    ) -> None:
        self.session_id = session_id
        # With the cluster: a run first ends the turn a dead daemon left here, unless
        # that was looked at for this run (the cluster's look at the command that
        # started it); a look holds until something of the session ends here (`_done`).
        self._dead_turn = dead_turn
        self.dead_turn_checked = dead_turn is None
        self._on_run_end = on_run_end
        self._hand_over = hand_over
        self._adopt = adopt
        self.parts = parts
        self.queue_max = queue_max
        self.idle_timeout = idle_timeout
        self._on_retire = on_retire
        self._changed = trio.Event()
        self.retired = trio.Event()
        self.broadcast = broadcast(session_id, self._touch)
        self.pending: collections.deque[UserMessage] = collections.deque()
        self.queue = DurableQueue(
            session_id, parts.store, pid=parts.pid, host=parts.host, cap=max(queue_max, 1)
        )
        self.dropped_total = 0
        self._adopting = trio.Lock()  # one read of the store's queue at a time
        self._nursery: trio.Nursery | None = None
        self._control: RunControl | None = None
        self._running_key: str | None = None  # the queue key of the message running
        # Who started the turn running (or waiting to retry): only they steer it or
        # interrupt it, as only they answer its approvals.
        self._running_user: str | None = None
        self._kept_wait: trio.CancelScope | None = None  # a kept message's wait to retry
        # Queue keys of messages put ahead of the queue on purpose (an interrupting one,
        # steered ones the turn never took in): they run before what waits here.
        self._jumped: set[str | None] = set()
        self.busy = False
        # A run here found the session run by another daemon and hands its message there.
        self.handing_over = False
        self.idle = trio.Event()
        self.idle.set()
        self._stop_asked: float | None = None  # when a stop of the running turn was asked
        # The running run published its end already (it still saves and settles): a
        # message queued now has no run left to end before it.
        self._end_said = False

    @property
    def seq(self) -> int:
        return self.broadcast.seq

    @property
    def epoch(self) -> str:
        return self.broadcast.epoch

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
            self.broadcast.close()

    def _retirable(self) -> bool:
        return not self.busy and not self.pending and not self.broadcast.subscribed

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

    def send_message(self, message: str | UserMessage) -> OnBusy | None:
        """Run the message, or (the session busy) apply its `on_busy` strategy and return it;
        `reject` raises SessionBusyError."""
        msg = UserMessage(message) if isinstance(message, str) else message
        if not self.busy:
            self._start_run(msg)
            return None
        if self._nursery is None:
            raise RuntimeError(f"session actor {self.session_id} is not running")
        control = self._control
        strategy = busy_strategy(msg.on_busy, control)
        if strategy in ("steer", "interrupt") and msg.user_id != self._running_user:
            if msg.on_busy is not None:  # asked for: refused, saying why
                raise not_the_starter(self.session_id, strategy)
            strategy = "enqueue"  # the profile's default: it waits its turn instead
        if strategy == "reject":
            raise refusal(self.session_id, control)
        msg.taken["on_busy"] = strategy  # what its ok (and its key's) says
        # Stored before it is acknowledged: `msg.accepted` is ok once its row is in.
        if strategy == "steer" and control is not None:
            check_steer(msg.text, control)
            msg = self.queue.keep(self._nursery, msg, self._stored)
            control.injections.steer(steer_item(msg, self.queue.written))
            self._nudge_kept()
            return strategy
        msg = self.queue.keep(self._nursery, msg, self._stored)
        if strategy == "interrupt" and control is not None:
            self.pending.appendleft(msg)  # next, ahead of the queue
            self._jumped.add(msg.queue_key)
            control.stop()
        else:
            self.pending.append(msg)
            self._nudge_kept()
        # At once, in its place among the run's frames: a client following its own
        # message counts the runs that end before it from here (api/our_run.py).
        self._say_queued(msg, 1 if strategy == "interrupt" else None)
        return strategy

    def _stored(self, _msg: UserMessage, dropped: Dropped) -> None:
        """A queued message's row is in: what the cap dropped for it is said now."""
        self.dropped(dropped)

    def _say_queued(
        self, msg: UserMessage, position: int | None = None, *, running: bool = True
    ) -> None:
        """`message_queued`: `position` is how many runs end before it (by default, those
        queued ahead of it here, and the running one when `running`). A compaction, a
        rewind or a fork holding the session is no run: it says no ``stream_end``."""
        if position is None:
            keys = [m.queue_key for m in self.pending]
            ahead = keys.index(msg.queue_key) if msg.queue_key in keys else 0
            a_run = running and self._control is not None and not self._end_said
            position = ahead + (1 if a_run else 0)
        self.publish(
            MessageQueued(text=msg.text, position=position, dropped_total=self.dropped_total)
        )

    def dropped(self, rows: Dropped) -> None:
        """The queue's cap dropped these rows (here, or on another daemon that handed a
        message over): they leave this actor's queue, and each is named in a warning."""
        if not rows:
            return
        gone = {key for key, _ in rows}
        self.pending = collections.deque(m for m in self.pending if m.queue_key not in gone)
        self._jumped -= gone
        if self._control is not None:
            self._control.injections.discard(gone)
        for _, row in rows:
            self.dropped_total += 1
            warning = dropped_warning(row, max(self.queue_max, 1), self.dropped_total)
            # In the log too: a client that was not connected, or a daemon killed before
            # the warning went out, leaves the log as the one word of it.
            log.warning("session %s: %s", self.session_id, warning.message)
            self.publish(warning)

    @property
    def running(self) -> RunControl | None:
        """The control of the turn running now (None: idle, or compacting)."""
        return self._control

    def revoke(self, user_ids: set[str]) -> None:
        """These users were removed: a turn one of them started stops now; their queued
        and steered messages are refused when their turn would come (`_run`)."""
        if self._control is not None and self._running_user in user_ids:
            self._control.stop()

    def stop(self) -> bool:
        """Stop the running turn (queued messages stay queued). False when idle, and while
        this daemon's run hands its message to the daemon that runs the session: the turn
        to stop is that daemon's (`handing_over`; the API asks it there)."""
        if self._control is None or self.handing_over:
            return False
        if self._stop_asked is None:
            self._stop_asked = trio.current_time()
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

    async def exclusive(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run `work` (a rewind, a fork) while nothing else of the session runs: refused while a
        run or compaction is active or messages wait; messages sent meanwhile run after it."""
        if self.busy or self._nursery is None:
            raise SessionBusyError(
                f"session {self.session_id!r} has a run active or queued: stop it or wait",
                session_id=self.session_id,
            )
        self.busy = True
        self._touch()
        if self.idle.is_set():
            self.idle = trio.Event()
        try:
            return await work()
        finally:
            self._done()

    def resync(self) -> None:
        """The history changed under the replay (a rewind): every subscriber reloads."""
        self.broadcast.resync()

    def subscribe(self, last_seq: int | None = None, epoch: str | None = None) -> Subscription:
        """Frames after `last_seq` from the replay, then live ones (or ``resync``)."""
        return self.broadcast.subscribe(last_seq, epoch)

    def publish(self, event: AgentEvent) -> Frame:
        observer = self.parts.observer
        if observer.deltas or type(event) not in DELTAS:
            observer.event(self.session_id, event)
        if type(event) is StreamEnd and not event.is_subagent:
            self._end_said = self.busy
            if self._stop_asked is not None:
                observer.stopped(trio.current_time() - self._stop_asked)
                self._stop_asked = None
        return self.broadcast.publish(event)

    def relay(self, frame: Frame) -> None:
        """A frame of this session another daemon published: passed on to this daemon's
        subscribers unless a run here has the session's lease (`_run_has_lease`). Busy is
        not enough: a run that has not claimed the lease yet, or found it held elsewhere and
        hands its message over, and a rewind, fork or dead daemon's turn looked at here,
        all leave the session's frames to whoever runs it. An out-of-band frame (no seq: a
        background job's ``task_update``) is no run's: it is always passed on."""
        relay = getattr(self.broadcast, "relay", None)
        if relay is None:
            return
        if not self._run_has_lease():
            relay(frame)
            self.dead_turn_checked = self._dead_turn is None  # another daemon runs it
        elif frame.get("seq") is None:
            relay(frame)

    def _run_has_lease(self) -> bool:
        """A run here claimed the session's lease and has not let go of it cleanly. While it
        holds the lease, another daemon's frame can only be a late one of an owner it
        replaced; once taken over (or while it cannot tell), its clients hear the end of
        its turn from it alone (``session_busy``), not a second time from the new owner
        (who ends the turn too): the new owner's next frames come after, as a resync."""
        control = self._control
        if control is None or control.lease is None:
            return False
        return control.fenced or not control.lease.released

    async def take_over(self) -> None:
        """End the turn a dead daemon left running here, unless something of the session runs
        here now: its ending goes out before anything else of the session."""
        if self.busy or self._nursery is None or self._dead_turn is None:
            return
        await self.exclusive(self._end_dead_turn)

    async def _end_dead_turn(self) -> None:
        """Take over a lease a dead daemon left (the cluster: once, whichever daemon is
        first) and end its turn; not again until another daemon runs the session."""
        assert self._dead_turn is not None
        try:
            generation = await self._dead_turn(self.session_id)
            if generation is not None:
                await self.parts.end_dead_turn(self.session_id, generation, self._say_dead_end)
        except NaviError as exc:
            log.warning("session %s: ending a dead daemon's turn failed: %s", self.session_id, exc)
            return
        self.dead_turn_checked = True

    def _say_dead_end(self, events: list[AgentEvent]) -> None:
        """The end of a dead daemon's turn, published while its lease is held here (a daemon
        that claims it next hears it before its run). Before a run here it is not that
        run's end; on its own it is the end a message queued now no longer waits for. Only
        an end nobody had is said (`Agent.end_dead_turn`): each client hears it once."""
        said = self._end_said
        for event in events:
            self.publish(event)
        if self._control is not None:
            self._end_said = said

    async def adopt_handed(self) -> int:
        """Take the session's queued rows nobody else runs (handed over by another
        daemon, left by a dead one) and run them in order; how many (core/cluster/cluster.py)."""
        adopted = await self._adopt_rows()
        for msg in adopted:
            if not self.busy and not self.pending and self._nursery is not None:
                self._say_queued(msg, 0)  # it runs now: its sender follows from here
                self._start_run(msg)
            else:
                self.pending.append(msg)
                self._say_queued(msg)
        return len(adopted)

    async def _adopt_rows(self) -> list[UserMessage]:
        """The store's queued rows this actor may run and does not hold yet, in order. One read
        at a time, told apart from what it holds only once the read is back, so a message
        queued here during the read does not run twice."""
        async with self._adopting:
            rows = await self.queue.adopt()
            known = self._held_keys()
            return [m for m in rows if m.queue_key not in known]

    def _held_keys(self) -> set[str | None]:
        """The queue keys of the messages this actor holds: waiting, running, steered."""
        keys: set[str | None] = {m.queue_key for m in self.pending} | {self._running_key}
        if self._control is not None:
            keys |= self._control.injections.keys()
        return keys

    def frame_fence(self) -> Fence | None:
        """The lease fence the frames published now must pass on their way to other
        daemons (core/cluster/cluster.py): the running run's, until its hold ended cleanly."""
        lease = self._control.lease if self._control is not None else None
        return None if lease is None or lease.released else lease.fence

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
        # A look for a dead daemon's turn holds for the run it was made for, not beyond:
        # from here on another daemon may take the session and stop answering past its
        # lease before the next run here, whose claim would take that lease over as a
        # live one's (its turn never ended). The next run looks again.
        self.dead_turn_checked = self._dead_turn is None
        self.busy = False
        self._control = None
        self._running_key = None
        self._running_user = None
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
        self._jumped.update(m.queue_key for m in kept)
        for position, msg in enumerate(kept, 1):
            self._say_queued(msg, position)

    def _start_run(self, msg: UserMessage) -> None:
        # The control exists before the task starts: a stop sent right after the
        # message (same tick) must land.
        control = self._control_for(msg)
        self._start(self._run, msg, control)
        self._control = control
        self._running_key = msg.queue_key
        self._running_user = msg.user_id
        self._end_said = False

    def _control_for(self, msg: UserMessage, *, retry: bool = False) -> RunControl:
        """The control of a run of `msg`, or of a kept message's next `retry`: once it holds
        the lease, it goes behind rows queued before it; a new one refused goes to the
        owner (not a kept one: it keeps its place here)."""
        control = RunControl()
        if self._adopt and msg.kind != "resume":  # (a resumed one is in the history)
            control.ahead = partial(self._queue_ahead, msg)
        if self._hand_over is not None and msg.queue_key is None and not retry:
            control.elsewhere = partial(self._send_elsewhere, msg)
        return control

    async def _run(self, msg: UserMessage, control: RunControl) -> None:
        # The one place a session's turns run, one at a time; the run takes the lease.
        run_log: RunLog | None = None
        dropped = False  # an acknowledged message whose run was refused: not to run again
        try:
            await self.queue.written(msg)  # its save moves its row: the row comes first
            if msg.accepted.failed:
                return  # refused (its sender was told): it never runs
            if not self.dead_turn_checked:
                await self._end_dead_turn()
            run_log = RunLog(self.session_id, msg)
            # The store's word, not a list of this process's: a user removed while this
            # daemon was down, or on another daemon, is gone here too.
            if await role_now(self.parts.store, msg.user_id) is None:
                raise AuthError("the user who sent this message was removed: it does not run")
            self._check_profile(msg)
            retry = 1
            while True:
                async with self.parts.run_stream(self.session_id, msg, control=control) as ev:
                    try:
                        async for event in ev:
                            run_log.event(event)
                            if self._surely_publishes(msg, control) or await self._may_publish(
                                msg, control
                            ):
                                self.publish(event)
                    finally:
                        with trio.move_on_after(END_DRAIN_SEC, shield=True):
                            async for event in ev:  # cancelled: the run's own ending
                                run_log.event(event)
                                if await self._may_publish(msg, control):
                                    self.publish(event)
                if control.fenced:
                    self._say_taken_over()
                # An acknowledged message that met a storage failure, or whose session
                # another process took before its save, keeps its place and runs again
                # (in a cluster, a taken one goes to the new owner); any other refusal ends it.
                error = _kept_for(msg, control)
                if error is None:
                    dropped = control.refused is not None
                    break
                if isinstance(error, SessionBusyError):
                    if await self._hand_back(msg):
                        break  # its row, and those queued behind it, wait for the owner
                    # Nobody runs it now: the daemon that took it may have died mid-turn.
                    self.dead_turn_checked = self._dead_turn is None
                saved = control.saved or msg.kind == "resume"
                delay = backoff_delay(retry, base=KEPT_RETRY_FIRST_SEC, cap=KEPT_RETRY_MAX_SEC)
                if not await self._wait_to_retry(error, delay, saved=saved):
                    dropped = True  # stopped: the user let it go
                    self.publish(
                        WarningEvent(
                            message="the message that waited to be saved was dropped (stopped)",
                            code="message_dropped",
                        )
                    )
                    break
                retry += 1
                # Its next try starts from what the store holds: a save that failed may
                # have landed, a turn cut short may have ended since (`_accept`).
                msg = attrs.evolve(msg, kind="resume" if saved else msg.kind, retried=True)
                self.parts.forget(self.session_id)
                # Its next try, too, goes behind rows queued before it that it finds then
                # (handed over meanwhile, or unread when this try failed).
                control = self._control_for(msg, retry=True)
                self._control = control
                if not self.dead_turn_checked:
                    await self._end_dead_turn()  # its turn ended before this one starts
        except NaviError as exc:  # an unknown profile, the queue's store
            msg.accepted.fail(exc)  # refused before its save (no-op for a queued one)
            dropped = not isinstance(exc, StorageError)
            code = exc.code if isinstance(exc, RequestError) else "error"
            run_log = run_log or RunLog(self.session_id, msg)
            for event in (ErrorEvent(message=str(exc), code=code), StreamEnd(reason="error")):
                run_log.event(event)
                self.publish(event)
        finally:
            self._jumped.discard(msg.queue_key)
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

    async def _queue_ahead(self, msg: UserMessage) -> bool:
        """The run of `msg` holds the lease: rows queued in the store before it run first, in the
        store's order, and it goes behind them (a new one stored and acknowledged as any queued
        one). True when it went behind others: no turn now. The queue unread, a new message
        is queued (its row lands behind any there) and an acknowledged one keeps its place:
        neither runs ahead of rows it cannot see."""
        async with self._adopting:
            try:
                rows = await self.queue.adopt(strict=True)  # every row: this run holds the lease
            except StorageError:
                if msg.queue_key is not None:
                    raise  # kept: it runs again, reading the queue first
                rows = None
            known = self._held_keys()
        assert self._nursery is not None
        if rows is None:
            msg.accepted.queued = True
            queued = self.queue.keep(self._nursery, msg, self._stored)
            self.pending.appendleft(queued)  # next, here; its run reads the queue again
            self._say_queued(queued, 0, running=False)
            await self.queue.written(queued)  # settled before this run ends
            return True
        order = [m.queue_key for m in rows]
        if msg.queue_key is None:
            cut = len(order)  # a new message: behind every row queued before it
        elif msg.queue_key in order:
            cut = order.index(msg.queue_key)
        else:
            # Off the queue already (an earlier try's save landed, another daemon took
            # it, the cap dropped it): its run finds out which, ahead of the rest.
            cut = -1
        # Rows queued before it run first, those waiting here too (taken in after a
        # message of this daemon was queued behind the same run: a hand-over's note
        # read late); not what the run holds already (running, steered), and none of
        # those waiting here when it was put ahead of them on purpose.
        waiting = {m.queue_key: m for m in self.pending}
        held = known if msg.queue_key in self._jumped else known - waiting.keys()
        before = [
            waiting.get(m.queue_key, m)
            for i, m in enumerate(rows)
            if i < cut and m.queue_key not in held
        ]
        after = [m for i, m in enumerate(rows) if i > cut and m.queue_key not in known]
        if not before:
            self.pending.extend(after)
            for later in after:
                self._say_queued(later)
            return False
        queued = msg
        if msg.queue_key is None:
            msg.accepted.queued = True
            queued = self.queue.keep(self._nursery, msg, self._stored)
        moved = {m.queue_key for m in before}
        rest = [m for m in self.pending if m.queue_key not in moved]
        self.pending = collections.deque([*before, queued, *rest, *after])
        # This run ends saying nothing: it is not one of the runs that end before them.
        for other in (*before, queued, *after):
            if other.queue_key not in waiting:  # (those waiting here were said already)
                self._say_queued(other, running=False)
        await self.queue.written(queued)  # settled before this run ends
        return True

    async def _send_elsewhere(self, msg: UserMessage) -> bool:
        """A new message found the session run by another daemon: queued as if handed over and
        left to that daemon, or, when none runs it now, next here. False only without daemons
        to hand it to (it is refused then)."""
        if self._hand_over is None or self._nursery is None:
            return False
        with self._handing():
            msg.accepted.queued = True
            queued = self.queue.keep(self._nursery, msg, self._stored)
            await self.queue.written(queued)
            if queued.accepted.failed or queued.queue_key is None:
                return True  # refused: its sender has the write's error
            try:
                await self._hand_over(self.session_id, [queued.queue_key])
            except NaviError:  # nobody else runs it now, or the store did not answer
                # The daemon that took it may have died mid-turn: its turn ends first.
                self.dead_turn_checked = self._dead_turn is None
                self.pending.appendleft(queued)
                self._say_queued(queued, 0)  # runs next, here (this run says nothing)
            return True

    @contextmanager
    def _handing(self) -> Iterator[None]:
        """While a run here hands messages to the daemon that runs the session
        (`handing_over`: a stop is for that daemon's turn)."""
        self.handing_over = True
        try:
            yield
        finally:
            self.handing_over = False

    def _surely_publishes(self, msg: UserMessage, control: RunControl) -> bool | None:
        """Whether this event of the run goes out: not once another daemon took the session over
        under it, nor a refusal of a message handed to the daemon that runs the session now.
        None when the lease must be asked (`_may_publish`); nearly every event gets its
        answer here, with no coroutine for each token."""
        if control.fenced or (self._hand_over is not None and _taken(msg, control)):
            return False
        lease = control.lease
        return True if lease is None or lease.surely_held() else None

    async def _may_publish(self, msg: UserMessage, control: RunControl) -> bool:
        """`_surely_publishes`, asking the lease when that cannot say: a lease lost fences
        the run."""
        surely = self._surely_publishes(msg, control)
        if surely is not None:
            return surely
        assert control.lease is not None  # (no lease: surely)
        if await control.lease.held():
            return True
        control.fenced = True
        control.stop()
        return False

    def _say_taken_over(self) -> None:
        """The one thing a run taken over under it says, to this daemon's subscribers
        (its frames to other daemons are fenced in the store: core/cluster/cluster.py)."""
        self.publish(
            ErrorEvent(
                message=(
                    f"session {self.session_id!r} was taken over by another daemon while this "
                    "one was not answering (paused past its lease): this run stopped, and "
                    "nothing it did after that is kept or shown; the session goes on there"
                ),
                code="session_busy",
            )
        )
        self.publish(StreamEnd(reason="error"))

    async def _hand_back(self, msg: UserMessage) -> bool:
        """The session is another daemon's now: leave `msg` and every message behind it in the
        store's queue for it. False when there is none, or the store did not take them."""
        if self._hand_over is None:
            return False
        handed = [msg, *self.pending]
        with self._handing():
            for queued in handed:
                await self.queue.written(queued)  # each row is in before it is handed on
            keys = [
                m.queue_key for m in handed if m.queue_key is not None and not m.accepted.failed
            ]
            try:
                await self._hand_over(self.session_id, keys)
            except NaviError as exc:
                log.warning(
                    "session %s: leaving its queue to its new owner failed: %s",
                    self.session_id,
                    exc,
                )
                return False
        gone = {id(m) for m in handed}
        self.pending = collections.deque(m for m in self.pending if id(m) not in gone)
        log.info(
            "session %s: %d queued message(s) left to the daemon that runs it now",
            self.session_id,
            len(keys),
        )
        return True

    def _nudge_kept(self) -> None:
        """A message arrived: a kept message waiting to retry tries again now, first."""
        if self._kept_wait is not None:
            self._kept_wait.cancel()

    async def _wait_to_retry(self, error: Exception, delay: float, *, saved: bool) -> bool:
        """Until the kept message's next try: `delay`, or less when another message
        arrives. False when a stop (or a message that interrupts) came meanwhile."""
        waiting = RunControl()  # what `stop` cancels meanwhile
        self._control = waiting
        if saved:
            why = f"its turn was cut short ({error})"
        elif isinstance(error, SessionBusyError):
            why = f"another process runs the session now ({error})"
        else:
            why = f"could not be saved ({error})"
        self.publish(
            WarningEvent(
                message=(
                    f"the message is kept but {why}; it runs again in {delay:g} s or when "
                    "another message comes, before the messages after it (stop drops it)"
                ),
                code="message_kept",
            )
        )
        try:
            with waiting.scope, trio.CancelScope() as self._kept_wait:
                await trio.sleep(delay)
        finally:
            self._kept_wait = None
        self._requeue(waiting.injections.leftover())  # steered meanwhile: next in line
        return not waiting.stopped

    def _check_profile(self, msg: UserMessage) -> None:
        """`profile_id` names the profile of a new session, or switches an existing one
        (the run switches it, under the lease): it must be one the config has."""
        wanted = msg.profile_id
        profiles = self.parts.config().profiles
        if wanted is not None and wanted not in profiles:
            raise NaviError(f"unknown profile {wanted!r} (profiles: {', '.join(sorted(profiles))})")

    async def _compact(self) -> None:
        try:
            async with self.parts.compact_stream(self.session_id) as events:
                async for event in events:
                    self.publish(event)
        except NaviError as exc:  # its lease held elsewhere, the store: said, not raised
            code = exc.code if isinstance(exc, RequestError) else "error"
            self.publish(ErrorEvent(message=str(exc), code=code))
        finally:
            self._done()


def _taken(msg: UserMessage, control: RunControl) -> bool:
    """An acknowledged queued message whose run found the session run by another
    process (its lease), before its save."""
    return (
        isinstance(control.refused, SessionBusyError)
        and msg.queue_key is not None
        and msg.accepted.settled
        and not msg.accepted.failed
    )


def _kept_for(msg: UserMessage, control: RunControl) -> Exception | None:
    """Why an acknowledged message keeps its place and runs again, if it does: a storage
    failure (not a lease lost under the run), or the session taken before its save."""
    if msg.accepted.failed or control.skipped:
        return None
    refused = control.refused
    if isinstance(refused, StorageError):
        return refused
    if _taken(msg, control):
        return refused
    failed = control.failed
    if isinstance(failed, StorageError) and not control.fenced:
        return failed
    return None
