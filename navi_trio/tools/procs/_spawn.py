"""Starting and killing a tool's processes: process groups, tags, strays, orphans.

Every process a tool starts leads a new session, so it and everything it forks share
one process group, and `kill_group` signals the whole group, shielded and bounded.
A process that calls ``setsid`` leaves the group: every command's environment carries a
tag (``NAVI_PROC_TAG``) its descendants inherit, and `kill_group` also kills every
process below the leader and every one carrying the tag, even after it was reparented.

A tool process gets an allow-listed environment (`child_env`): locale, terminal, user,
shell, PATH and temp-folder variables, plus what its caller adds. Everything else
(cloud keys, tokens, database URLs) stays in the daemon.

The tag starts with its owner (`tag_owner`), so a daemon starting on a data folder kills
what a dead daemon of that folder left running (`kill_orphans`) and leaves a live
daemon's processes alone. A sandboxed command is led by bwrap in its own PID namespace:
killing bwrap kills everything inside.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import secrets
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from navi_trio.errors import ToolInputError
from navi_trio.profiles import NaviConfig, is_secret
from navi_trio.tools.cgroups import CommandGroup, SessionCgroup
from navi_trio.tools.proctree import (
    PROC,
    Query,
    Strays,
    find_strays_many,
    process_count,
    start_time,
    tag_values,
)

KILL_GRACE_SEC = 2.0  # between SIGTERM and SIGKILL
TAG_VAR = "NAVI_PROC_TAG"
# What every tool process gets of the daemon's environment (and every LC_* variable).
PASSED_VARS = (
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "TERM",
    "COLORTERM",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
)
ORPHAN_WAIT_SEC = 5.0
log = logging.getLogger("navi_trio.tools.procs")


def shell_argv(command: str | Sequence[str]) -> list[str]:
    """argv for `command`: a string goes through bash (or sh), a sequence is used as is."""
    if isinstance(command, str):
        if not command.strip():
            raise ToolInputError("the command is empty")
        shell = shutil.which("bash") or "/bin/sh"
        return [shell, "-c", command]
    argv = [str(a) for a in command]
    if not argv:
        raise ToolInputError("the command is empty")
    return argv


def data_digest(data_dir: Path) -> str:
    """A short name for a data folder (its real path), as tags carry it."""
    real = os.path.realpath(data_dir.expanduser())
    return hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def tag_owner(data_dir: Path) -> str:
    """Who starts a command: this process (pid and start time) on `data_dir`."""
    pid = os.getpid()
    return f"{data_digest(data_dir)}.{pid}.{start_time(pid) or 0}"


def new_tag(owner: str | None = None) -> str:
    """A value for `TAG_VAR`, unique to one command; `owner` from `tag_owner`."""
    return f"{owner or os.getpid()}:{secrets.token_hex(8)}"


def passed_env(names: Sequence[str], config: NaviConfig | None = None) -> dict[str, str]:
    """The daemon's values of the variables `names` (a profile's ``env``) that are set;
    never navi's own secrets, nor those `config` names (a peer's token, an MCP server's)."""
    return {n: os.environ[n] for n in names if n in os.environ and not is_secret(n, config)}


def child_env(extra: Mapping[str, str] | None = None, *, tag: str | None = None) -> dict[str, str]:
    """The environment of a tool process: the allow-listed part of ours, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k in PASSED_VARS or k.startswith("LC_")}
    env["PYTHONUNBUFFERED"] = "1"  # so Python children stream their lines
    if tag is not None:
        env[TAG_VAR] = tag
    if extra:
        env.update(extra)
    return env


def python_argv(script: Path) -> list[str]:
    """Isolated (-I), unbuffered (-u) Python running `script`."""
    return [sys.executable, "-I", "-u", str(script)]


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to the process group `pgid`; nothing when nobody is left in it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # nobody left in the group
        os.killpg(pgid, sig)


STRAY_ROUNDS = 3  # a stray may fork while we look: look again, this many times at most


INLINE_SCAN_MAX = 300  # processes on the machine: scan in the event loop up to this many


class _ScanBatch:
    """The stray scans asked for at one moment: one pass over /proc answers them all."""

    def __init__(self) -> None:
        self.queries: list[Query] = []
        self.results: list[Strays] = []
        self.done = trio.Event()


# Per trio run (not process-wide): the batch still taking queries, if any.
_OPEN_BATCH: trio.lowlevel.RunVar[_ScanBatch | None] = trio.lowlevel.RunVar(
    "navi_stray_scan", default=None
)


async def _find_strays(process: trio.Process, tag: str | None, since: int | None) -> Strays:
    """The strays of `process`, found in a worker thread. Kills that scan at the same
    moment (a stopped parallel batch) share one pass over /proc."""
    # Walk the tree only below an unreaped leader: a reaped leader's pid may be reused.
    leader = process.pid if process.returncode is None else None
    batch = _OPEN_BATCH.get()
    if batch is not None:
        index = len(batch.queries)
        batch.queries.append((leader, tag, since))
        await batch.done.wait()
        return batch.results[index] if index < len(batch.results) else Strays(set())
    batch = _ScanBatch()
    batch.queries.append((leader, tag, since))
    _OPEN_BATCH.set(batch)
    try:
        await trio.lowlevel.checkpoint()  # the other kills of this moment join the batch
    finally:
        _OPEN_BATCH.set(None)
    try:
        if process_count() <= INLINE_SCAN_MAX:
            # A few hundred processes take well under a millisecond to scan: less
            # than the hop to a worker thread costs a stop on a busy machine.
            batch.results = find_strays_many(batch.queries, TAG_VAR)
        else:
            batch.results = await trio.to_thread.run_sync(find_strays_many, batch.queries, TAG_VAR)
    finally:
        batch.done.set()
    return batch.results[0]


async def kill_group(
    process: trio.Process,
    grace: float = KILL_GRACE_SEC,
    tag: str | None = None,
    *,
    at_once: bool | None = None,
    cgroup: CommandGroup | None = None,
) -> None:
    """Kill the process group led by `process`, its strays, and reap the leader. Safe when
    the leader already exited; runs shielded, so it completes in a cancelled scope.

    Strays left the group with ``setsid``: below the leader by parent id, or carrying
    `tag`; with a `cgroup`, whatever the leaf holds. `at_once` (default: whether the
    caller's scope is cancelled) chooses between:

    - graceful: SIGTERM, up to `grace` for the leader, SIGKILL, then a second look for
      strays started meanwhile;
    - at once: the group is frozen (SIGSTOP) before the look for strays, then SIGKILLed; a
      frozen group cannot fork, so a second look is needed only when strays were found.
    """
    if at_once is None:
        at_once = trio.current_effective_deadline() == -math.inf
    pgid = process.pid  # the leader of a new session: its pid is the group id
    with trio.CancelScope(shield=True):
        if cgroup is not None:
            with trio.move_on_after(grace + 5.0):
                if not at_once and process.returncode is None:
                    signal_group(pgid, signal.SIGTERM)
                    with trio.move_on_after(grace):
                        await process.wait()
                await cgroup.group.kill()
                await process.wait()
            await _close_pipes(process)
            return
        with trio.move_on_after(grace + 5.0):
            # Strays start after the leader: older processes are skipped cheaply. Read
            # only while the leader is unreaped (a reaped leader's pid may be reused).
            since = start_time(process.pid) if process.returncode is None else None
            if at_once:
                signal_group(pgid, signal.SIGSTOP)
            # Before the leader dies, while its descendants still hang below it.
            strays = await _find_strays(process, tag, since)
            try:
                if at_once:
                    signal_group(pgid, signal.SIGKILL)
                    # The frozen members of the group did nothing during the look.
                    again = bool(strays.outside)
                else:
                    if process.returncode is None:
                        signal_group(pgid, signal.SIGTERM)
                        strays.signal(signal.SIGTERM)
                        with trio.move_on_after(grace):
                            await process.wait()
                    # Always: grandchildren may ignore SIGTERM or outlive their parent.
                    signal_group(pgid, signal.SIGKILL)
                    again = True
                for _ in range(STRAY_ROUNDS):
                    strays.signal(signal.SIGKILL)
                    await strays.wait()
                    strays.close()
                    if not again:
                        break
                    strays = await _find_strays(process, tag, since)
                    again = True
                    if not strays:
                        break
                await process.wait()
            finally:
                strays.close()
        await _close_pipes(process)


async def _close_pipes(process: trio.Process) -> None:
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            await stream.aclose()


async def open_in(
    argv: Sequence[str], cgroup: SessionCgroup | None, *, pass_fds: Sequence[int], **options: Any
) -> tuple[trio.Process, CommandGroup | None]:
    """Start `argv`, with a `cgroup` in a new leaf of that session before it runs anything.
    Returns the process and its leaf (the caller removes it; None when it has none)."""
    leaf = None
    if cgroup is not None:
        try:
            leaf = cgroup.command()
        except OSError as exc:
            log.warning("a command runs outside cgroups: cannot make its cgroup: %s", exc)
    if leaf is None:
        return await trio.lowlevel.open_process(list(argv), pass_fds=pass_fds, **options), None
    read, write = os.pipe()
    try:
        try:
            process = await trio.lowlevel.open_process(
                leaf.entry_argv(list(argv), read), pass_fds=(*pass_fds, read), **options
            )
        except BaseException:
            leaf.remove()
            raise
        finally:
            os.close(read)
        try:
            leaf.enter(process.pid)
        except OSError as exc:
            log.warning("process %d runs outside its cgroup: %s", process.pid, exc)
            leaf.remove()
            leaf = None
        with contextlib.suppress(OSError):  # it died already: its exit says so
            os.write(write, b"go\n")
    finally:
        os.close(write)
    return process, leaf


def _orphans(data_dir: Path) -> set[int]:
    """Our processes tagged by a daemon of `data_dir` that is no longer alive."""
    digest = data_digest(data_dir)
    found = set()
    for pid, tag in tag_values(TAG_VAR).items():
        owner = tag.split(":", 1)[0].split(".")
        if len(owner) != 3 or owner[0] != digest or not all(p.isdigit() for p in owner[1:]):
            continue
        daemon, started = int(owner[1]), int(owner[2])
        if start_time(daemon) != started:  # gone, or its pid now another process's
            found.add(pid)
    return found


async def kill_orphans(data_dir: Path) -> list[int]:
    """SIGKILL what dead daemons of `data_dir` left running; their pids. A ``full``-mode
    command outlives a SIGKILLed daemon; a live daemon's processes stay.
    """
    if not hasattr(os, "pidfd_open") or not PROC.is_dir():
        return []
    pids = await trio.to_thread.run_sync(_orphans, data_dir)
    strays = Strays(pids)
    try:
        strays.signal(signal.SIGKILL)
        with trio.move_on_after(ORPHAN_WAIT_SEC):
            await strays.wait()
        killed = sorted(strays.fds)
    finally:
        strays.close()
    if killed:
        log.warning(
            "killed %d process(es) a previous daemon on %s left running: %s",
            len(killed),
            data_dir,
            " ".join(map(str, killed)),
        )
    return killed
