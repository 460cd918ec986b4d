"""Test helpers for the core tools: an in-memory KV store, a ToolContext builder, a
recorder for emitted lines, and a way to watch PIDs die without sleeping.

The KV fake stores values as JSON (like the real store) and checkpoints on every call,
so concurrent read-modify-write sequences really interleave.
"""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import trio
import trio.testing

from navi_trio.events import AgentEvent
from navi_trio.profiles import load_config
from navi_trio.settings import REPO_ROOT, Settings
from navi_trio.testing.memkv import MemoryKV as MemoryKV
from navi_trio.tools.base import ToolContext


class Recorder:
    """Collects what a tool emits and publishes; `wait_lines` wakes on each new line."""

    def __init__(self) -> None:
        self.emitted: list[dict[str, Any]] = []
        self.published: list[AgentEvent] = []
        self._changed = trio.Event()

    def emit(self, data: dict[str, Any]) -> None:
        self.emitted.append(data)
        self._changed.set()
        self._changed = trio.Event()

    def publish(self, event: AgentEvent) -> None:
        self.published.append(event)

    def lines(self) -> list[str]:
        """The output lines emitted so far (progress events carry several each)."""
        out: list[str] = []
        for d in self.emitted:
            if d.get("stream") == "output" and d.get("lines"):
                out.extend(d["text"].split("\n"))
        return out

    async def wait_lines(self, prefix: str, count: int, within: float = math.inf) -> list[str]:
        """Wait until `count` output lines start with `prefix`; return them. Fails after
        `within` seconds naming the lines that did come: a line split or garbled on its
        way shows there, where a bare timeout says nothing."""
        with trio.move_on_after(within):
            while len(found := [ln for ln in self.lines() if ln.startswith(prefix)]) < count:
                await self._changed.wait()
            return found
        raise AssertionError(
            f"{count} lines starting {prefix!r} did not come within {within:g} s; "
            f"the output lines were {self.lines()!r}"
        )


T = TypeVar("T")
STUCK_SEC = 10.0


async def jump_after_line(
    clock: trio.testing.MockClock,
    run: Callable[[], Awaitable[T]],
    rec: Recorder,
    prefix: str,
    seconds: float,
) -> T:
    """Start `run()`, wait until it emitted a line starting with `prefix` (the process
    is up and printing), then move the MockClock by `seconds`; return what it returned.

    A timeout test on a hand-moved MockClock does not depend on how fast the machine
    starts a process (an autojump clock would fire the timeout before it printed). As a
    safety net only, a run idle for `STUCK_SEC` real seconds lets the clock jump to a
    virtual deadline, so a broken timeout fails the test with TooSlowError instead of
    hanging it.
    """
    results: list[T] = []

    async def go() -> None:
        results.append(await run())

    clock.autojump_threshold = STUCK_SEC
    with trio.fail_after(seconds + 3600):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(go)
            await rec.wait_lines(prefix, 1)
            clock.jump(seconds)
    return results[0]


def pids_in(lines: list[str]) -> list[int]:
    return [int(ln.split()[-1]) for ln in lines]


def is_gone(pid: int) -> bool:
    """No such process, or only a zombie left (PID 1 in a container may never reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


class PidWatch:
    """pidfds for live processes: `wait_exited` returns when every one has died."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.fds = [os.pidfd_open(pid) for pid in pids]

    async def wait_exited(self) -> None:
        for fd in self.fds:
            await trio.lowlevel.wait_readable(fd)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def make_ctx(
    tmp_path: Path,
    *,
    kv: Any = None,
    profile: str = "general",
    cwd: Path | None = None,
    services: Any = None,
    recorder: Recorder | None = None,
    session_id: str = "s1",
    user_id: str = "local",
    **settings: Any,
) -> ToolContext:
    config = load_config(REPO_ROOT / "config" / "config.json")
    rec = recorder or Recorder()
    return ToolContext(
        session_id=session_id,
        session_dir=tmp_path / "data" / "sessions" / session_id,
        kv=kv if kv is not None else MemoryKV(),
        settings=Settings.from_env({}, data_dir=tmp_path / "data", **settings),
        profile=config.profile(profile),
        config=config,
        cwd=cwd,
        user_id=user_id,
        emit=rec.emit,
        publish=rec.publish,
        services=services,
    )
