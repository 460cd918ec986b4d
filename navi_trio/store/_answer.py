"""A store job's way back: its worker thread's answer to the trio task waiting for it.

Both stores run jobs on threads of their own; the caller's task waits in `wait` and the
thread's `answer` reschedules it through the caller's trio token, with no event or
parking lot made per job. A caller cancelled while it waits stops waiting; the job is
not withdrawn, and its answer finds no one.
"""

from __future__ import annotations

from typing import Any

import trio


class ThreadAnswer:
    """The answer part of a job, made in the caller's trio run."""

    def __init__(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self._waiter: trio.lowlevel.Task | None = None  # the caller, while it waits

    def answer(self) -> None:
        """From the worker thread: wake the caller (once the job's write is committed)."""
        try:
            self.token.run_sync_soon(self._wake)
        except trio.RunFinishedError:
            pass  # the caller's trio run is gone; nobody is waiting

    async def wait(self) -> None:
        """Until the worker has answered; called right after the job is queued (no
        checkpoint in between, so the answer cannot have come)."""
        self._waiter = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _: Any) -> trio.lowlevel.Abort:
        self._waiter = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _wake(self) -> None:
        # On the trio thread (`answer`): the caller, if it still waits, goes on.
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            trio.lowlevel.reschedule(waiter)
