"""The daemons tests start do not outlive the process that started them, however it
ends: a starter (a child process here) starts one through the tests' own helpers, says
its pid, and is SIGKILLed; the daemon must be gone soon after (its watcher,
navi_trio/testing/lifeline.py, stops it).

Real processes on real time, so slow; each wait is bounded (`trio.fail_after`) and
event-driven (a pidfd becomes readable when its process ends).
"""

from __future__ import annotations

import os
import signal
import sys
from functools import partial
from pathlib import Path
from subprocess import PIPE

import pytest
import trio

from navi_trio.settings import REPO_ROOT

pytestmark = pytest.mark.slow

BOUND = 60  # a daemon's start on a loaded machine; its SIGTERM shutdown takes far less
NO_LLM = "http://127.0.0.1:9"  # a start asks the model nothing

# Each starter takes a folder, starts its process, says its pid (and its watcher's), then
# waits to be killed.
STARTERS = {
    "web_browser.Daemon": """\
import sys
from pathlib import Path
from web_browser import Daemon
daemon = Daemon(Path(sys.argv[1]), sys.argv[2]).start()
print(daemon.proc.pid, daemon.watcher.pid, flush=True)
sys.stdin.read()
""",
    "reliability.navi_serve": """\
import sys
from pathlib import Path
import trio
from reliability import clean_env, navi_serve
async def main():
    home = Path(sys.argv[1])
    async with navi_serve(clean_env(home), sys.argv[2], home / "serve.log") as daemon:
        print(daemon.pid, flush=True)
        await trio.sleep_forever()
trio.run(main)
""",
    "lifeline.watch": """\
import signal, subprocess, sys
from pathlib import Path
from navi_trio.testing.lifeline import watch
folder = Path(sys.argv[1]) / "removed"
folder.mkdir()
# The child must end on SIGINT: not left ignored by whoever started the tests (a
# script's background job starts with SIGINT ignored, and exec keeps that).
signal.signal(signal.SIGINT, signal.SIG_DFL)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
watcher = watch(child.pid, stop=signal.SIGINT, remove=folder)
print(child.pid, watcher.pid, flush=True)
sys.stdin.read()
""",
}


async def ended(pidfd: int) -> None:
    await trio.lowlevel.wait_readable(pidfd)


def signal_state(pid: int) -> str:
    """What process `pid` blocks, ignores and catches (/proc's masks, hex: SIGINT is bit
    1, 0x2), for a failure saying why a stop signal did not end it."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            lines = [
                x.strip() for x in status if x.startswith(("State", "SigBlk", "SigIgn", "SigCgt"))
            ]
    except OSError as exc:
        return f"pid {pid}: {exc}"
    return f"pid {pid}: " + ", ".join(" ".join(x.split()) for x in lines)


@pytest.mark.parametrize("starter", sorted(STARTERS))
async def test_what_a_killed_starter_started_stops(starter: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")])}
    argv = [sys.executable, "-c", STARTERS[starter], str(tmp_path), NO_LLM]
    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            run = partial(trio.run_process, argv, stdin=PIPE, stdout=PIPE, check=False, env=env)
            proc: trio.Process = await nursery.start(run)
            assert proc.stdout is not None
            said = b""
            while not said.endswith(b"\n"):
                chunk = await proc.stdout.receive_some()
                assert chunk, f"the starter ended first, saying {said!r}"
                said += chunk
            # Taken while they run: their starter has not reaped them, nobody else can.
            pids = [os.pidfd_open(int(pid)) for pid in said.split()]
            try:
                proc.send_signal(signal.SIGKILL)
                with trio.move_on_after(BOUND / 2) as waited:
                    for pidfd in pids:
                        await ended(pidfd)
                if waited.cancelled_caught:  # clean up after it, then say so
                    # What the processes block, ignore and catch: a SIGINT ignored or
                    # blocked where a stop signal was expected to end one says why.
                    states = "; ".join(signal_state(int(pid)) for pid in said.split())
                    for pidfd in pids:
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                        await ended(pidfd)
                    pytest.fail(
                        f"what {starter} started outlived the process that started it ({states})"
                    )
            finally:
                for pidfd in pids:
                    os.close(pidfd)
    if starter == "lifeline.watch":
        assert not (tmp_path / "removed").exists()
