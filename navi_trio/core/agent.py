"""The agent: `run_stream`, `run`, `compact_stream` and `run_ephemeral`.

`run_stream` is exposed the trio-safe way (DESIGN.md): ::

    async with agent.run_stream(session_id, "hello") as events:
        async for event in events:
            ...

The turn runs in a task of the context manager's own nursery and sends its events to
a bounded channel that never blocks (`core.emit`): a tool's progress callback must
never block, and a slow reader costs merged or dropped progress, never memory.
Leaving the ``async with`` early stops the run (as Stop does).

Stop is a cancel scope (`RunControl.stop()`): it takes effect at the next checkpoint in
any phase — planning, prefill, streaming, a running tool. The clean-up that follows
runs shielded: the partial answer is saved, every tool call without a result gets
"stopped by the user", and StreamEnd says the run was stopped. The user message is
saved (shielded) before anything else, so it is never lost.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from navi_trio.core import runvars
from navi_trio.core.compression import Compressor
from navi_trio.core.context import ContextBuilder
from navi_trio.core.emit import EventReceiver, EventSender, SendsNowait, open_event_channel
from navi_trio.core.lease import SessionLeases
from navi_trio.core.planning import PlanningPrompts
from navi_trio.core.services import RunServices
from navi_trio.core.session import SessionCache, SessionState
from navi_trio.core.subagent import run_ephemeral
from navi_trio.core.task_notes import collect_notes, remove_notes
from navi_trio.core.tasks import TaskSupervisor
from navi_trio.core.tokens import TokenCounter
from navi_trio.core.tool_executor import ToolExecutor, stopped_result
from navi_trio.core.turn import Turn, TurnRunner, shielded
from navi_trio.errors import (
    ContextTooLargeError,
    LLMConnectionError,
    LLMError,
    LLMStatusError,
    LLMTimeoutError,
    NothingToCompactError,
    SessionBusyError,
)
from navi_trio.events import (
    AgentEvent,
    ErrorEvent,
    StreamEnd,
    TextDelta,
    WarningEvent,
)
from navi_trio.events import ToolResult as ToolResultEvent
from navi_trio.llm.base import LLMBackend
from navi_trio.profiles import ConfigSource, NaviConfig
from navi_trio.settings import Settings
from navi_trio.store.base import SessionStore
from navi_trio.tools.base import ToolContext, ToolRegistry
from navi_trio.tools.procs import ProcessPool

log = logging.getLogger(__name__)


@attrs.frozen
class UserMessage:
    text: str
    cwd: Path | None = None
    user_id: str = "local"
    user_role: str = "user"
    user_info: dict[str, Any] | None = None
    profile_id: str | None = None  # for a session that does not exist yet


class RunControl:
    """Stop handle of one run: `stop()` cancels the run's cancel scope."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()

    def stop(self) -> None:
        self.scope.cancel()

    @property
    def stopped(self) -> bool:
        return self.scope.cancel_called


def _emitter(send: SendsNowait) -> Any:
    def emit(event: AgentEvent) -> None:
        try:
            send.send_nowait(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the reader left; the run is being stopped

    return emit


def _error_code(exc: BaseException) -> str:
    if isinstance(exc, LLMTimeoutError):
        return "llm_timeout"
    if isinstance(exc, LLMConnectionError):
        return "llm_connection"
    if isinstance(exc, LLMStatusError):
        return "llm_status"
    return exc.code if isinstance(exc, LLMError) else "llm_error"


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


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
    ) -> None:
        self.settings = settings
        self.config_source = config
        self.store = store
        self.backend = backend
        self.registry = registry
        self.supervisor = supervisor
        self.processes = processes
        self.counter = counter or TokenCounter()
        self.builder = ContextBuilder(settings, self.counter)
        self.executor = ToolExecutor(registry, settings, supervisor)
        self.cache = SessionCache(store, config.current.default_profile)
        self.leases = SessionLeases(store)  # one process runs a session at a time
        self._generation = config.generation
        self.planning_prompts = PlanningPrompts.load(self.prompts_dir)

    # -- configuration ------------------------------------------------------------

    @property
    def prompts_dir(self) -> Path:
        return self.config_source.current.base_dir / "prompts"

    def config(self) -> NaviConfig:
        """The config in force; a changed file is reloaded (a broken one is ignored)."""
        self.config_source.maybe_reload()
        if self.config_source.generation != self._generation:
            self._generation = self.config_source.generation
            self.builder.invalidate()
            self.planning_prompts = PlanningPrompts.load(self.prompts_dir)
        return self.config_source.current

    def compressor(self, complete: Any) -> Compressor:
        return Compressor(self.settings, self.counter, complete, self.prompts_dir)

    def session_dir(self, session_id: str) -> Path:
        return self.settings.data_dir / "sessions" / session_id

    def tool_context(self, turn: Turn, *, session_id: str) -> ToolContext:
        return ToolContext(
            session_id=session_id,
            session_dir=self.session_dir(session_id),
            kv=self.store,
            settings=self.settings,
            profile=turn.profile,
            config=turn.config,
            cwd=runvars.current_working_directory.get(),
            user_id=turn.user_id,
            publish=turn.emit,
            services=RunServices(self, turn, self.processes, self.supervisor),
            is_subagent=turn.subagent,
            can_detach=turn.persist or turn.parent_session_id is not None,
        )

    async def switch_profile(self, turn: Turn, profile_id: str) -> None:
        """Step 10: the profile changed; reload it (and with it the tools)."""
        cfg = self.config()
        turn.config = cfg
        turn.profile = cfg.profile(profile_id)
        self.builder.invalidate(profile_id)
        if turn.persist and not turn.subagent:
            await self.cache.set_profile(turn.state, profile_id)

    # -- run_stream / run ---------------------------------------------------------

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
            emit = _emitter(send)
            try:
                async with self.leases.hold(session_id):
                    await self._run_turn(session_id, msg, emit, control)
            except SessionBusyError as exc:
                emit(ErrorEvent(message=str(exc), code="session_busy"))
                emit(StreamEnd(reason="error"))
            except Exception as exc:  # our own bug: say so and keep the daemon alive
                log.exception("run of session %s failed", session_id)
                emit(
                    ErrorEvent(
                        message=f"internal error: {type(exc).__name__}: {exc}", code="internal"
                    )
                )
                emit(StreamEnd(reason="error"))

    async def _run_turn(
        self, session_id: str, msg: UserMessage, emit: Any, control: RunControl
    ) -> None:
        state = await self.cache.get(session_id, profile_id=msg.profile_id)
        async with state.lock:
            cfg = self.config()
            profile = cfg.profile(state.profile_id)
            turn = Turn(
                state=state,
                profile=profile,
                config=cfg,
                user_text=msg.text,
                emit=emit,
                user_id=msg.user_id,
                first_message=state.is_first_message,
            )
            with runvars.bound(
                session_id=session_id,
                model=profile.model_or(self.settings.default_model),
                working_directory=msg.cwd,
                user_id=msg.user_id,
                user_role=msg.user_role,
                user_info=msg.user_info,
            ):
                await shielded(lambda: self._accept(state, msg))
                await self._drive(TurnRunner(self, turn), control)

    async def _accept(self, state: SessionState, msg: UserMessage) -> None:
        """Save the user message first (and this turn's background task notes)."""
        notes = await collect_notes(self.store, self.settings, state.id)
        if notes is not None:
            # Persisted, invisible in the UI, kept by the context builder.
            state.add(
                {"role": "system", "content": notes.text, "keep": True, "task_notes": True},
                display=False,
            )
        user: dict[str, Any] = {"role": "user", "content": msg.text}
        if msg.cwd is not None:
            user["cwd"] = str(msg.cwd)
        state.add(user)
        await self.cache.save(state)
        if notes is not None:
            # Only once they are in the saved context: a crash in between repeats a
            # note next turn instead of losing it.
            await remove_notes(self.store, notes.keys)

    async def _drive(self, runner: TurnRunner, control: RunControl) -> None:
        turn = runner.turn
        try:
            with control.scope:
                try:
                    await runner.run()
                except ContextTooLargeError as exc:
                    await self._too_large(runner, exc)
                except LLMError as exc:
                    await shielded(partial(self._failed, runner, exc))
                if turn.completed_normally and turn.persist:
                    await self._run_workers(runner)
        except BaseException as exc:
            # Cancelled from outside the run (the runtime shutting down) or our own bug:
            # the history is left consistent all the same, then the exception goes on.
            if not turn.ended:
                if _only_cancelled(exc):
                    await shielded(lambda: self._stopped(runner))
                else:
                    await shielded(partial(self._crashed, runner))
            raise
        if not turn.ended:
            await shielded(lambda: self._stopped(runner))

    async def _run_workers(self, runner: TurnRunner) -> None:
        """Workers run after StreamEnd: the compression worker.

        The turn has already ended, so a failure here is a warning, never a second
        StreamEnd; the context stays as it was and the next turn tries again.
        """
        turn = runner.turn
        try:
            await runner.compress("worker", self.counter.estimate_messages(turn.state.context))
        except LLMError as exc:
            turn.emit(
                WarningEvent(
                    message=f"compressing the context after the answer failed: {exc}",
                    code="compression_failed",
                )
            )

    async def _save_partial(self, runner: TurnRunner, **marks: Any) -> str:
        turn = runner.turn
        reply = turn.reply
        text = reply.content if reply else ""
        if reply is not None and (reply.text or reply.thinking):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text,
                "partial": True,
                **marks,
            }
            if reply.thinking:
                message["thinking"] = reply.thinking_text
            turn.state.add(message)
        turn.reply = None
        for i, call in enumerate(turn.pending_calls):
            if i not in turn.results:
                result = stopped_result()
                turn.results[i] = result
                turn.emit(
                    ToolResultEvent(call_id=call.id, name=call.name, ok=False, error=result.error)
                )
        runner.pair_results()
        await runner.save()
        return text

    async def _crashed(self, runner: TurnRunner) -> None:
        await self._save_partial(runner, error="internal error")

    async def _stopped(self, runner: TurnRunner) -> None:
        text = await self._save_partial(runner, stopped=True)
        runner.turn.end(runner.stream_end(text, reason="stopped"))

    async def _failed(self, runner: TurnRunner, exc: LLMError) -> None:
        runner.turn.emit(ErrorEvent(message=str(exc), code=_error_code(exc)))
        text = await self._save_partial(runner, error=str(exc))
        runner.turn.end(runner.stream_end(text, reason="error"))

    async def _too_large(self, runner: TurnRunner, exc: ContextTooLargeError) -> None:
        turn = runner.turn
        text = (
            f"I can't go on with this conversation: it needs ~{exc.tokens} tokens but the "
            f"model's window allows {exc.limit}. Compact it with `navi compact --session "
            f"{turn.state.id}` (or /compact in a chat), or start a new session."
        )
        turn.emit(TextDelta(text))
        # Display only: adding it to the context would make the context larger still.
        turn.state.add({"role": "assistant", "content": text, "synthetic": True}, context=False)
        await shielded(runner.save)
        turn.end(runner.stream_end(text, reason="context_too_large"))

    # -- compact_stream -----------------------------------------------------------

    @asynccontextmanager
    async def compact_stream(
        self, session_id: str
    ) -> AsyncIterator[trio.MemoryReceiveChannel[AgentEvent]]:
        """Forced compression: CompressionStarted + ContextCompressed.

        Raises NothingToCompactError on entry when there is nothing (new) to compress.
        """
        state = await self.cache.get(session_id)
        async with state.lock:
            cfg = self.config()
            send, recv = trio.open_memory_channel[AgentEvent](math.inf)
            turn = Turn(
                state=state,
                profile=cfg.profile(state.profile_id),
                config=cfg,
                user_text="",
                emit=_emitter(send),
            )
            runner = TurnRunner(self, turn)
            if not self.compressor(runner.complete).would_compress(
                state.context, profile=turn.profile, shrink=True
            ):
                raise NothingToCompactError(
                    "nothing to compact: the context is already short or already a summary"
                )

            async def compact() -> None:
                async with send:
                    tokens = self.counter.estimate_messages(state.context)
                    try:
                        await runner.compress("forced", tokens, force=True)
                    except LLMError as exc:
                        turn.emit(ErrorEvent(message=str(exc), code=_error_code(exc)))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(compact)
                with recv:
                    yield recv

    # -- sub-agents ------------------------------------------------------------------

    async def run_ephemeral(
        self,
        user_message: str,
        profile_id: str | None = None,
        *,
        max_iterations: int = 40,
        exclude_tools: tuple[str, ...] = (),
        briefing: str | None = None,
        custom_system_prompt: str | None = None,
        inherit_system_prompt: bool = False,
        context_transfer: str | None = None,
        parent_session_id: str | None = None,
        timeout_seconds: float = 300.0,
    ) -> tuple[str, bool]:
        """A non-persistent sub-agent: (result_text, completed_normally)."""
        outcome = await run_ephemeral(
            self,
            user_message,
            profile_id,
            max_iterations=max_iterations,
            exclude_tools=exclude_tools,
            briefing=briefing,
            custom_system_prompt=custom_system_prompt,
            inherit_system_prompt=inherit_system_prompt,
            context_transfer=context_transfer,
            parent_session_id=parent_session_id,
            timeout_seconds=timeout_seconds,
        )
        return outcome.text, outcome.completed
