"""Whether a user message was taken: the one-shot outcome its sender waits for.

A message is *accepted* once it is committed to the store: saved into the history by its
run (`Agent._accept`), or stored in the session's durable queue (core/session/queued.py). Only
then may the daemon answer ``ok``: a crash after the ok cannot lose it. Everything that
stops a message short of that (the session busy in another process, a full disk, a
damaged database, a shutdown) settles the acceptance with the error instead, and the
sender answers with that error's code. Nothing is stored for a refused message.

One-shot: the first outcome wins. A run that fails after its message was saved does not
turn the ok into an error, and a refusal (a wait that timed out) is final: the run checks
`failed` before its save, so a message its sender was told was refused is never stored.
(The one gap: a save already on the store's thread when the wait gives up cannot be
withdrawn. The wait's bound, NAVI_MESSAGE_ACCEPT_TIMEOUT_SEC, is far above any save's,
so only a store stuck for minutes gets there.)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from navi_trio.errors import UnavailableError


class Acceptance:
    """Set once: `ok()` (committed) or `fail(error)` (refused, with why)."""

    def __init__(self) -> None:
        self._settled = trio.Event()
        self.error: BaseException | None = None
        # Accepted into the session's queue (it waits for a turn of its own), though it
        # came to run at once: messages queued before it run first.
        self.queued = False

    @property
    def settled(self) -> bool:
        return self._settled.is_set()

    @property
    def failed(self) -> bool:
        return self.error is not None

    def ok(self) -> bool:
        """The message is committed. False when it was already settled."""
        if self._settled.is_set():
            return False
        self._settled.set()
        return True

    def fail(self, error: BaseException) -> bool:
        """The message was refused. False when it was already settled (the first wins)."""
        if self._settled.is_set():
            return False
        self.error = error
        self._settled.set()
        return True

    async def wait(
        self,
        timeout: float = math.inf,  # noqa: ASYNC109 - the refusal on timeout is ours to set
        on_timeout: Callable[[], BaseException] | None = None,
    ) -> None:
        """Until settled; raises the refusal's error. Past `timeout` seconds the
        acceptance is refused with `on_timeout()` (when given), which is then raised."""
        with trio.move_on_after(timeout):
            await self._settled.wait()
        if not self._settled.is_set():
            if on_timeout is None:
                raise trio.TooSlowError
            self.fail(on_timeout())
        if self.error is not None:
            raise self.error


def stopped_before_saving() -> UnavailableError:
    """The refusal of a message whose run was cancelled before its save (a shutdown)."""
    return UnavailableError("the daemon is stopping: the message was not saved; send it again")
