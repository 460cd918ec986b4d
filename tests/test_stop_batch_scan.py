"""Stopping a parallel batch of commands: every group dies, and the kills that look for
strays at the same moment share one pass over /proc (one scan per batch, not per call).

Rules: real processes, Linux /proc; PIDs come from the commands' own output, deaths are
checked through pidfds; no sleeps; an absolute `fail_after`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from navi_trio.tools import procs, proctree
from navi_trio.tools.procs import _spawn

pytestmark = [
    pytest.mark.slow,  # its tests start processes
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or not Path("/proc/self/stat").exists(),
        reason="needs Linux /proc",
    ),
]
N = 3
TIMEOUT = 30


def _alive(pid: int) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    os.close(fd)
    stat = proctree._stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


async def test_a_stopped_batch_of_sleeps_dies_whole_with_one_first_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans: list[int] = []
    real = proctree.find_strays_many

    def counting(queries: list[proctree.Query], tag_var: str) -> list[proctree.Strays]:
        scans.append(len(queries))
        return real(queries, tag_var)

    monkeypatch.setattr(_spawn, "find_strays_many", counting)
    pids: list[int] = []
    started = trio.Event()

    def on_line(line: str) -> None:
        pids.extend(int(p) for p in line.split())
        if len(pids) == 2 * N:
            started.set()

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            for _ in range(N):
                nursery.start_soon(
                    lambda: procs.run_command(
                        "sleep 60 & echo $$ $!; wait",
                        cwd=tmp_path,
                        time_limit=60,
                        on_line=on_line,
                    )
                )
            await started.wait()
            assert all(_alive(p) for p in pids)
            nursery.cancel_scope.cancel()  # the stop
    assert not [p for p in pids if _alive(p)]  # every shell and every sleep is gone
    assert scans[0] == N  # the first look for strays: one pass for the whole batch
    assert len(scans) < 2 * N


def test_one_pass_answers_each_leader_as_its_own_scan() -> None:
    me = os.getpid()
    since = proctree.start_time(me)
    queries: list[proctree.Query] = [(me, None, since), (None, "no-such-tag", since)]
    many = proctree.stray_pids_many(queries, "NAVI_PROC_TAG_TEST")
    one = [proctree.stray_pids(leader, "NAVI_PROC_TAG_TEST", tag, s) for leader, tag, s in queries]
    assert many == one


@pytest.mark.parametrize(("processes", "threaded"), [(10, False), (10**6, True)])
async def test_a_scan_of_few_processes_runs_without_a_thread_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: int, threaded: bool
) -> None:
    hops: list[object] = []
    real = trio.to_thread.run_sync

    async def counting(fn: object, *args: object, **kw: object) -> object:
        hops.append(fn)
        return await real(fn, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(_spawn, "process_count", lambda: processes)
    monkeypatch.setattr(trio.to_thread, "run_sync", counting)
    with trio.fail_after(TIMEOUT):
        process = await trio.lowlevel.open_process(["sleep", "60"], start_new_session=True)
        try:
            strays = await _spawn._find_strays(process, "t", None)
            strays.close()
        finally:
            await procs.kill_group(process, 1.0, "t")
    assert (proctree.find_strays_many in hops) is threaded
