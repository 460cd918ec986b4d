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
"""

from __future__ import annotations

import faulthandler
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import trio
import trio.testing

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


@asynccontextmanager
async def paced(clock: trio.testing.MockClock, seconds: float) -> AsyncIterator[None]:
    """The block on `clock` paced (see the module), within `seconds` of real time."""
    clock.autojump_threshold = IDLE_SEC
    with real_time_limit(seconds):
        async with trio.open_nursery() as ticker:
            await ticker.start(_tick)
            yield
            ticker.cancel_scope.cancel()
