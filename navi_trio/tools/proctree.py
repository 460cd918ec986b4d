"""Finding the processes a command left behind outside its process group (Linux /proc).

A process that calls ``setsid`` (``setsid cmd &``, Python ``os.setsid()`` after a fork)
leaves its process group, so ``killpg`` misses it. `find_strays` finds such processes
two ways, at kill time:

- by parent id: every live process below the leader (works while the chain of parents
  is alive);
- by environment: every process whose environment carries the command's tag
  (``NAVI_PROC_TAG=...``, inherited from the command), which still works after its
  parent died and it was reparented to PID 1 or a subreaper.

Each stray is held by a pidfd, so a recycled PID is never signalled by mistake, and its
death is awaited through the pidfd (no polling). Without /proc (not Linux) nothing is
found and the process-group kill is all there is.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import trio

PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def _has_tag(pid: int, needle: bytes) -> bool:
    try:
        env = (PROC / str(pid) / "environ").read_bytes()
    except OSError:  # another user's process, or gone
        return False
    return needle in b"\0" + env + b"\0"


def stray_pids(leader: int | None, tag_var: str, tag: str | None) -> set[int]:
    """Live processes below `leader` (if given) by parent id, or carrying ``tag_var=tag``."""
    me, uid = os.getpid(), os.getuid()
    children: dict[int, list[int]] = {}
    tagged: set[int] = set()
    needle = f"\0{tag_var}={tag}\0".encode() if tag else None
    try:
        entries = list(os.scandir(PROC))
    except OSError:
        return set()
    for entry in entries:
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if entry.stat().st_uid != uid:
                continue  # not ours: we could not signal it anyway
        except OSError:
            continue
        info = _stat(pid)
        if info is None or info[0] in ("Z", "X"):
            continue
        children.setdefault(info[1], []).append(pid)
        if needle is not None and pid != me and _has_tag(pid, needle):
            tagged.add(pid)
    found: set[int] = set()
    todo = list(children.get(leader, [])) if leader is not None else []
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return (found | tagged) - {me, leader or me}


class Strays:
    """Processes held by pidfds: `signal` them, `wait` for them to die, `close`."""

    def __init__(self, pids: set[int]) -> None:
        self.fds: dict[int, int] = {}
        for pid in sorted(pids):
            try:
                self.fds[pid] = os.pidfd_open(pid)
            except OSError:
                pass  # already gone

    def __bool__(self) -> bool:
        return bool(self.fds)

    def signal(self, sig: signal.Signals) -> None:
        for fd in self.fds.values():
            try:
                signal.pidfd_send_signal(fd, sig)
            except OSError:
                pass  # exited meanwhile

    async def wait(self) -> None:
        for fd in self.fds.values():
            await trio.lowlevel.wait_readable(fd)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def find_strays(leader: int | None, tag_var: str, tag: str | None) -> Strays:
    """The strays of `leader` (see the module docstring); runs in a worker thread."""
    if not hasattr(os, "pidfd_open") or not PROC.is_dir():
        return Strays(set())
    return Strays(stray_pids(leader, tag_var, tag))
