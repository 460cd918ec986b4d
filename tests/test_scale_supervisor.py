"""`navi serve --workers N`'s supervisor (cli/workers.py): its workers end with it, even
when it is SIGKILLed, and a worker that keeps dying is started again after 0.5 s, then
1 s, 2 s … (back to 0.5 s after one that lived a minute).

The first through real processes on real PostgreSQL (the workers' ends awaited through
pidfds, under `trio.fail_after`); the second on trio's autojump clock, with workers that
are stand-ins (the supervisor's own loop, no process).
"""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
from daemons import no_plan_config
from pg_server import pg_url_with_schema as pg_url_with_schema
from reliability import clean_env
from test_scale_workers import children, supervisor

from navi_trio.cli.workers import Supervisor, _Worker

TIMEOUT = 180


@pytest.mark.slow
async def test_workers_end_with_their_supervisor_even_a_killed_one(
    tmp_path: Path, pg_url: str
) -> None:
    env = {**clean_env(tmp_path, NAVI_CONFIG=str(no_plan_config(tmp_path))), "NAVI_DB": pg_url}
    nobody = "http://127.0.0.1:9"  # no model is asked anything here
    with trio.fail_after(TIMEOUT):
        async with supervisor(env, nobody, tmp_path / "supervisor.log") as (proc, _, _):
            workers = children(proc.pid)
            assert len(workers) == 2, workers
            ends = [os.pidfd_open(pid) for pid in workers]
            try:
                proc.send_signal(signal.SIGKILL)
                for fd in ends:  # readable once that worker has ended
                    await trio.lowlevel.wait_readable(fd)
            finally:
                for fd in ends:
                    os.close(fd)


class DyingWorker:
    """A worker process that lives `life` seconds, then exits with code 1."""

    def __init__(self, life: float) -> None:
        self.pid = 4242
        self.life = life
        self.returncode: int | None = None

    async def wait(self) -> int:
        await trio.sleep(self.life)
        self.returncode = 1
        return 1


class Flaky(Supervisor):
    """A supervisor whose worker lives each of `lives` in turn; it notes each start."""

    def __init__(self, lives: list[float]) -> None:
        super().__init__(["navi"], 1, io.StringIO())
        self.lives = lives
        self.starts: list[float] = []

    async def _start(self, worker: _Worker, port: int) -> Any:
        self.starts.append(trio.current_time())
        worker.proc = DyingWorker(self.lives.pop(0))  # type: ignore[assignment]
        self.stopping = not self.lives  # the last one: no start after it
        return True


async def test_a_dying_worker_is_started_again_after_half_a_second_then_doubling(
    autojump_clock: Any,
) -> None:
    flaky = Flaky([0, 0, 0, 0, 60, 0, 0])
    with trio.fail_after(1000):
        await flaky._keep(flaky.workers[0], 8765, trio.Event())
    gaps = [after - before for before, after in zip(flaky.starts, flaky.starts[1:], strict=False)]
    # Died at once: 0.5, 1, 2, 4; then one lived 60 s: 0.5 again after it, then 1.
    assert gaps == pytest.approx([0.5, 1.0, 2.0, 4.0, 60.5, 1.0])
