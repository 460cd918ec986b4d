"""The throwaway PostgreSQL server (navi_trio.testing.postgres) does not outlive the
process that started it, however that process ends.

Real processes on real time, so slow; each wait is bounded (`trio.fail_after`) and
event-driven (a pidfd becomes readable when its process ends).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from functools import partial
from subprocess import PIPE

import pytest
import trio

from navi_trio.testing.postgres import PgServer, PgUnavailable, find_binaries

pytestmark = pytest.mark.slow

BOUND = 60  # a start (initdb included) on a loaded machine; a fast shutdown takes far less

# Starts a server and says its pid, its watcher's pid and its folder, then waits to be killed.
STARTER = """\
import sys
from navi_trio.testing.postgres import PgServer
server = PgServer.start()
print(server.process.pid, server._running.watcher.pid, server.folder, flush=True)
sys.stdin.read()
"""


async def _ended(pidfd: int) -> None:
    await trio.lowlevel.wait_readable(pidfd)


async def test_a_server_stops_and_its_folder_goes_when_its_starter_is_killed() -> None:
    if find_binaries() is None:
        pytest.skip("no PostgreSQL server binaries (initdb, postgres)")
    argv = [sys.executable, "-c", STARTER]
    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            run = partial(trio.run_process, argv, stdin=PIPE, stdout=PIPE, check=False)
            starter: trio.Process = await nursery.start(run)
            assert starter.stdout is not None
            said = b""
            while not said.endswith(b"\n"):
                said += await starter.stdout.receive_some()
            server_pid, watcher_pid, folder = said.decode().split()
            # Taken while the server runs: its starter has not reaped it, nobody else can.
            server = os.pidfd_open(int(server_pid))
            watcher = os.pidfd_open(int(watcher_pid))
            try:
                starter.send_signal(signal.SIGKILL)
                with trio.move_on_after(BOUND / 2) as waited:
                    await _ended(server)
                    await _ended(watcher)
                if waited.cancelled_caught:  # clean up after it, then say so
                    signal.pidfd_send_signal(server, signal.SIGINT)
                    await _ended(server)
                    shutil.rmtree(folder, ignore_errors=True)
                    pytest.fail("the server outlived the process that started it")
                assert not await trio.Path(folder).exists()
            finally:
                os.close(server)
                os.close(watcher)


def test_a_halted_server_resumes_with_a_watcher_of_its_own() -> None:
    try:
        server = PgServer.start()
    except PgUnavailable as exc:
        pytest.skip(str(exc))
    try:
        first = server._running.watcher
        server.halt()
        assert first.returncode is not None  # the halted server's watcher ended with it
        server.resume()
        assert server._running.watcher.poll() is None
        server.admin("SELECT 1")
    finally:
        server.stop()
    assert server._running.watcher.returncode is not None
    assert not server.folder.exists()
