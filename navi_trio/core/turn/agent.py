"""The agent: `run_stream`, `run`, `compact_stream` and `run_ephemeral`.

`run_stream` runs the turn in its context manager's own nursery and sends its events
to a bounded channel that never blocks; leaving the ``async with`` early stops the
run. Stop is a cancel scope (`RunControl.stop()`), effective at the next checkpoint in
any phase; the runner's shielded clean-up saves the partial answer and pairs every
tool call. The user message is saved before anything else, so it is never lost.
The parts a turn runs with are built once (`LoopParts`); nothing reaches back here.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from navi_trio.core.jobs import TaskSupervisor, collect_notes, remove_notes
from navi_trio.core.turn import runvars
from navi_trio.core.turn.acceptance import Acceptance, stopped_before_saving
from navi_trio.core.turn.approvals import ApprovalBroker
from navi_trio.core.turn.budgets import Budget, effective
from navi_trio.core.turn.channel import EventReceiver, EventSender, emitter, open_event_channel
from navi_trio.core.turn.checkpointing import RoundCheckpoints
from navi_trio.core.turn.context import ContextBuilder
from navi_trio.core.turn.injections import Injections
from navi_trio.core.turn.lease import RELEASE_DEADLINE_SEC, HeldLease, SessionLeases
from navi_trio.core.turn.live_config import LiveConfig
from navi_trio.core.turn.observe import NoObserver, Observer, continue_trace
from navi_trio.core.turn.policy import effective_mode
from navi_trio.core.turn.session_state import (
    SessionCache,
    SessionState,
    last_turn_end,
    last_turn_open,
    new_message_id,
    open_turn,
)
from navi_trio.core.turn.steering import DEFAULT_ON_BUSY
from navi_trio.core.turn.subagent import run_ephemeral
from navi_trio.core.turn.tokens import TokenCounter
from navi_trio.core.turn.tool_context import make_tool_context
from navi_trio.core.turn.tool_executor import ToolExecutor
from navi_trio.core.turn.turn import TurnRunner, shielded
from navi_trio.core.turn.turn_state import LoopParts, Turn
from navi_trio.core.turn.workspace import hold_roots
from navi_trio.errors import (
    DuplicateMessageError,
    LeaseLostError,
    LLMError,
    NothingToCompactError,
    NotQueuedError,
    RequestError,
    SessionBusyError,
    StorageError,
    client_error,
)
from navi_trio.events import AgentEvent, ErrorEvent, StreamEnd, WarningEvent, Woken
from navi_trio.llm.base import LLMBackend
from navi_trio.profiles import BudgetConfig, ConfigSource, NaviConfig, OnBusy
from navi_trio.settings import Settings
from navi_trio.store.base import KeyClaim
from navi_trio.store.methods import SessionStore
from navi_trio.tools.base import ToolContext, ToolRegistry
from navi_trio.tools.procs import ProcessPool
from navi_trio.tools.roots import RunRoots
from navi_trio.tools.services import SpawnRequest

log = logging.getLogger(__name__)

NOTHING_TO_COMPACT = "nothing to compact: the context is already short or already a summary"
DEAD_TURN = "the daemon running this turn died (or stopped answering past its lease)"


@attrs.frozen
class UserMessage:
    text: str
    cwd: Path | None = None
    user_id: str = "local"
    user_role: str = "user"
    user_info: dict[str, Any] | None = None
    # A new session's profile; for an existing one, the run switches it.
    profile_id: str | None = None
    mode: str | None = None  # asked for; clamped to the role's
    on_busy: str | None = None  # when the session is busy; None: the profile's default
    # "user"; "wake": a background job's note starts the turn (its text empty);
    # "schedule": a scheduled run; "resume": a message saved already whose run the
    # store cut short: nothing new is saved, the model is asked again.
    kind: str = "user"
    headless: bool = False  # approvals by the headless rule even with a client attached
    budget: BudgetConfig | None = None  # the sender's budgets: they only lower the config's
    schedule_id: str | None = None  # the schedule of a scheduled run
    # The store's key while it waits in the queue: its save dequeues it, atomically.
    queue_key: str | None = None
    # Ok once saved or queued, else the error that kept it out: an ok is never lost.
    accepted: Acceptance = attrs.field(factory=Acceptance, eq=False, repr=False)
    # Its history row's id, the same on every try: a `retried` one looks for it first,
    # since a save the store said failed may have landed.
    message_id: str = attrs.field(factory=new_message_id, eq=False)
    retried: bool = attrs.field(default=False, eq=False)
    # The W3C trace context it came with (checked); kept in its queued row while it waits.
    trace: Mapping[str, str] | None = attrs.field(default=None, eq=False, repr=False)
    # Its client's key (the ``message`` frame's ``key``): taken in the write that stores it
    # (its save, or its queued row), so that another message with the key never runs.
    # `taken`: the fields of the ok its sender gets (seq, epoch, mode; the `on_busy`
    # applied), kept with the key for a second sender of it.
    key: str | None = attrs.field(default=None, eq=False)
    taken: dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)

    def key_claim(self) -> KeyClaim | None:
        """Its key as the store takes it, with the ok's fields (queued as `_accepted`
        says it: waiting for a run of its own); None without a key."""
        if self.key is None:
            return None
        on_busy = self.taken.get("on_busy")
        queued = self.accepted.queued or on_busy in ("enqueue", "interrupt")
        return KeyClaim(self.key, self.message_id, {**self.taken, "queued": queued})


class RunControl:
    """Stop handle and state of one run: `stop()` cancels the run's cancel scope.

    `refused`: the error that kept the message out, when the run ended before its save;
    `skipped`: no turn ran (a wake-up with no note left, a queued message gone from the
    queue); `injections`: its mailbox for steered messages and background notes."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.saved = False  # the user message is in the history
        self.refused: Exception | None = None
        self.failed: Exception | None = None  # what ended the run after its save
        self.lease: HeldLease | None = None  # once claimed
        self.fenced = False  # the session was taken over under it: it says nothing more
        # Asked once the lease is held: True when it went behind messages queued before
        # it (no turn now).
        self.ahead: Callable[[], Awaitable[bool]] | None = None
        # Asked when the claim was refused: True when the message went to the queue of
        # the daemon that runs the session (no turn here).
        self.elsewhere: Callable[[], Awaitable[bool]] | None = None
        self.run_id = "r-" + secrets.token_hex(6)
        self.injections = Injections()
        self.on_busy_default: OnBusy = DEFAULT_ON_BUSY
        self.steer_max_chars = 8000  # the setting's, once the run has started
        self.finished = trio.Event()  # the run's task is over (its events all sent)
        self.skipped = False  # no turn ran: nothing to do (see the class)
        self.woken: str | None = None  # a wake-up's note: the turn's start

    def stop(self) -> None:
        self.scope.cancel()

    @property
    def stopped(self) -> bool:
        return self.scope.cancel_called


class Agent:
    def __init__(
        self,
        *,
        settings: Settings,
        config: ConfigSource,
        store: SessionStore,
        backend: LLMBackend,
        registry: ToolRegistry,
        supervisor: TaskSupervisor | None = None,
        processes: ProcessPool | None = None,
        counter: TokenCounter | None = None,
        approvals: ApprovalBroker | None = None,
        checkpoints: RoundCheckpoints | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.supervisor = supervisor
        self.processes = processes
        self.approvals = approvals
        counter = counter or TokenCounter()
        builder = ContextBuilder(settings, counter)
        self.live_config = LiveConfig(config, builder)
        self.cache = SessionCache(store, config.current.default_profile)
        # One process runs a session at a time; a takeover elsewhere drops our copy.
        self.leases = SessionLeases(
            store, ttl=settings.lease_ttl_sec, on_takeover=self.cache.forget
        )

        def tool_context(turn: Turn) -> ToolContext:
            return make_tool_context(parts, turn, processes=processes, tasks=supervisor)

        # Everything a turn's runner uses, built once; the runner never sees the Agent.
        parts = LoopParts(
            settings=settings,
            store=store,
            cache=self.cache,
            backend=backend,
            registry=registry,
            executor=ToolExecutor(
                registry,
                settings,
                supervisor,
                approvals,
                checkpoints,
                confirm=self.leases.confirm_current,
            ),
            builder=builder,
            counter=counter,
            config=self.live_config,
            tool_context=tool_context,
            observer=observer or NoObserver(),
            leases=self.leases,
        )
        self.parts = parts

    def config(self) -> NaviConfig:
        """The config in force; a changed file is reloaded (a broken one is ignored)."""
        return self.live_config.current()

    @asynccontextmanager
    async def run_stream(
        self,
        session_id: str,
        message: str | UserMessage,
        *,
        control: RunControl | None = None,
    ) -> AsyncIterator[EventReceiver]:
        msg = UserMessage(message) if isinstance(message, str) else message
        ctl = control or RunControl()
        if msg.trace is not None:  # before the run's first event opens its turn's span
            continue_trace(self.parts.observer, session_id, msg.trace)
        # Bounded: a slow reader costs merged or dropped progress, never memory.
        send, recv = open_event_channel(self.settings.event_buffer_max)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run_task, session_id, msg, send, ctl)
            with recv:
                yield recv
            # The reader left before the end: that is a stop.
            ctl.stop()

    async def run(
        self, session_id: str, message: str | UserMessage, *, control: RunControl | None = None
    ) -> str:
        """The same loop with events consumed; returns the final text."""
        final = ""
        async with self.run_stream(session_id, message, control=control) as events:
            async for event in events:
                if isinstance(event, StreamEnd) and not event.is_subagent:
                    final = event.text
        return final

    async def _run_task(
        self,
        session_id: str,
        msg: UserMessage,
        send: EventSender,
        control: RunControl,
    ) -> None:
        async with send:
            emit = emitter(send)
            said = False  # the failure was said inside the hold: nothing more to say
            try:
                async with self.leases.hold(session_id) as lease:
                    control.lease = lease
                    try:
                        if control.ahead is not None and await control.ahead():
                            control.skipped = True  # queued behind what came first
                        else:
                            await self._run_turn(session_id, msg, emit, control)
                    except LeaseLostError:
                        raise  # taken over under it: it says nothing more (below)
                    except Exception as exc:
                        if isinstance(exc, StorageError):
                            # Its message runs again here: the session stays ours meanwhile,
                            # so messages sent elsewhere are handed here, behind it.
                            lease.keep = True
                        # Said while the lease is held, as a turn's own end is: a daemon
                        # that claims the session at its release has them before its run.
                        said = True
                        self._say_failed(session_id, msg, control, emit, exc)
                    # The reader (the session actor) publishes what the run said: done
                    # before the lease is let go, so the release's flush sends it.
                    with trio.move_on_after(RELEASE_DEADLINE_SEC):
                        await send.settled()
            except Exception as exc:
                if said:
                    log.warning("session %s: its lease was lost as its run failed", session_id)
                    return
                if await _sent_elsewhere(exc, control):
                    control.skipped = True
                    return
                if isinstance(exc, LeaseLostError):
                    control.fenced = True  # taken over under it: it says nothing more
                self._say_failed(session_id, msg, control, emit, exc)
            finally:
                # Cancelled before the save (the runtime is shutting down): not stored.
                msg.accepted.fail(stopped_before_saving())
                control.finished.set()

    @staticmethod
    def _say_failed(
        session_id: str, msg: UserMessage, control: RunControl, emit: Any, exc: Exception
    ) -> None:
        """The run failed: before the save (lease, load, the save itself) this refuses the
        message; after it, the ok stands and only the events say what went wrong."""
        msg.accepted.fail(exc)
        if not control.saved:
            control.refused = exc
        else:
            control.failed = exc
        if not isinstance(exc, RequestError):  # session_busy, storage: expected
            log.exception("run of session %s failed", session_id, exc_info=exc)
        told = client_error(exc)
        emit(ErrorEvent(message=str(told), code=told.code))
        emit(StreamEnd(reason="error"))

    async def _run_turn(
        self, session_id: str, msg: UserMessage, emit: Any, control: RunControl
    ) -> None:
        state = await self.cache.get(session_id, profile_id=msg.profile_id)
        # No per-session lock: the session actor runs one turn at a time, and the lease
        # keeps other processes out.
        cfg = self.config()
        wanted = msg.profile_id
        if wanted is not None and wanted in cfg.profiles and state.profile_id != wanted:
            refused = cfg.refuse_profile(msg.user_role, wanted)
            if refused is None:
                await self.cache.set_profile(state, wanted)  # the message switches the session
            else:  # a queued or scheduled message, checked before the config changed
                emit(WarningEvent(message=f"{refused}; not switched", code="profile_refused"))
        current = cfg.profile(state.profile_id).id
        if not cfg.may_use(msg.user_role, current):
            # The session's profile is not one the sender's role may use (an admin's run
            # switched it, the config changed): the role's own default, from now on.
            fallback = cfg.default_for(msg.user_role)
            emit(
                WarningEvent(
                    message=f"{cfg.refuse_profile(msg.user_role, current)}; this session goes "
                    f"on with {fallback!r}",
                    code="profile_refused",
                )
            )
            await self.cache.set_profile(state, fallback)
        profile = cfg.profile(state.profile_id)
        control.on_busy_default = profile.on_busy
        control.steer_max_chars = self.settings.steer_max_chars
        # Held from here to the end of the run, checked again: the message may have
        # waited in the queue (across a restart too) since its cwd was checked.
        roots = await hold_roots(
            session_id,
            msg.cwd,
            user_id=msg.user_id,
            role=msg.user_role,
            settings=self.settings,
            config=self.live_config.source,
            store=self.store,
        )
        try:
            await self._hold_turn(session_id, msg, emit, control, state, cfg, roots)
        finally:
            roots.close()

    async def _hold_turn(
        self,
        session_id: str,
        msg: UserMessage,
        emit: Any,
        control: RunControl,
        state: SessionState,
        cfg: NaviConfig,
        roots: RunRoots,
    ) -> None:
        profile = cfg.profile(state.profile_id)
        turn = Turn(
            state=state,
            profile=profile,
            config=cfg,
            user_text=msg.text,
            emit=emit,
            user_id=msg.user_id,
            # A fork keeps its source's mode (session meta) for messages that ask none.
            mode=effective_mode(
                profile.policy,
                msg.user_role,
                msg.mode or state.row.meta.get("mode"),
                own_session=state.row.user_id == msg.user_id,
            ),
            user_role=msg.user_role,
            first_message=state.is_first_message,
            injections=control.injections,
            headless=msg.headless,
            roots=roots,
            budget=Budget.for_turn(
                self.store,
                effective(cfg, profile.id, msg.user_role, msg.budget),
                session_id=session_id,
                user_id=msg.user_id,
                hold_sec=self.settings.budget_hold_sec,
            ),
        )
        with runvars.bound(
            session_id=session_id,
            model=profile.model_or(self.settings.default_model),
            working_directory=msg.cwd,
            user_id=msg.user_id,
            user_role=msg.user_role,
            user_info=msg.user_info,
        ):
            await shielded(lambda: self._accept(state, msg, control))
            if control.skipped:
                return  # a wake-up whose note a turn already took in: nothing to do
            if control.woken is not None:
                turn.user_text = control.woken
                emit(Woken(text=control.woken))
            if roots.error is not None:
                emit(
                    WarningEvent(
                        message=f"{roots.error}; the tool calls of this run that work in "
                        "its folders fail",
                        code="root_unusable",
                    )
                )
            try:
                await TurnRunner(self.parts, turn).drive(control.scope)
            finally:
                if turn.budget is not None and turn.budget.active:
                    await shielded(turn.budget.close)  # the last call's spending, stored

    async def _accept(self, state: SessionState, msg: UserMessage, control: RunControl) -> None:
        """Save the user message first (and this turn's background task notes).

        A wake-up has no user message: its notes start the turn (`control.woken`), and with
        none left it only leaves the queue. A resumed message is saved already: only new notes
        are, and its turn's end debt (the first try's end may have paid the one its save
        set). A queued message gone from the queue is skipped, saying nothing."""
        # The id names it for a rewind or a fork; cwd and mode are what a fork keeps.
        user: dict[str, Any] | None = None
        turn_open = open_turn(state.messages, msg.message_id) if msg.retried else None
        if turn_open is False:
            # Its turn ended already (its answer saved, though the store said the save
            # failed; ended by the daemon that took the session over): nothing to run.
            log.info("session %s: the turn of a kept message had ended: not run again", state.id)
            control.skipped = True
            msg.accepted.ok()  # (acknowledged already: it was kept)
            return
        resumed = msg.kind == "resume" or turn_open is True
        if msg.kind != "wake" and not resumed:
            user = {"role": "user", "content": msg.text, "id": msg.message_id}
            if msg.cwd is not None:
                user["cwd"] = str(msg.cwd)
            if msg.mode is not None:
                user["mode"] = msg.mode
        notes = None
        try:
            notes = await collect_notes(self.store, self.settings, state.id)
        finally:
            # Even when reading the notes was cut short (the clean-up deadline): the
            # user message is never dropped; the notes stay stored for the next turn.
            # Unless its sender was already told it was refused (its wait timed out).
            if not msg.accepted.failed:
                if user is None and notes is None and not resumed:
                    if msg.queue_key is not None:  # nothing to wake for: off the queue
                        await self.store.unqueue(msg.queue_key)
                    control.skipped = True
                    msg.accepted.ok()
                else:
                    await self._commit(state, msg, user, notes, control, resumed=resumed)
        if msg.accepted.error is not None and not control.skipped:
            raise msg.accepted.error
        if notes is not None and control.saved:
            # Only once they are in the saved context: a crash in between repeats a
            # note next turn instead of losing it.
            await remove_notes(self.store, notes.keys)
        if msg.kind == "wake" and notes is not None and control.saved:
            control.woken = notes.text

    async def _commit(
        self,
        state: SessionState,
        msg: UserMessage,
        user: dict[str, Any] | None,
        notes: Any,
        control: RunControl,
        *,
        resumed: bool,
    ) -> None:
        """Save the user message (and the notes) in one transaction that also takes a queued
        message off the queue; accepted once in."""
        mark = state.mark()
        if notes is not None:
            # Persisted, invisible in the UI (a wake-up's shows: it is the turn's start),
            # kept by the context builder.
            note = {"role": "system", "content": notes.text, "keep": True, "task_notes": True}
            wake = msg.kind == "wake"
            if wake:
                note["wake"] = True
            state.add(note, display=wake)
        if user is not None:
            state.add(user)
        try:
            # Shielded inside: lands even when cancelled.
            await self.cache.save(
                state,
                dequeue=None if resumed else msg.queue_key,
                claim=None if resumed or user is None else msg.key_claim(),
                owes_end=True,  # the turn starts: its end is owed until it goes out
            )
        except DuplicateMessageError as exc:
            # Another message with its client key was taken first (a resend that came
            # while the first was on its way): it does not run; its sender is told so.
            state.undo(mark)
            msg.accepted.fail(exc)
            control.skipped = True
            return
        except NotQueuedError:
            # Taken by another daemon first, or dropped by the cap (announced there):
            # this run has nothing to do. Acknowledged already, unless its queue write
            # had not answered within its deadline: then it is refused now.
            state.undo(mark)
            msg.accepted.fail(
                StorageError(
                    f"session {state.id!r}: the message was not stored in time; it will not run",
                    session_id=state.id,
                )
            )
            control.skipped = True
            return
        except Exception as exc:
            # Not stored (a full disk, a damaged file): out of memory too, or the next
            # save would store a message whose sender was told it was refused.
            state.undo(mark)
            msg.accepted.fail(exc)
            raise
        control.saved = True
        msg.accepted.ok()

    async def end_dead_turn(
        self, session_id: str, generation: int, publish: Callable[[list[AgentEvent]], None]
    ) -> None:
        """End the turn of an owner that died holding the lease this runtime took over (at
        `generation`): in the history, and to the session's clients through `publish`, while
        the lease is still held, so a daemon that runs the session next has them before its
        claim. It ends and publishes nothing when another runtime holds it now or took it
        over since. When the history shows no turn open (the owner died after its turn's
        last save, its answer or its error, before its lease's release; or its hold was no
        run's: a compaction, a rewind, a fork), it adds nothing, and publishes that turn's
        ``stream_end`` as the history has it only when the lease still owes it
        (`SessionStore.end_owed`): the owner died before its end reached the other
        daemons, and a client following the turn waits for it. Once it went out, every
        daemon following the session had it in that commit, and a second would count as
        one more run's end. Its own end is owed in turn until it goes out: a runtime that
        dies before that leaves it to the next one."""
        try:
            async with self.leases.hold(session_id):
                if self.leases.generation(session_id) != generation:
                    return
                if await self.store.get_session(session_id) is None:
                    return  # deleted meanwhile: nothing to end
                state = await self.cache.get(session_id)
                if not last_turn_open(state.messages):
                    log.info(
                        "session %s: a dead daemon's lease freed: its turn had ended", session_id
                    )
                    ended = last_turn_end(state.messages)
                    if ended is not None and await self.store.end_owed(session_id):
                        publish([_end_as_saved(ended)])
                    return  # the lease is released as the hold ends
                # Display only, as a context-too-large notice: the model sees the
                # question without an answer, the person sees why.
                state.add(
                    {"role": "assistant", "content": "", "error": DEAD_TURN, "synthetic": True},
                    context=False,
                )
                await self.cache.save(state, owes_end=True)
                log.warning("session %s: the turn of a dead daemon ended here", session_id)
                publish(
                    [ErrorEvent(message=DEAD_TURN, code="daemon_died"), StreamEnd(reason="error")]
                )
        except SessionBusyError:
            return  # a live owner holds it: its turn is not dead

    @asynccontextmanager
    async def compact_stream(
        self, session_id: str, *, nothing_as_event: bool = False
    ) -> AsyncIterator[EventReceiver]:
        """Forced compression: CompressionStarted + ContextCompressed, on the same kind of
        bounded channel as a run's events. When there is nothing (new) to compress, it
        raises NothingToCompactError on entry (the spec's call); with `nothing_as_event`
        (the session actor), one ErrorEvent (``nothing_to_compact``) on the channel
        instead: like a run's end (`_say_failed`), read and published while the lease is
        held, so a daemon that claims the session at its release has it before its run,
        and none gets it later.
        """
        # Another process must not run the session while its context is rewritten.
        async with self.leases.hold(session_id):
            state = await self.cache.get(session_id)
            # No per-session lock: the session actor refuses while a run is active.
            cfg = self.config()
            send, recv = open_event_channel(self.settings.event_buffer_max)
            turn = Turn(
                state=state,
                profile=cfg.profile(state.profile_id),
                config=cfg,
                user_text="",
                emit=emitter(send),
            )
            runner = TurnRunner(self.parts, turn)
            nothing = not self.parts.compressor(runner.complete).would_compress(
                state.context, profile=turn.profile, shrink=True
            )
            if nothing and not nothing_as_event:
                raise NothingToCompactError(NOTHING_TO_COMPACT)

            async def compact() -> None:
                async with send:
                    if nothing:
                        turn.emit(ErrorEvent(message=NOTHING_TO_COMPACT, code="nothing_to_compact"))
                        return
                    await self.parts.counter.preload()
                    tokens = self.parts.counter.estimate_messages(state.context)
                    try:
                        await runner.compress("forced", tokens, force=True)
                    except LLMError as exc:
                        turn.emit(ErrorEvent(message=str(exc), code=exc.code))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(compact)
                with recv:
                    yield recv

    async def run_ephemeral(
        self, request: SpawnRequest, *, parent_session_id: str | None = None
    ) -> tuple[str, bool]:
        """A non-persistent sub-agent: (result_text, completed_normally).

        It takes the profile of `parent_session_id` unless `request` names one. A backend-level
        LLM error is raised, as it ends a synchronous caller's turn; any other failure is
        ``completed_normally`` False, the text saying why."""
        outcome = await run_ephemeral(self.parts, request, parent_session_id=parent_session_id)
        if outcome.backend_error is not None:
            raise outcome.backend_error
        return outcome.text, outcome.completed


def _end_as_saved(message: dict[str, Any]) -> StreamEnd:
    """The ``stream_end`` of a turn that ended with `message` (its answer, as saved)."""
    reason = "complete"
    if message.get("error"):
        reason = "error"
    elif message.get("stopped"):
        reason = "stopped"
    elif message.get("budget"):
        reason = "budget_exhausted"
    return StreamEnd(
        text=str(message.get("content") or ""), stopped=reason == "stopped", reason=reason
    )


async def _sent_elsewhere(exc: Exception, control: RunControl) -> bool:
    """The claim of the lease was refused (another daemon runs the session) and the
    message went to that daemon's queue instead (`RunControl.elsewhere`)."""
    refused_claim = (
        isinstance(exc, SessionBusyError)
        and not isinstance(exc, LeaseLostError)
        and control.lease is None
    )
    return refused_claim and control.elsewhere is not None and await control.elsewhere()
