"""Finding the processes a command left behind outside its process group (Linux /proc).

A process that calls ``setsid`` leaves its process group, so ``killpg`` misses it.
Strays are found by parent id (while the chain of parents lives) and by the command's
tag in the environment (which still works after reparenting). Each is held by a pidfd,
so a recycled PID is never signalled by mistake. Without /proc nothing is found.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import TypeAlias

import trio

PROC = Path("/proc")


def _read(path: str) -> bytes | None:
    """The bytes of a small /proc file (one open, few reads), or None when unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # gone, or another user's
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, parent pid, start time in clock ticks, process group) of a process, or
    None when gone."""
    data = _read(f"{PROC}/{pid}/stat")
    if data is None:
        return None
    fields = data.rsplit(b")", 1)[1].split()
    return fields[0].decode(), int(fields[1]), int(fields[19]), int(fields[2])


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None when it is gone."""
    info = _stat(pid)
    return None if info is None else info[2]


def process_count() -> int:
    """How many processes the machine has now (0 without /proc)."""
    try:
        return sum(1 for name in os.listdir(PROC) if name.isdigit())
    except OSError:
        return 0


def _has_tag(pid: int, needle: bytes) -> bool:
    env = _read(f"{PROC}/{pid}/environ")
    return env is not None and needle in b"\0" + env + b"\0"


Query: TypeAlias = tuple[int | None, str | None, int | None]  # (leader, tag, since)


def stray_pids(
    leader: int | None, tag_var: str, tag: str | None, since: int | None = None
) -> set[int]:
    """Live processes below `leader` (if given) by parent id, or carrying ``tag_var=tag``.
    Only processes started no earlier than `since` can be strays: older ones cost one read
    of their stat file, and their environment is never read.
    """
    return stray_pids_many([(leader, tag, since)], tag_var)[0]


def stray_pids_many(queries: list[Query], tag_var: str) -> list[set[int]]:
    """`stray_pids` for several leaders at once, in one pass over /proc: the commands
    of a parallel batch stopped together cost one scan, not one each."""
    return _scan(queries, tag_var)[0]


def _scan(queries: list[Query], tag_var: str) -> tuple[list[set[int]], dict[int, int]]:
    """The strays of each query, and the process group of every process seen."""
    me, uid = os.getpid(), os.getuid()
    wanted: list[tuple[int | None, bytes | None, int | None]] = []
    for leader, tag, since in queries:
        if since is None and leader is not None:
            since = start_time(leader)
        needle = f"\0{tag_var}={tag}\0".encode() if tag else None
        wanted.append((leader, needle, since))
    sinces = [since for _, _, since in wanted]
    oldest = None if not sinces or None in sinces else min(s for s in sinces if s is not None)
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    groups: dict[int, int] = {}
    tagged: list[set[int]] = [set() for _ in wanted]
    try:
        names = os.listdir(PROC)
    except OSError:
        return [set() for _ in wanted], {}
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        info = _stat(pid)
        if info is None or info[0] in ("Z", "X") or (oldest is not None and info[2] < oldest):
            continue
        try:
            if not _ours(pid, uid):
                continue
        except OSError:
            continue
        children.setdefault(info[1], []).append(pid)
        started[pid] = info[2]
        groups[pid] = info[3]
        for i, (leader, needle, since) in enumerate(wanted):
            if (
                needle is not None
                and pid != me
                and pid != leader
                and (since is None or info[2] >= since)
                and _has_tag(pid, needle)
            ):
                tagged[i].add(pid)
    out = []
    for (leader, _, since), tags in zip(wanted, tagged, strict=True):
        found: set[int] = set()
        todo = list(children.get(leader, [])) if leader is not None else []
        while todo:
            pid = todo.pop()
            if pid not in found and (since is None or started[pid] >= since):
                found.add(pid)
                todo.extend(children.get(pid, []))
        out.append((found | tags) - {me, leader or me})
    return out, groups


def _ours(pid: int, uid: int) -> bool:
    """Whether process `pid` may be one of ours: run by our uid, or by anyone when we are
    root (our tool processes then run as another user). Its tag or its parent decides."""
    return uid == 0 or os.stat(f"{PROC}/{pid}").st_uid == uid


def tag_values(tag_var: str) -> dict[int, str]:
    """Every live process of ours whose environment sets `tag_var`: pid -> its value. One
    blocking pass over /proc: run it in a worker thread.
    """
    me, uid = os.getpid(), os.getuid()
    needle = f"\0{tag_var}=".encode()
    found: dict[int, str] = {}
    try:
        names = os.listdir(PROC)
    except OSError:
        return found
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            if not _ours(pid, uid):
                continue
        except OSError:
            continue
        info = _stat(pid)
        env = _read(f"{PROC}/{pid}/environ")
        if info is None or info[0] in ("Z", "X") or env is None:
            continue
        at = (b"\0" + env).find(needle)
        if at >= 0:
            value = (b"\0" + env)[at + len(needle) :].split(b"\0", 1)[0]
            found[pid] = value.decode("utf-8", "replace")
    return found


class Strays:
    """Processes held by pidfds: `signal` them, `wait` for them to die, `close`.

    `outside` are those that were not in the group (`group`: the leader's pid) when
    found: the ones that left it, which a signal to the group misses.
    """

    def __init__(self, pids: set[int], outside: set[int] | None = None) -> None:
        self.outside = set(pids) if outside is None else outside & pids
        self.fds: dict[int, int] = {}
        for pid in sorted(pids):
            with contextlib.suppress(OSError):  # already gone
                self.fds[pid] = os.pidfd_open(pid)

    def __bool__(self) -> bool:
        return bool(self.fds)

    def signal(self, sig: signal.Signals) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):  # exited meanwhile
                signal.pidfd_send_signal(fd, sig)

    async def wait(self) -> None:
        for fd in self.fds.values():
            await trio.lowlevel.wait_readable(fd)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def find_strays(
    leader: int | None, tag_var: str, tag: str | None, since: int | None = None
) -> Strays:
    """The strays of `leader` (see the module docstring); runs in a worker thread."""
    return find_strays_many([(leader, tag, since)], tag_var)[0]


def find_strays_many(queries: list[Query], tag_var: str) -> list[Strays]:
    """`find_strays` for several leaders in one pass; runs in a worker thread."""
    if not hasattr(os, "pidfd_open") or not PROC.is_dir():
        return [Strays(set()) for _ in queries]
    found, groups = _scan(queries, tag_var)
    out = []
    for (leader, _, _), pids in zip(queries, found, strict=True):
        # A reaped leader's group id may be reused: then every stray counts as outside.
        outside = {p for p in pids if leader is None or groups.get(p) != leader}
        out.append(Strays(pids, outside))
    return out
