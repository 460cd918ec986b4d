"""An absolute time limit in REAL seconds, for tests on the autojump clock.

The harness's SQLite store works on a thread; while it does, every trio task looks
blocked, so an autojump clock jumps to the nearest deadline. A `trio.fail_after` limit
would then be reached at once. This limit is a `threading.Timer` instead: no trio
deadline, so the virtual clock only ever jumps to the code's own (nearest) deadlines,
in their order.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import trio


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
