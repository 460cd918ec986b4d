"""No orphans, even for processes that leave the process group with ``setsid``.

Each command here starts a grandchild that calls ``setsid`` (the shell's ``setsid``
or Python's ``os.setsid()`` after a fork) and whose parent exits at once, so it is
neither in the command's process group nor below it by parent id. It must be gone
after a stop, a timeout, a finished command, a background task cancel, a persistent
process's shutdown and the runtime's shutdown.

Rules: real processes; PIDs come through a FIFO the test reads, deaths are observed
through pidfds (`PidWatch`), no sleeps. The timeout test runs on a MockClock moved by
hand once the processes exist, so it does not depend on speed; the others are bounded
by a real `trio.fail_after`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from kvfake import PidWatch, is_gone, make_ctx
from unsandboxed import ALLOW_EXEC, FULL

from navi_trio.testing import open_harness
from navi_trio.tools.code_exec import CodeExecTool
from navi_trio.tools.procs import CommandResult, ProcessPool, run_command
from navi_trio.tools.terminal import TerminalTool

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 30


def escaper(fifo: Path, then: str = "sleep 300", ready: Path | None = None) -> str:
    # The shell writes its pid, then a subshell starts `setsid sh` and exits at once:
    # the setsid'd sh (which becomes sleep) is orphaned, in a session of its own.
    # With `ready` (a FIFO), the shell goes on only once the grandchild is there.
    told = f"echo ok >{ready}; " if ready else ""
    wait = f"read _ <{ready}; " if ready else ""
    return (
        f"exec 3>{fifo}; echo $$ >&3; "
        f"(setsid sh -c 'echo $$ >&3; {told}exec sleep 300' >/dev/null 2>&1 &); {wait}{then}"
    )


def make_fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


async def read_pids(fifo: Path, count: int) -> list[int]:
    def read() -> list[int]:
        with open(fifo, encoding="ascii") as f:
            return [int(f.readline()) for _ in range(count)]

    return await trio.to_thread.run_sync(read, abandon_on_cancel=True)


def session_of(pid: int) -> int:
    return os.getsid(pid)


async def assert_all_die(watch: PidWatch) -> None:
    try:
        await watch.wait_exited()
    finally:
        watch.close()
    assert all(is_gone(p) for p in watch.pids), watch.pids


async def test_stop_kills_a_setsid_grandchild(tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "pids")
    ctx = make_ctx(tmp_path)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                TerminalTool().execute, {"action": "run", "command": escaper(fifo)}, ctx
            )
            leader, stray = await read_pids(fifo, 2)
            assert session_of(stray) != session_of(leader)  # it really left
            watch = PidWatch([leader, stray])
            nursery.cancel_scope.cancel()  # what Stop does to an inline call
        await assert_all_die(watch)


async def test_stop_kills_a_setsid_child_that_emptied_its_environment(tmp_path: Path) -> None:
    # No tag to find it by: it is found below the leader by parent id.
    fifo = make_fifo(tmp_path / "pids")
    command = (
        f"exec 3>{fifo}; echo $$ >&3; "
        "setsid env -i sh -c 'echo $$ >&3; exec sleep 300' >/dev/null 2>&1 & sleep 300"
    )
    ctx = make_ctx(tmp_path)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(TerminalTool().execute, {"action": "run", "command": command}, ctx)
            leader, stray = await read_pids(fifo, 2)
            assert session_of(stray) != session_of(leader)
            watch = PidWatch([leader, stray])
            nursery.cancel_scope.cancel()
        await assert_all_die(watch)


async def test_timeout_kills_a_setsid_grandchild(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    fifo = make_fifo(tmp_path / "pids")
    results: list[CommandResult] = []

    async def run() -> None:
        results.append(await run_command(escaper(fifo), cwd=tmp_path, time_limit=5.0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        pids = await read_pids(fifo, 2)
        mock_clock.jump(5.0)  # the processes exist: now the time limit passes
    assert results[0].timed_out
    # run_command returns only once every stray is dead: nothing to wait for (a wait
    # here could hang on the virtual clock instead of failing).
    assert all(is_gone(p) for p in pids), pids


async def test_a_finished_command_leaves_no_setsid_grandchild(tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "pids")
    ready = make_fifo(tmp_path / "ready")
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            results: list[CommandResult] = []

            async def run() -> None:
                command = escaper(fifo, then="true", ready=ready)
                results.append(await run_command(command, cwd=tmp_path, time_limit=60))

            nursery.start_soon(run)
            pids = await read_pids(fifo, 2)
        assert results[0].exit_code == 0
    # run_command returns only once every stray is dead: no waiting here.
    assert all(is_gone(p) for p in pids), pids


async def test_stop_kills_a_python_grandchild_that_called_setsid(tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "pids")
    code = (
        "import os, time\n"
        f"fifo = open({str(fifo)!r}, 'w')\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        print(os.getpid(), file=fifo, flush=True)\n"
        "        time.sleep(300)\n"
        "    os._exit(0)\n"
        "print(os.getpid(), file=fifo, flush=True)\n"
        "time.sleep(300)\n"
    )
    ctx = make_ctx(tmp_path)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(CodeExecTool().execute, {"code": code}, ctx)
            pids = await read_pids(fifo, 2)
            assert session_of(pids[0]) != session_of(pids[1])
            watch = PidWatch(pids)
            nursery.cancel_scope.cancel()
        await assert_all_die(watch)


async def test_pool_shutdown_kills_a_setsid_grandchild(tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "pids")
    pool = ProcessPool()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            await pool.open("s1", escaper(fifo), tmp_path)
            watch = PidWatch(await read_pids(fifo, 2))
            nursery.cancel_scope.cancel()
        await assert_all_die(watch)


def run_call(fifo: Path, **extra: Any) -> dict[str, Any]:
    args = {"action": "run", "command": escaper(fifo), **extra}
    return {"tool_calls": [{"name": "terminal", "arguments": args}]}


async def test_cancelling_a_background_task_kills_a_setsid_grandchild(tmp_path: Path) -> None:
    fifo = make_fifo(tmp_path / "pids")
    replies = [run_call(fifo, background=True), {"text": "started"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles={"general": ALLOW_EXEC}) as h:
            await h.turn("s1", "hi", **FULL)
            (job,) = h.runtime.supervisor.list_jobs("s1")
            watch = PidWatch(await read_pids(fifo, 2))
            assert h.runtime.supervisor.cancel("s1", job.task_id)
            await job.done.wait()
            assert job.status == "cancelled"
            await assert_all_die(watch)


async def test_runtime_shutdown_kills_setsid_grandchildren(tmp_path: Path) -> None:
    bg_fifo = make_fifo(tmp_path / "bg")
    inline_fifo = make_fifo(tmp_path / "inline")
    replies = [run_call(bg_fifo, background=True), run_call(inline_fifo), {"text": "never"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles={"general": ALLOW_EXEC}) as h:
            s = await h.session("s1")
            s.send("hi", **FULL)
            pids = await read_pids(bg_fifo, 2) + await read_pids(inline_fifo, 2)
            watch = PidWatch(pids)
        # Leaving the runtime is the daemon shutting down, mid-run and mid-job.
        await assert_all_die(watch)
