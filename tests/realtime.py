"""An absolute time limit in REAL seconds, for tests on the autojump clock, and a
paced autojump clock for tests whose code also works on threads.

The harness's SQLite store works on a thread; while it does, every trio task looks
blocked, so an autojump clock jumps to the nearest deadline. A `trio.fail_after` limit
would then be reached at once. `real_time_limit` is a `threading.Timer` instead: no trio
deadline, so the virtual clock only ever jumps to the code's own (nearest) deadlines,
in their order.

Jumping to the nearest deadline is still wrong when a thread's work takes long: on a
threshold of 0 the clock jumps at every pass of the run loop while the thread works, from
deadline to deadline (a lease renewal every 10 s, then the next ...), and on a loaded
machine a far deadline the test never meant to reach (a sub-agent's 300 s, a hello's)
comes before the work is done. `paced` makes the clock jump only after IDLE_SEC of real
time with every task waiting, and by one virtual second at most (a ticker's deadline):
a second passes per IDLE_SEC of work on threads, while a wait with nothing running
still takes no real time to speak of.

Pacing alone still lets the clock run ahead when a thread waits for a CPU longer than
IDLE_SEC (more test processes than cores): `held` makes the clock decline every jump
while a store job or a `trio.to_thread.run_sync` call the test's code awaits is still
in flight, so virtual time passes only while trio itself has nothing left to wait for.
The count is kept by wrappers installed for the block, in the trio thread only; the
product pays nothing.
"""

from __future__ import annotations

import faulthandler
import functools
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import trio
import trio._path
import trio.testing

from navi_trio.store.sqlite import SQLiteStore

IDLE_SEC = 0.01  # real seconds every task must wait before the paced clock jumps


@contextmanager
def real_time_limit(seconds: float) -> Iterator[None]:
    """Cancel the block after `seconds` of real time and fail the test."""
    token = trio.lowlevel.current_trio_token()

    def expired() -> None:
        # Every thread's stack first, on the test's captured stderr: a worker thread
        # stuck in a call shows here, and the trio tasks' in the cancel's traceback.
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        token.run_sync_soon(scope.cancel)

    with trio.CancelScope() as scope:
        timer = threading.Timer(seconds, expired)
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
    if scope.cancelled_caught:
        raise AssertionError(f"the test took more than {seconds:g} real seconds")


async def _tick(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """A deadline every virtual second: no autojump goes further than that."""
    task_status.started()
    while True:  # noqa: ASYNC110 -- the deadlines are the point, not a wait
        await trio.sleep(1)


class ThreadJobs:
    """How many thread jobs trio tasks are awaiting now (read and written in the trio
    thread only: a wrapper counts a call from its start to its return)."""

    def __init__(self) -> None:
        self.waiting = 0

    def counted(self, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(call)
        async def awaiting(*args: Any, **kwargs: Any) -> Any:
            self.waiting += 1
            try:
                return await call(*args, **kwargs)
            finally:
                self.waiting -= 1

        return awaiting


@contextmanager
def held(clock: trio.testing.MockClock, threshold: float = IDLE_SEC) -> Iterator[ThreadJobs]:
    """`clock` autojumps after `threshold` of idle real time, and never while a thread
    job is in flight: a SQLite store's job, or `trio.to_thread.run_sync` (trio.Path's
    too). A job's answer wakes the run loop, so no jump comes between its end and its
    caller's return."""
    jobs = ThreadJobs()
    jump = clock._autojump

    def autojump() -> None:  # called by trio's run loop, after `threshold` of idle
        if not jobs.waiting:
            jump()

    to_thread = jobs.counted(trio.to_thread.run_sync)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trio.to_thread, "run_sync", to_thread)
        patch.setattr(trio._path, "run_sync", to_thread)  # trio.Path imported it by name
        patch.setattr(SQLiteStore, "_run", jobs.counted(SQLiteStore._run))
        patch.setattr(clock, "_autojump", autojump)
        clock.autojump_threshold = threshold
        yield jobs


@asynccontextmanager
async def paced(clock: trio.testing.MockClock, seconds: float) -> AsyncIterator[None]:
    """The block on `clock` paced and held (see the module), within `seconds` of real
    time."""
    with held(clock), real_time_limit(seconds):
        async with trio.open_nursery() as ticker:
            await ticker.start(_tick)
            yield
            ticker.cancel_scope.cancel()
