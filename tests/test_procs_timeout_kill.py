"""A command that times out while its leader ignores SIGTERM (issue 17 "Missing tests"):
`run_command` sends the group SIGTERM, waits the grace, then SIGKILLs the whole group,
grandchildren included. The stop path (frozen and killed at once) is tested in
tests/test_tools_terminal.py; this is the graceful path of a timeout.

Rules: those of tests/test_tools_terminal.py: real processes, no sleeps, deaths seen
through pidfds. The MockClock moves only by hand (the timeout, then the grace, once the
processes are up), so no step depends on the machine's speed; a real-time limit bounds
the test.
"""

from __future__ import annotations

import os
import select
import shlex
import signal
from pathlib import Path

import pytest
import trio
import trio.testing
from kvfake import PidWatch, is_gone, pids_in
from realtime import real_time_limit

from navi_trio.tools.procs import CommandResult, run_command

pytestmark = pytest.mark.slow  # its tests start processes

TIME_LIMIT = 5.0
GRACE = 2.0
STUCK_SEC = 10.0  # real seconds of nothing to do before the clock moves on its own


def _command(fifo: Path) -> str:
    """The leader survives SIGTERM (its trap only says so, into `fifo`); its child and a
    grandchild ignore it. The grandchild is orphaned (its parent exits) with an empty
    environment: the look for strays cannot find it, only the group's SIGKILL reaches
    it. Each prints "pid N" (the leader last)."""
    return (
        f"trap 'echo got TERM > {shlex.quote(str(fifo))}' TERM; "
        "(trap '' TERM; exec sleep 300) & echo pid $!; "
        "(trap '' TERM; env -i sleep 300 & echo pid $!); "
        "echo pid $$; "
        "while :; do wait; done"
    )


def _exited(watch: PidWatch) -> list[int]:
    """The watched pids that exited by now (a pidfd is readable once its process is gone)."""
    ready, _, _ = select.select(watch.fds, [], [], 0)
    return [pid for pid, fd in zip(watch.pids, watch.fds, strict=True) if fd in ready]


async def test_a_timed_out_group_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    fifo = tmp_path / "term"
    os.mkfifo(fifo)
    # Read and write: the leader's trap never blocks on opening it, our read waits.
    told = trio.lowlevel.FdStream(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
    lines: list[str] = []
    up = trio.Event()
    done: list[CommandResult] = []
    # As a safety net only: a kill that never ends (a broken one) lets the clock move
    # after STUCK_SEC idle real seconds, so the test fails instead of hanging.
    mock_clock.autojump_threshold = STUCK_SEC

    def on_line(line: str) -> None:
        lines.append(line)
        if len(pids_in([ln for ln in lines if ln.startswith("pid ")])) == 3:
            up.set()

    async def run() -> None:
        result = await run_command(
            _command(fifo), cwd=tmp_path, time_limit=TIME_LIMIT, on_line=on_line, grace=GRACE
        )
        done.append(result)

    with real_time_limit(30):
        async with told, trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await up.wait()
            pids = pids_in([ln for ln in lines if ln.startswith("pid ")])
            watch = PidWatch(pids)
            try:
                mock_clock.jump(TIME_LIMIT)  # the time limit: SIGTERM to the group
                assert b"got TERM" in await told.receive_some()
                mock_clock.jump(GRACE - 0.1)
                await trio.testing.wait_all_tasks_blocked()
                assert not done and _exited(watch) == [], lines  # all of them lived on
                mock_clock.jump(0.1)  # the grace is over: SIGKILL to the whole group
                await watch.wait_exited()
            except BaseException:
                os.killpg(pids[-1], signal.SIGKILL)  # failed: leave nothing behind
                raise
            finally:
                watch.close()
    assert all(is_gone(p) for p in pids), pids
    (result,) = done
    assert result.timed_out and result.exit_code is None
    assert "timed out after 5 s" in result.status_text()
