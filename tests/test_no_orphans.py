"""No orphans, end to end: a background `terminal run` whose shell spawns children and
grandchildren leaves no process behind when its task is cancelled (`tasks cancel`) or
when the daemon shuts down; an inline run is killed with its group when the run is
stopped.

Rules: real processes, real time, every test bounded by `trio.fail_after`, no sleeps:
the shell reports its PIDs through a FIFO the test reads, and deaths are observed
through pidfds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
from kvfake import PidWatch, is_gone
from unsandboxed import ALLOW_EXEC, FULL

from navi_trio.testing import open_harness

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 30


def spawner(fifo: Path) -> str:
    # The shell, two children and a grandchild, each PID written to the FIFO.
    return (
        f"exec 3>{fifo}; echo $$ >&3; sleep 300 & echo $! >&3; "
        "(sleep 300 & echo $! >&3; wait) & echo $! >&3; wait"
    )


async def read_pids(fifo: Path, count: int) -> list[int]:
    def read() -> list[int]:
        with open(fifo, encoding="ascii") as f:
            return [int(f.readline()) for _ in range(count)]

    return await trio.to_thread.run_sync(read, abandon_on_cancel=True)


def run_call(fifo: Path, **extra: Any) -> dict[str, Any]:
    args = {"action": "run", "command": spawner(fifo), **extra}
    return {"tool_calls": [{"name": "terminal", "arguments": args}]}


async def test_cancelling_a_background_task_kills_its_whole_process_group(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    replies = [run_call(fifo, background=True), {"text": "started"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles={"general": ALLOW_EXEC}) as h:
            await h.turn("s1", "hi", **FULL)
            (job,) = h.runtime.supervisor.list_jobs("s1")
            pids = await read_pids(fifo, 4)
            watch = PidWatch(pids)
            try:
                assert h.runtime.supervisor.cancel("s1", job.task_id)
                await watch.wait_exited()
            finally:
                watch.close()
            await job.done.wait()
            assert job.status == "cancelled"
    assert all(is_gone(p) for p in pids), pids


async def test_daemon_shutdown_kills_background_and_inline_process_groups(
    tmp_path: Path,
) -> None:
    bg_fifo, inline_fifo = tmp_path / "bg", tmp_path / "inline"
    os.mkfifo(bg_fifo)
    os.mkfifo(inline_fifo)
    replies = [run_call(bg_fifo, background=True), run_call(inline_fifo), {"text": "never"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles={"general": ALLOW_EXEC}) as h:
            s = await h.session("s1")
            s.send("hi", **FULL)
            pids = await read_pids(bg_fifo, 4) + await read_pids(inline_fifo, 4)
            watch = PidWatch(pids)
            assert not any(is_gone(p) for p in pids)
        # Leaving the runtime is the daemon shutting down, mid-run and mid-job.
        try:
            await watch.wait_exited()
        finally:
            watch.close()
    assert all(is_gone(p) for p in pids), pids
