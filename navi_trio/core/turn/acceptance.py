"""Whether a user message was taken: the one-shot outcome its sender waits for.

A message is accepted once committed (saved by its run, or stored in the durable
queue); only then may the daemon answer ``ok``. Anything that stops it short settles
the acceptance with that error, and nothing is stored. The first outcome wins: the run
checks `failed` before its save, so a message reported refused is never stored.
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
