"""Processes that tests and benchmarks start (a `navi serve`, a throwaway PostgreSQL
server) stop when the process that started them dies, however it dies (SIGKILL
included), instead of living on with parent 1.

    proc = subprocess.Popen([...], start_new_session=True)
    watcher = watch(proc.pid)            # beside it: SIGTERM to it once we are gone
    ...
    stop it; watcher.wait()              # the watcher ends when the watched process ends

A watcher is a small process waiting for EOF on a pipe whose write end only the starter
holds (a pipe's ends are not inherited through exec), and for the watched process's
end. Not PR_SET_PDEATHSIG: that fires when the starting *thread* ends, and these
processes are started from worker threads too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

REAP_SEC = 10.0  # a watcher ends at once after its process; only a process left running waits

# The watcher (argv: the pidfd of the watched process, the signal that stops it, the
# grace before SIGKILL, folders to remove after; stdin: the lifeline's read end). The
# pidfd is taken by the starter while the process is its unreaped child, so it names
# that process even after the starter is gone; the process ending first ends the watcher.
_WATCH = """\
import select, shutil, signal, sys
watched, stop, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
if watched not in select.select([0, watched], [], [])[0]:
    signal.pidfd_send_signal(watched, stop)
    if not select.select([watched], [], [], grace)[0]:
        signal.pidfd_send_signal(watched, signal.SIGKILL)
        select.select([watched], [], [])
    for folder in sys.argv[4:]:
        shutil.rmtree(folder, ignore_errors=True)
"""


class Lifeline:
    """A pipe whose write end only this process holds: a watcher reading the other end
    sees EOF once this process is gone (or `close` is called)."""

    def __init__(self) -> None:
        self.read, self._write = os.pipe()

    def close(self) -> None:
        os.close(self.read)
        os.close(self._write)


_own: tuple[int, Lifeline] | None = None  # this process's (pid: a forked child makes its own)
_own_lock = threading.Lock()


def own_lifeline() -> Lifeline:
    """This process's lifeline, made on first use and held until the process ends."""
    global _own
    with _own_lock:
        if _own is None or _own[0] != os.getpid():
            _own = (os.getpid(), Lifeline())
        return _own[1]


def watch(
    pid: int,
    *,
    stop: int = signal.SIGTERM,
    grace: float = 30.0,
    remove: Path | None = None,
    lifeline: Lifeline | None = None,
) -> subprocess.Popen[bytes]:
    """A watcher of `pid` (a child of this process, not yet reaped): once `lifeline`
    (this process's by default) ends, it sends `stop`, then SIGKILL after `grace`
    seconds, then removes the folder `remove`. It ends by itself when `pid` ends; wait
    for it then."""
    line = lifeline or own_lifeline()
    watched = os.pidfd_open(pid)
    try:
        argv = [sys.executable, "-I", "-S", "-c", _WATCH, str(watched), str(int(stop)), str(grace)]
        return subprocess.Popen(
            [*argv, *([str(remove)] if remove is not None else [])],
            stdin=line.read,
            stdout=subprocess.DEVNULL,
            pass_fds=(watched,),
            start_new_session=True,  # a Ctrl-C at the terminal leaves it to the lifeline
            cwd="/",
        )
    finally:
        os.close(watched)


@asynccontextmanager
async def watching(pid: int, **how: Any) -> AsyncIterator[subprocess.Popen[bytes]]:
    """`watch` for a trio starter: the watcher for the block, which ends the watched
    process itself (the watcher is reaped once that process has ended)."""
    watcher = await trio.to_thread.run_sync(partial(watch, pid, **how))
    try:
        yield watcher
    finally:
        ended = os.pidfd_open(watcher.pid)
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(REAP_SEC):
                await trio.lowlevel.wait_readable(ended)
                watcher.wait()
        finally:
            os.close(ended)
