"""One model host process as the daemon sees it (the supervisor is llm/host.py).

What the child loads (`LoadSpec`, the ``load`` frame), how it is started (`Spawn`:
`spawn_process` for a real one, a fake in unit tests; `child_command`), how its end is
named (`exit_description`: ``SIGILL, illegal instruction``), the last lines of its
stderr (`StderrRing`, bounded), and `HostChild`, one start of it: its process, its
bounded outbox, and what the supervisor learns of it (ready, fatal, killed and why).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from navi_trio.llm.host_wire import encode

STDERR_LINES = 40
STDERR_LINE_MAX = 500
REPORT_LINES = 5  # stderr lines quoted in an error or the log
OUTBOX = 256  # frames for the child not yet written to its stdin


@attrs.frozen
class LoadSpec:
    """What the child loads, and how it generates."""

    model_file: Path
    n_ctx: int = 4096
    threads: int = 2
    seed: int = 0
    tool_rounds: int = 1
    args_max_tokens: int = 512

    def frame(self, *, extra_buffers: bool, probe: bool, start: int) -> dict[str, Any]:
        return {
            "type": "load",
            **attrs.asdict(self, value_serializer=_plain),
            "extra_buffers": extra_buffers,
            "probe": probe,
            "start": start,
        }


def _plain(_: Any, __: Any, value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


class ChildProcess(Protocol):
    """What the host needs of a process (trio.Process; a fake in unit tests)."""

    @property
    def stdin(self) -> trio.abc.SendStream | None: ...

    @property
    def stdout(self) -> trio.abc.ReceiveStream | None: ...

    @property
    def stderr(self) -> trio.abc.ReceiveStream | None: ...

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def kill(self) -> None: ...


Spawn = Callable[[list[str], dict[str, str]], Awaitable[ChildProcess]]


async def spawn_process(argv: list[str], env: dict[str, str]) -> ChildProcess:
    return await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


def child_command() -> tuple[list[str], dict[str, str]]:
    """``python -m navi_trio.llm.model_host`` with this very navi_trio on its path."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return [sys.executable, "-m", "navi_trio.llm.model_host"], env


def exit_description(code: int | None) -> str:
    """``SIGILL, illegal instruction`` for a signal, ``exit status 1`` otherwise."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            sig = signal.Signals(-code)
        except ValueError:
            return f"signal {-code}"
        text = signal.strsignal(sig) or ""
        return f"{sig.name}, {text.lower()}" if text else sig.name
    return f"exit status {code}"


class StderrRing:
    """The last `STDERR_LINES` lines a child wrote to stderr, each cut at a bound."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=STDERR_LINES)
        self._part = b""

    def feed(self, data: bytes) -> None:
        *whole, self._part = (self._part + data).split(b"\n")
        for raw in whole:
            self._add(raw)
        if len(self._part) > STDERR_LINE_MAX:
            self._add(self._part)
            self._part = b""

    def close(self) -> None:
        if self._part:
            self._add(self._part)
            self._part = b""

    def _add(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip()
        if text:
            self.lines.append(text[:STDERR_LINE_MAX])

    def tail(self, n: int = REPORT_LINES) -> list[str]:
        return list(self.lines)[-n:]


class HostChild:
    """One process of the model host, as the daemon sees it."""

    def __init__(self, start: int, *, extra_buffers: bool, probe: bool) -> None:
        self.start = start
        self.extra_buffers = extra_buffers
        self.probe = probe
        self.proc: ChildProcess | None = None
        self.outbox, self._outbox_recv = trio.open_memory_channel[bytes](OUTBOX)
        self.stderr = StderrRing()
        self.probing = False  # loaded with extra buffer types: the probe's token runs
        self.ready = trio.Event()
        self.settled = trio.Event()  # ready, or dead
        self.info: dict[str, Any] = {}
        self.fatal: str | None = None
        self.killed: str | None = None  # why we killed it (then its death is no crash)
        self.wire_error: str | None = None
        self.dead = False

    def send(self, frame: dict[str, Any]) -> None:
        try:
            self.outbox.send_nowait(encode(frame))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self.kill("its input is stuck")  # it reads nothing: the next request restarts it

    def kill(self, why: str) -> None:
        if self.killed is None and self.wire_error is None:
            self.killed = why
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()

    def how(self) -> str:
        if self.wire_error is not None:
            return f"it sent what the daemon cannot read: {self.wire_error}"
        if self.proc is None:
            return "it could not start"
        return exit_description(self.proc.returncode)
