"""The held, paced autojump clock of tests/realtime.py stands still while a thread job
the test's code awaits is in flight, however long the job takes in real time.

Each test's job is a thread that waits for an event, set only once trio's run loop
has gone idle for the clock's threshold (the moment it would autojump) IDLE_PASSES
times: a thread slowed as by a loaded machine, and no real sleep in the test. The
clock must not have moved meanwhile, nor reached a deadline the code set.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import trio
import trio.testing
from realtime import paced

from navi_trio.store.sqlite import SQLiteStore

IDLE_PASSES = 5  # the run loop's idle thresholds the job outlasts
DEADLINE = 3.0  # virtual seconds: a paced clock jumps one a pass, so this came before
LIMIT = 30  # real seconds


class IdlePasses(trio.abc.Instrument):
    """Counts the run loop's waits that ran their whole autojump threshold; sets `seen`
    (a threading.Event, for a thread to wait on) after `count` of them."""

    def __init__(self, clock: trio.testing.MockClock, count: int) -> None:
        self.clock, self.count, self.passes = clock, count, 0
        self.seen = threading.Event()

    def after_io_wait(self, timeout: float) -> None:
        if timeout == self.clock.autojump_threshold:
            self.passes += 1
            if self.passes >= self.count:
                self.seen.set()


async def _outlasts(clock: trio.testing.MockClock, job: Any) -> None:
    """`job(wait)` (a thread job that calls `wait`) outlasts IDLE_PASSES idle passes
    on the paced clock, within DEADLINE, and virtual time does not move meanwhile."""
    passes = IdlePasses(clock, IDLE_PASSES)
    trio.lowlevel.add_instrument(passes)
    try:
        start = trio.current_time()
        with trio.move_on_after(DEADLINE) as deadline:
            await job(passes.seen.wait)
        assert not deadline.cancelled_caught, f"the clock ran {DEADLINE} s ahead of a job"
        assert passes.passes >= IDLE_PASSES
        assert trio.current_time() == start
    finally:
        passes.seen.set()  # the thread ends, also when the clock ran ahead
        trio.lowlevel.remove_instrument(passes)


async def test_the_clock_stands_still_while_a_to_thread_job_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def job(wait: Any) -> None:
        await trio.to_thread.run_sync(wait, abandon_on_cancel=True)

    async with paced(autojump_clock, LIMIT):
        await _outlasts(autojump_clock, job)


async def test_the_clock_stands_still_while_a_store_job_runs(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with paced(autojump_clock, LIMIT), SQLiteStore.open(tmp_path / "navi.db") as store:

        async def job(wait: Any) -> None:
            await store.run_raw_for_tests("hold the worker", lambda db: wait())

        await _outlasts(autojump_clock, job)
