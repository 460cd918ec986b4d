"""In-memory state of a session and the cache that loads, creates and saves it.

`SessionState` holds the display history and the LLM context, and how much of each is
stored already: `save()` appends only what is new. Each user message carries an ``id``,
the handle a rewind or a fork names it by (older ones: their place, `message_id`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from navi_trio.core.turn.tokens import Baseline
from navi_trio.errors import StorageError
from navi_trio.store.base import KeyClaim, SessionRow
from navi_trio.store.methods import SessionStore


def new_message_id() -> str:
    return "m-" + secrets.token_hex(6)


def message_id(message: dict[str, Any], index: int) -> str:
    """The id of the display history's message at `index` (``i<index>`` when it has none)."""
    mid = message.get("id")
    return mid if isinstance(mid, str) and mid else f"i{index}"


def open_turn(messages: list[dict[str, Any]], user_id: str) -> bool | None:
    """Whether the turn of the user message with id `user_id` is still open in the
    display history `messages`: nothing after it ended it (an answer, an error notice,
    another turn). None when no such message is there."""
    for index in range(len(messages) - 1, -1, -1):
        found = messages[index]
        if found.get("role") == "user" and found.get("id") == user_id:
            return not any(_ends_turn(later) for later in messages[index + 1 :])
    return None


def last_turn_open(messages: list[dict[str, Any]]) -> bool:
    """Whether the display history's last turn is still open: the last message that starts
    or ends a turn starts one (a user message, a wake-up's note). False with no turn."""
    for message in reversed(messages):
        if _ends_turn(message):
            return bool(message.get("role") != "assistant")
    return False


def last_turn_end(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The assistant message that ended the display history's last turn (None: that turn
    is open, or there is none)."""
    for message in reversed(messages):
        if _ends_turn(message):
            return message if message.get("role") == "assistant" else None
    return None


def _ends_turn(message: dict[str, Any]) -> bool:
    """A display message that a turn ends with, or another turn starts with: not a
    steered message, a tool call or its result, a plan."""
    role = message.get("role")
    if role == "user":
        return not message.get("steered")
    if role == "assistant":
        return not message.get("tool_calls") and not message.get("is_plan")
    return bool(message.get("wake"))  # a wake-up's note starts a turn


@attrs.define(eq=False)
class SessionState:
    row: SessionRow
    messages: list[dict[str, Any]]
    context: list[dict[str, Any]]
    saved_messages: int
    saved_context: int
    baseline: Baseline = attrs.field(factory=Baseline)
    # Set by the truthful-context check: compress before the next LLM call.
    needs_compression: bool = False
    # A write of it failed: the store may hold it or not (a connection cut as the commit
    # came back is an error for a write that landed), so this copy writes no more, and
    # the cache loads the session again for whoever asks next (`SessionCache`).
    unsure: bool = False
    # No lock here: one owner per session. In a runtime that owner is the session's
    # actor (it runs one turn or compaction at a time and queues the rest); across
    # processes it is the session lease (core/turn/lease.py).

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def profile_id(self) -> str:
        return self.row.profile_id

    @property
    def is_first_message(self) -> bool:
        return not any(m.get("role") == "user" for m in self.messages)

    def add(self, message: dict[str, Any], *, display: bool = True, context: bool = True) -> None:
        """Append a message to the display history and/or the context (not yet saved)."""
        stamped = {**message, "created_at": message.get("created_at", time.time())}
        if display:
            self.messages.append(stamped)
        if context:
            self.context.append(stamped)

    def mark(self) -> tuple[int, int]:
        """Where both lists end now, for `undo`."""
        return len(self.messages), len(self.context)

    def undo(self, mark: tuple[int, int]) -> None:
        """Drop what was added after `mark` and is not saved (a save that failed)."""
        messages, context = mark
        del self.messages[max(messages, self.saved_messages) :]
        del self.context[max(context, self.saved_context) :]


class SessionCache:
    """Loads sessions from the store once and keeps them in memory."""

    def __init__(self, store: SessionStore, default_profile: str) -> None:
        self._store = store
        self._default_profile = default_profile
        self._sessions: dict[str, SessionState] = {}

    async def get(self, session_id: str, *, profile_id: str | None = None) -> SessionState:
        """The session, loaded from the store or created when it does not exist."""
        state = self._sessions.get(session_id)
        if state is not None and not state.unsure:
            return state
        loaded = await self._store.load_session(session_id)
        if loaded is None:
            row = await self._store.create_session(
                session_id, profile_id=profile_id or self._default_profile
            )
            state = SessionState(
                row=row, messages=[], context=[], saved_messages=0, saved_context=0
            )
        else:
            state = SessionState(
                row=loaded.row,
                messages=list(loaded.messages),
                context=list(loaded.context),
                saved_messages=len(loaded.messages),
                saved_context=len(loaded.context),
            )
        # Another task may have loaded it while we awaited the store.
        cached = self._sessions.get(session_id)
        if cached is not None and not cached.unsure:
            return cached
        self._sessions[session_id] = state
        return state

    def forget(self, session_id: str) -> None:
        """Drop a session from memory (it reloads from the store when used again). Callers make
        sure no run or compaction of it is live: their saves must go to one in-memory state."""
        self._sessions.pop(session_id, None)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    async def save(
        self,
        state: SessionState,
        *,
        durable: bool = True,
        dequeue: str | None = None,
        renew: float | None = None,
        claim: KeyClaim | None = None,
        owes_end: bool = False,
    ) -> bool:
        """Append what is new in both lists, in one store transaction; whether it wrote.

        `durable=False`: committed, not flushed yet; `dequeue`: the queued message leaves the
        queue in that transaction; `renew`: the lease is renewed in it; `claim`: the user
        message's client key is taken in it (`DuplicateMessageError`: nothing stored);
        `owes_end`: the lease owes the session this turn's end from then on (store/base.py),
        written even with nothing new: a turn started again on a message saved already. A
        storage failure leaves the state `unsure` and further saves refused: the failed
        write may have landed."""
        new_messages = state.messages[state.saved_messages :]
        new_context = state.context[state.saved_context :]
        if not new_messages and not new_context and not owes_end:
            return False
        with _writing(state):
            await self._store.append(
                state.id,
                messages=new_messages,
                context=new_context,
                durable=durable,
                dequeue=dequeue,
                renew=renew,
                claim=claim,
                owes_end=owes_end,
            )
            state.saved_messages += len(new_messages)
            state.saved_context += len(new_context)
        return True

    async def replace_context(self, state: SessionState, context: list[dict[str, Any]]) -> None:
        """Compression: the only rewrite. Unsaved display messages are saved first."""
        await self.save(state)
        with _writing(state):
            await self._store.replace_context(state.id, context)
            state.context = list(context)
            state.saved_context = len(context)

    async def set_profile(self, state: SessionState, profile_id: str) -> None:
        await self._store.update_session(state.id, profile_id=profile_id)
        state.row = attrs.evolve(state.row, profile_id=profile_id)


@contextmanager
def _writing(state: SessionState) -> Iterator[None]:
    """A write of `state`: refused when it is unsure, made unsure by a storage failure.
    Shielded: a stop landing mid-write would leave the counters behind a write that
    still lands (the store never withdraws one), and the next save would repeat it."""
    if state.unsure:
        raise StorageError(
            f"session {state.id!r}: an earlier write of this turn failed and may have "
            "landed all the same; nothing more is written until the session is read again",
            session_id=state.id,
        )
    with trio.CancelScope(shield=True):
        try:
            yield
        except StorageError:
            state.unsure = True
            raise
