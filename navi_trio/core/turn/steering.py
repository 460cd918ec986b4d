"""Double-texting and steering: what a message does when its session is busy.

``on_busy`` (else the profile's default, else ``enqueue``): ``enqueue`` waits in the
durable queue; ``reject`` is refused with ``session_busy``; ``interrupt`` stops the
running turn and runs next; ``steer`` joins the running turn as a user message before
its next LLM call (a request still waiting for its first chunk is asked again with it).
Only the user who started a turn steers or interrupts it; anyone else asking to is
refused with ``forbidden``, and a profile default is queued instead. A steered message
is durable like a queued one; one the turn never took in runs next.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from navi_trio.core.jobs import collect_notes, remove_notes
from navi_trio.core.turn.acceptance import Acceptance
from navi_trio.core.turn.injections import Injections as Injections
from navi_trio.core.turn.injections import SteerItem as SteerItem
from navi_trio.errors import ForbiddenError, LimitError, NotQueuedError, SessionBusyError
from navi_trio.events import Steered
from navi_trio.profiles import ON_BUSY, OnBusy

if TYPE_CHECKING:
    from navi_trio.core.turn.turn_state import LoopParts, Turn

DEFAULT_ON_BUSY: OnBusy = "enqueue"


def check_on_busy(value: str | None, where: str = "on_busy") -> OnBusy | None:
    """`value` if it is a strategy (or None); else a ValueError naming the choices."""
    if value is None:
        return None
    for choice in ON_BUSY:
        if value == choice:
            return choice
    raise ValueError(f"{where} must be one of {', '.join(ON_BUSY)}, not {value!r}")


async def take_injections(turn: Turn, parts: LoopParts) -> None:
    """Steered messages and waiting background notes into the turn's context, saved: each
    steered message in the transaction that takes it off the queue, the notes as a hidden
    system message, removed from the store once saved."""
    injections = turn.injections
    if injections is None or not injections.pending:
        return
    for item in injections.take():
        if item.written is not None:
            await item.written()
        if item.accepted.failed:
            continue  # its queue write failed: its sender was told; it never runs
        message: dict[str, Any] = {"role": "user", "content": item.text, "steered": True}
        if item.cwd is not None:
            message["cwd"] = str(item.cwd)
        mark = turn.state.mark()
        turn.state.add(message)
        if turn.persist:
            try:
                await parts.cache.save(turn.state, dequeue=item.queue_key)
            except NotQueuedError:
                turn.state.undo(mark)  # the queue's cap dropped it meanwhile (announced)
                continue
        item.accepted.ok()  # (already ok once queued; a late write is acknowledged now)
        turn.emit(Steered(text=item.text))
    if injections.notes_due:
        injections.notes_due = False
        batch = await collect_notes(parts.store, parts.settings, turn.state.id)
        if batch is not None:
            turn.state.add(
                {"role": "system", "content": batch.text, "keep": True, "task_notes": True},
                display=False,
            )
            if turn.persist:
                await parts.cache.save(turn.state)
            await remove_notes(parts.store, batch.keys)


class _Control(Protocol):
    """What the routing needs of the running turn's `RunControl` (core/turn/agent.py)."""

    run_id: str
    injections: Injections
    on_busy_default: OnBusy
    steer_max_chars: int


def check_steer(text: str, control: _Control) -> None:
    """A steered message joins a turn under way: bounded (NAVI_STEER_MAX_CHARS)."""
    if len(text) > control.steer_max_chars:
        raise LimitError(
            f"a steered message is at most {control.steer_max_chars} characters "
            f"(NAVI_STEER_MAX_CHARS), not {len(text)}: send it with on_busy enqueue"
        )


def busy_strategy(
    asked: str | None, control: _Control | None, default: OnBusy = DEFAULT_ON_BUSY
) -> OnBusy:
    """The strategy for a message meeting a busy session: its own, else the running turn's
    profile default (`default` with no turn here). With no turn running here, steer and
    interrupt have nothing to act on: the message is queued."""
    strategy = check_on_busy(asked) or (control.on_busy_default if control is not None else default)
    if control is None and strategy in ("steer", "interrupt"):
        return "enqueue"
    return strategy


def not_the_starter(session_id: str, strategy: str) -> ForbiddenError:
    """A steer or an interrupt asked by someone who did not start the running turn: the
    turn is its starter's (its approvals too), so the message is refused."""
    verb = "steered" if strategy == "steer" else "interrupted"
    return ForbiddenError(
        f"the turn running in session {session_id!r} was started by another user: only "
        f"they may {strategy} it, so your message was not {verb} into it (on_busy: "
        f"{strategy}); send it with on_busy enqueue to run after it",
        session_id=session_id,
    )


def refusal(session_id: str, control: _Control | None) -> SessionBusyError:
    """The `reject` answer: session_busy, naming the running run."""
    if control is None:
        exc = SessionBusyError(
            f"session {session_id!r} is busy compacting its context (on_busy: reject)",
            session_id=session_id,
        )
    else:
        exc = SessionBusyError(
            f"session {session_id!r} is running {control.run_id} (on_busy: reject): "
            "send again later, or with on_busy enqueue, interrupt or steer",
            session_id=session_id,
        )
        exc.run_id = control.run_id
    return exc


class _Queued(Protocol):
    @property
    def text(self) -> str: ...
    @property
    def queue_key(self) -> str | None: ...
    @property
    def accepted(self) -> Acceptance: ...
    @property
    def cwd(self) -> Path | None: ...


def steer_item(msg: _Queued, written: Callable[[Any], Awaitable[None]]) -> SteerItem:
    """A queued (stored) message as a steer for the running turn."""
    return SteerItem(
        text=msg.text,
        queue_key=msg.queue_key,
        accepted=msg.accepted,
        cwd=msg.cwd,
        written=lambda: written(msg),
        origin=msg,
    )
