"""The durable side of a session's message queue: what makes it survive a crash.

A queued message is written to the store before it is acknowledged, and leaves the
queue in the transaction that saves it into the history, so a SIGKILL leaves it in
exactly one of the two places; a restart adopts a dead process's rows, in order.
Writes go out in the order asked (tasks started in one tick run in no fixed order).
The cap is the store's (the newest rows kept, whichever daemon queued them), and a
row taken by another daemon or dropped by the cap is never run.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from navi_trio import wire
from navi_trio.core.turn import UserMessage, stopped_before_saving, trace_carrier
from navi_trio.errors import DuplicateMessageError, NaviError, StorageError
from navi_trio.events import WarningEvent
from navi_trio.profiles import BudgetConfig
from navi_trio.profiles._control import budgets_dict, parse_budgets
from navi_trio.store.methods import SessionStore

log = logging.getLogger(__name__)

WRITE_DEADLINE_SEC = 10.0  # a queue write that must land, shielded, at most this long
# Rows a store dropped from a full queue: (key, the row as queued).
Dropped = list[tuple[str, dict[str, Any]]]


def to_row(msg: UserMessage) -> dict[str, Any]:
    return {
        "text": msg.text,
        "cwd": None if msg.cwd is None else str(msg.cwd),
        "user_id": msg.user_id,
        "user_role": msg.user_role,
        "user_info": msg.user_info,
        "profile_id": msg.profile_id,
        "mode": msg.mode,
        "kind": msg.kind,
        "headless": msg.headless,
        "budget": None if msg.budget is None else budgets_dict(msg.budget),
        "schedule_id": msg.schedule_id,
        # Checked and bounded when it came in (`trace_carrier`); a daemon of the previous
        # version reads past the key.
        "trace": None if msg.trace is None else dict(msg.trace),
    }


def from_row(key: str, row: dict[str, Any]) -> UserMessage:
    msg = UserMessage(
        str(row.get("text", "")),
        cwd=Path(row["cwd"]) if row.get("cwd") else None,
        user_id=str(row.get("user_id") or "local"),
        user_role=str(row.get("user_role") or "user"),
        user_info=row.get("user_info"),
        profile_id=row.get("profile_id"),
        mode=row.get("mode"),
        queue_key=key,
        kind=str(row.get("kind") or "user"),
        headless=bool(row.get("headless")),
        on_busy="enqueue",  # queued already: it waits for its turn
        budget=_budget(row.get("budget")),
        schedule_id=row.get("schedule_id"),
        trace=_trace(row.get("trace")),
    )
    msg.accepted.ok()  # it was acknowledged in its first life
    return msg


def _trace(data: Any) -> dict[str, str] | None:
    """A stored row's trace context, checked again as a client's is; none (an older row, a
    bad one) starts a new trace."""
    if not isinstance(data, dict):
        return None
    return trace_carrier(data.get("traceparent"), data.get("tracestate"))


def _budget(data: Any) -> BudgetConfig | None:
    """A stored row's budget (checked again: a row is the store's, not ours alone)."""
    if data is None:
        return None
    try:
        return parse_budgets(data)
    except ValueError as exc:
        log.warning("a queued message's budget is unreadable (%s): the configured ones apply", exc)
        return None


def dropped_warning(row: dict[str, Any], cap: int, total: int) -> WarningEvent:
    """What the session's subscribers are told of a message the queue's cap dropped:
    which one, and that it will not run."""
    if row.get("kind") == "wake":
        what = "a wake-up for background results (their notes wait for the next turn)"
    else:
        text = wire.dropped_excerpt(str(row.get("text", "")))
        what = f"the message {text!r}"
        if row.get("kind") == "schedule":
            what = f"the scheduled run {text!r}"
    return WarningEvent(
        message=(
            f"{wire.QUEUE_FULL} ({cap} waiting, NAVI_MESSAGE_QUEUE_MAX): the oldest "
            f"waiting, {what}, was dropped and will not run ({total} dropped so far)"
        ),
        code=wire.MESSAGE_DROPPED,
    )


class _TakesMessages(Protocol):
    def send_message(self, message: UserMessage) -> object: ...


class _Registry(Protocol):
    """What `deliver` needs of the session registry (core/session/session_actor.py)."""

    adopt: bool

    def actor(self, session_id: str) -> _TakesMessages | None: ...
    async def get(self, session_id: str) -> _TakesMessages: ...


async def deliver(registry: _Registry, session_id: str, key: str, row: dict[str, Any]) -> None:
    """Hand a message the store already queued (a wake-up, a scheduled run) to its session's
    actor, started if need be; shutting down, it stays queued and runs after the restart."""
    if registry.actor(session_id) is None and registry.adopt:
        await registry.get(session_id)
        return
    actor = await registry.get(session_id)
    try:
        actor.send_message(from_row(key, row))
    except RuntimeError:
        pass


class DurableQueue:
    """The store rows of one session's queued messages; the actor owns it."""

    def __init__(
        self, session_id: str, store: SessionStore, *, pid: int, host: str, cap: int | None = None
    ) -> None:
        self.session_id = session_id
        self.store = store
        self.pid = pid
        self.host = host
        self.cap = cap  # the session's queue keeps at most this many rows
        self._tail = trio.Event()  # the last write asked for has landed
        self._tail.set()
        self._written: dict[str, trio.Event] = {}

    def keep(
        self,
        nursery: trio.Nursery,
        msg: UserMessage,
        stored: Callable[[UserMessage, Dropped], None] | None = None,
    ) -> UserMessage:
        """`msg` with its queue key; its row is written in the background, in order.

        `msg.accepted` is ok once the row is committed (then `stored` hears what the cap
        dropped); a failed write refuses it. A write still going after WRITE_DEADLINE_SEC
        leaves it to the run. A message with a key is stored already and kept as it is."""
        if msg.queue_key is not None:
            return msg
        key = secrets.token_hex(8)
        queued = attrs.evolve(msg, queue_key=key)
        before, done = self._tail, trio.Event()
        self._tail = self._written[key] = done
        nursery.start_soon(self._write, queued, key, before, done, stored)
        return queued

    async def written(self, msg: UserMessage) -> None:
        """Until the message's row is in the store: its run's save must come after."""
        if msg.queue_key is not None:
            done = self._written.pop(msg.queue_key, None)
            if done is not None:
                await done.wait()

    async def ran(self, msg: UserMessage) -> None:
        """A message refused, or whose run was refused before its save, leaves the queue too, so
        a restart does not run it."""
        if msg.queue_key is not None:
            with trio.move_on_after(WRITE_DEADLINE_SEC, shield=True):
                try:
                    await self.store.unqueue(msg.queue_key)
                except NaviError as exc:
                    log.warning("session %s: unqueue failed: %s", self.session_id, exc)

    async def adopt(self, *, strict: bool = False) -> list[UserMessage]:
        """The messages nobody else runs (a dead process's, handed over, ours), oldest
        first. A failed read is none; `strict` (a run about to go behind what it finds)
        raises it as a StorageError instead: none is not the same as unknown."""
        try:
            rows = await self.store.adopt_queued(self.session_id, pid=self.pid, host=self.host)
        except NaviError as exc:
            log.warning("session %s: reading its queued messages failed: %s", self.session_id, exc)
            if not strict:
                return []
            if isinstance(exc, StorageError):
                raise
            raise StorageError(f"session {self.session_id!r}: {exc}") from exc
        if rows:
            log.info(
                "session %s: %d queued message(s) left by a crash run now",
                self.session_id,
                len(rows),
            )
        return [from_row(key, row) for key, row in rows]

    async def _write(
        self,
        msg: UserMessage,
        key: str,
        before: trio.Event,
        done: trio.Event,
        stored: Callable[[UserMessage, Dropped], None] | None,
    ) -> None:
        """Write `msg`'s row once the write before it landed; settle its acceptance."""
        acceptance = msg.accepted
        started = False
        try:
            await before.wait()
            started = True
            written = False
            with trio.move_on_after(WRITE_DEADLINE_SEC, shield=True):
                try:
                    dropped = await self.store.enqueue(
                        self.session_id,
                        key,
                        to_row(msg),
                        pid=self.pid,
                        host=self.host,
                        keep=self.cap,
                        claim=msg.key_claim(),
                    )
                    written = True
                except NaviError as exc:
                    # A storage failure is logged once by the store; the sender gets it.
                    quiet = isinstance(exc, (StorageError, DuplicateMessageError))
                    say = log.info if quiet else log.warning
                    say("session %s: queue write failed: %s", self.session_id, exc)
                    acceptance.fail(exc)
            if written:
                acceptance.ok()  # acknowledged only now
                if stored is not None:
                    stored(msg, dropped)
            elif not acceptance.settled:
                # Past the deadline: the row may still land (the store never withdraws
                # a write). The message runs, and is acknowledged once its run saves it.
                log.warning(
                    "session %s: queueing a message took over %g s",
                    self.session_id,
                    WRITE_DEADLINE_SEC,
                )
        finally:
            if not started:
                acceptance.fail(stopped_before_saving())  # cancelled before its write
            done.set()
