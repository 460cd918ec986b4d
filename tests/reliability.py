"""Helpers for the reliability suites (tests/test_reliability_*.py): a real `navi serve`
subprocess on 127.0.0.1 port 0 with its own DB and data dir, a WebSocket client with
the daemon's local token, its log as it comes (`LogLines`, when asked for), and process
measurements read from /proc (RSS and peak RSS, open file descriptors, child processes).

Nothing here sleeps: the daemon's port comes from the line it prints, frames and log
lines are read as they arrive. Every process started here is killed on the way out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import navi_forks
import trio
from api_ws import Client
from trio_websocket import open_websocket_url

from navi_trio.api.auth import read_local_token
from navi_trio.settings import Settings
from navi_trio.testing.lifeline import watching

START_LIMIT = 60  # real seconds for a daemon to print its port (2 busy cores)


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """os.environ without any navi setting, plus a private DB and data dir."""
    names = {f.metadata["env"] for f in attrs.fields(Settings)} | {"NAVI_DEBUG", "NAVI_TOKEN"}
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(NAVI_DB=str(tmp_path / "navi.db"), NAVI_DATA_DIR=str(tmp_path / "data"), **extra)
    return env


class LogLines:
    """A daemon's log (its stderr) as it comes: every line kept in `lines` and copied to
    its file; `until` waits for the lines holding a text, without polling."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._more = trio.Event()

    async def pump(self, stream: trio.abc.ReceiveStream, path: Path) -> None:
        rest = b""
        with path.open("ab") as out:
            while chunk := await stream.receive_some():
                out.write(chunk)
                out.flush()
                *done, rest = (rest + chunk).split(b"\n")
                self.lines += [line.decode(errors="replace") for line in done]
                self._more.set()
                self._more = trio.Event()

    async def until(self, text: str, count: int = 1) -> list[str]:
        """The first `count` lines holding `text`, once the daemon has written them."""
        while True:
            found = [line for line in self.lines if text in line]
            if len(found) >= count:
                return found[:count]
            await self._more.wait()


@attrs.define(eq=False)
class Daemon:
    proc: trio.Process | navi_forks.Forked
    url: str
    data_dir: Path
    log: LogLines | None = None  # with navi_serve(watch_log=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Client]:
        token = read_local_token(self.data_dir)
        assert token, "navi serve wrote no local token"
        async with open_websocket_url(self.url) as ws:
            c = Client(ws)
            await c.send({"type": "hello", "token": token})
            welcome = await c.next()
            assert welcome["type"] == "welcome", welcome
            yield c


async def _first_line(stream: trio.abc.ReceiveStream, log: Path) -> str:
    data = b""
    while b"\n" not in data:
        chunk = await stream.receive_some()
        if not chunk:  # its log says why (what CI shows of a failure is all we get)
            tail = (await trio.Path(log).read_text(errors="replace"))[-4000:]
            raise AssertionError(
                f"navi serve exited before listening; printed {data!r}; its log ends:\n{tail}"
            )
        data += chunk
    return data.decode().splitlines()[0]


@asynccontextmanager
async def navi_serve(
    env: dict[str, str],
    llm_url: str,
    log: Path,
    *,
    log_level: str = "warning",
    watch_log: bool = False,
    forked: bool = False,
) -> AsyncIterator[Daemon]:
    """``python -m navi_trio serve --port 0``; its log (`log_level` and up) goes to `log`,
    and with `watch_log` to the daemon's `log` (`LogLines`) as well. `forked`: the same
    command forked by tests/navi_forks.py (a process of its own, started in ~0.05 s
    instead of ~0.5 s), for tests whose subject is the daemon's work and not its
    interpreter's start."""
    if forked:
        async with _forked_serve(env, llm_url, log, log_level, watch_log) as daemon:
            yield daemon
        return
    with log.open("ab") as err:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "navi_trio", "serve", "--port", "0", "--llm-url", llm_url,
             "--log-level", log_level],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE if watch_log else err, env=env,
        )  # fmt: skip
    assert proc.stdout is not None
    async with watching(proc.pid):  # it stops the daemon if this process dies
        try:
            async with trio.open_nursery() as nursery:
                lines = None
                if watch_log:
                    assert proc.stderr is not None
                    lines = LogLines()
                    nursery.start_soon(lines.pump, proc.stderr, log)
                with trio.fail_after(START_LIMIT):
                    line = await _first_line(proc.stdout, log)
                assert line.startswith("navi: listening on ws://127.0.0.1:"), line
                yield Daemon(proc, line.split()[-1], Path(env["NAVI_DATA_DIR"]), lines)
                nursery.cancel_scope.cancel()
        finally:
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await proc.wait()
                await proc.stdout.aclose()
                if proc.stderr is not None:
                    await proc.stderr.aclose()


@asynccontextmanager
async def _forked_serve(
    env: dict[str, str], llm_url: str, log: Path, log_level: str, watch_log: bool
) -> AsyncIterator[Daemon]:
    """`navi_serve(forked=True)` (tests/navi_forks.py's `serving`): with `watch_log`, its
    stderr is copied to `log` by a task here. No watcher process: the fork server kills
    what it forked when this process dies."""
    level = ("--log-level", log_level)
    async with (
        navi_forks.serving(env, llm_url, *level, log=None if watch_log else log) as proc,
        trio.open_nursery() as nursery,
    ):
        lines = None
        if watch_log:
            lines = LogLines()
            nursery.start_soon(lines.pump, proc.stderr, log)
        yield Daemon(proc, proc.url, Path(env["NAVI_DATA_DIR"]), lines)
        nursery.cancel_scope.cancel()


# -- /proc measurements ------------------------------------------------------------------


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM) in MB, kept by the kernel: no sampling."""
    return _status_kb(pid, "VmHWM") / 1024


def rss_mb(pid: int) -> float:
    """The process's resident set now (VmRSS) in MB."""
    return _status_kb(pid, "VmRSS") / 1024


def open_fds(pid: int | None = None) -> int:
    return len(os.listdir(f"/proc/{pid or os.getpid()}/fd"))


def descendants(pid: int | None = None) -> list[int]:
    """Every process below `pid` (children, grandchildren …), zombies included: a
    child nobody reaped is a leak too."""
    root = pid or os.getpid()
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        parent_of[int(entry)] = int(fields[1])
    found: list[int] = []
    frontier = [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent_of.items() if pp == p]
        found += kids
        frontier += kids
    return found


def trio_task_count() -> int:
    """Live trio tasks in the current run (walks the task tree from the root)."""
    count = 0
    stack: list[Any] = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count
