"""A run's mailbox (core/turn/steering.py says what goes in): `Injections` holds the messages
steered into a running turn (`SteerItem`) and the mark that background notes wait; the
turn takes both in before its next LLM call, and `prefill()` lets a steer that comes
before the model's first chunk drop that call so the turn asks again with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from navi_trio.core.turn.acceptance import Acceptance


@attrs.frozen
class SteerItem:
    """A steered message waiting for the turn's next LLM call."""

    text: str
    queue_key: str | None
    accepted: Acceptance
    cwd: Path | None = None
    # Until its queue row is in the store (its save moves the row: the row comes first).
    written: Callable[[], Awaitable[None]] | None = None
    # The session actor's own message object, handed back when the turn did not take it.
    origin: Any = None


class Injections:
    """The mailbox of one run: steered messages, and background notes that wait. `prefill()`
    wraps one LLM call: a steer arriving before the first chunk cancels it, to ask again."""

    def __init__(self) -> None:
        self._messages: list[SteerItem] = []
        self.notes_due = False
        self._prefill: trio.CancelScope | None = None

    def steer(self, item: SteerItem) -> None:
        self._messages.append(item)
        self._restart()

    def notes(self) -> None:
        """Background results wait in the store: take them in before the next call."""
        self.notes_due = True
        self._restart()

    @property
    def pending(self) -> bool:
        return bool(self._messages) or self.notes_due

    def take(self) -> list[SteerItem]:
        taken, self._messages = self._messages, []
        return taken

    def keys(self) -> set[str | None]:
        """The queue keys of the steered messages waiting here."""
        return {item.queue_key for item in self._messages}

    def discard(self, keys: set[str]) -> None:
        """Steered messages the queue's cap dropped before the turn took them in."""
        self._messages = [item for item in self._messages if item.queue_key not in keys]

    def leftover(self) -> list[SteerItem]:
        """The steered messages the turn never took in (it ended first)."""
        return self.take()

    def first_chunk(self) -> None:
        """The model began to answer: from now on a steer waits for the next call."""
        self._prefill = None

    @contextmanager
    def prefill(self) -> Iterator[trio.CancelScope]:
        """Around one LLM call: cancelled by a steer that comes before its first chunk."""
        scope = trio.CancelScope()
        self._prefill = scope
        try:
            with scope:
                yield scope
        finally:
            if self._prefill is scope:
                self._prefill = None

    def _restart(self) -> None:
        if self._prefill is not None:
            self._prefill.cancel()
            self._prefill = None
