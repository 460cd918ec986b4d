"""How a turn ends, whatever happens: `TurnEnding`, the base of `TurnRunner` (turn.py).

`drive` runs the loop inside the run's cancel scope and ends the turn in every way it
can end — complete, stopped, failed (an LLM error), crashed (our bug), context too
large — saving the partial answer and pairing every tool call, shielded, and saying so
with one StreamEnd. The loop itself (turn.py) only has to reach its own end.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from navi_trio.core.turn.llm_call import StreamedReply
from navi_trio.core.turn.tool_executor import stopped_result, tool_message
from navi_trio.core.turn.turn_state import LoopParts, Turn
from navi_trio.errors import BudgetExhaustedError, ContextTooLargeError, LLMError
from navi_trio.events import (
    BudgetExhausted,
    ErrorEvent,
    StreamEnd,
    TextDelta,
    ToolResultEvent,
    WarningEvent,
)
from navi_trio.tools.base import ToolResult


class TurnEnding:
    """The endings of a turn; the loop (`run`, `save`, `compress`) is the subclass's."""

    parts: LoopParts
    turn: Turn

    async def run(self) -> None:
        raise NotImplementedError

    async def save(self, *, durable: bool = True) -> None:
        raise NotImplementedError

    async def compress(self, reason: str, tokens: int, *, force: bool = False) -> bool:
        raise NotImplementedError

    def stream_end(
        self, text: str, *, reason: str, reply: StreamedReply | None = None
    ) -> StreamEnd:
        t = self.turn
        return StreamEnd(
            text=text,
            stopped=reason == "stopped",
            reason=reason,
            iterations=t.iterations,
            prompt_tokens=t.prompt_tokens,
            completion_tokens=t.completion_tokens,
            done_reason=reply.done.done_reason if reply and reply.done else None,
        )

    def pair_results(self) -> None:
        """Append one tool message per pending call, in call order (stopped if missing)."""
        t = self.turn
        for i, call in enumerate(t.pending_calls):
            t.state.add(tool_message(call, t.results.get(i) or stopped_result()))
        t.pending_calls = []

    async def drive(self, scope: trio.CancelScope) -> None:
        """Run the turn inside the run's cancel `scope` and end it whatever happens.

        Stop cancels `scope`; a cancel from outside (the runtime shutting down) or our
        own bug ends the turn the same way, then goes on. Every ending is shielded: the
        history is left consistent (partial answer saved, every call paired).
        """
        turn = self.turn
        try:
            with scope:
                try:
                    await self.run()
                except ContextTooLargeError as exc:
                    await self._too_large(exc)
                except BudgetExhaustedError as exc:
                    await shielded(partial(self._exhausted, exc))
                except LLMError as exc:
                    await shielded(partial(self._failed, exc))
                if turn.completed_normally and turn.persist:
                    await self._run_workers()
        except BaseException as exc:
            if not turn.ended:
                if _only_cancelled(exc):
                    await shielded(self._stopped)
                else:
                    await shielded(self._crashed)
            raise
        if not turn.ended:
            await shielded(self._stopped)

    async def _run_workers(self) -> None:
        """Workers run after StreamEnd: the compression worker.

        The turn has already ended, so a failure here is a warning, never a second
        StreamEnd; the context stays as it was and the next turn tries again.
        """
        turn = self.turn
        try:
            await self.parts.counter.preload()  # a turn that ended before any answer
            await self.compress("worker", self.parts.counter.estimate_messages(turn.state.context))
        except LLMError as exc:
            turn.emit(
                WarningEvent(
                    message=f"compressing the context after the answer failed: {exc}",
                    code="compression_failed",
                )
            )

    async def _save_partial(
        self, *, durable: bool = True, unfinished: ToolResult | None = None, **marks: Any
    ) -> str:
        """Keep what the call being streamed produced; pair every call without a result
        (with `unfinished`, else "stopped by the user")."""
        turn = self.turn
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
                result = unfinished or stopped_result()
                turn.results[i] = result
                started = turn.call_started.get(call.id)  # None: it never started
                took = 0 if started is None else int((trio.current_time() - started) * 1000)
                turn.emit(
                    ToolResultEvent(
                        call_id=call.id,
                        name=call.name,
                        ok=False,
                        error=result.error,
                        duration_ms=took,
                        stopped=True,
                    )
                )
        self.pair_results()
        await self.save(durable=durable)
        return text

    async def _crashed(self) -> None:
        await self._save_partial(error="internal error")

    async def _stopped(self) -> None:
        # Committed without an fsync, so StreamEnd does not wait for the disk: the
        # stopped turn survives a killed daemon at once, and power loss from the next
        # durable commit on (before that, at worst the history ends where this turn's
        # last durable save left it, and a dangling call is paired on load).
        text = await self._save_partial(durable=False, stopped=True)
        self.turn.end(self.stream_end(text, reason="stopped"))

    async def _exhausted(self, exc: BudgetExhaustedError) -> None:
        """A budget is spent (core/turn/budgets.py): the turn ends as a stop does, saying which."""
        turn = self.turn
        turn.emit(
            BudgetExhausted(
                scope=exc.scope, kind=exc.kind, spent=exc.spent, limit=exc.limit,
                message=str(exc), held=exc.held,
            )
        )  # fmt: skip
        text = await self._save_partial(durable=False, stopped=True, budget=str(exc))
        turn.end(self.stream_end(text, reason="budget_exhausted"))

    async def _failed(self, exc: LLMError) -> None:
        self.turn.emit(ErrorEvent(message=str(exc), code=exc.code))
        # Calls under way only when a sub-agent's backend failed (tool_executor.py): the
        # call that met the error and its neighbours in a batch, all stopped by it.
        unfinished = ToolResult.fail(f"not finished: the turn ended on an LLM error: {exc}")
        text = await self._save_partial(error=str(exc), unfinished=unfinished)
        self.turn.end(self.stream_end(text, reason="error"))

    async def _too_large(self, exc: ContextTooLargeError) -> None:
        turn = self.turn
        text = (
            f"I can't go on with this conversation: it needs ~{exc.tokens} tokens but the "
            f"model's window allows {exc.limit}. Compact it with `navi compact --session "
            f"{turn.state.id}` (or /compact in a chat), or start a new session."
        )
        turn.emit(TextDelta(text))
        # Display only: adding it to the context would make the context larger still.
        turn.state.add({"role": "assistant", "content": text, "synthetic": True}, context=False)
        await shielded(self.save)
        turn.end(self.stream_end(text, reason="context_too_large"))


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


async def shielded(fn: Callable[[], Awaitable[None]], seconds: float = 10.0) -> None:
    """Clean-up that must finish: shielded from the stop, bounded by its own deadline."""
    with trio.move_on_after(seconds, shield=True):
        await fn()
