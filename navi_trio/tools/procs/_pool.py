"""The persistent processes of ``terminal open``: an actor owning them per session.

Each process lives in the pool's nursery; its output goes to a bounded buffer (the
oldest characters dropped, and counted, when it prints faster than it is read); a
session sees only its own handles. A process ends, its group killed, with the pool,
its session, its user, or after `idle_sec` without use; a read afterwards says which.
"""

from __future__ import annotations

import itertools
import math
import subprocess
from collections.abc import Collection, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

import attrs
import trio

from navi_trio.actor import NurseryHolder
from navi_trio.errors import ToolInputError
from navi_trio.tools.cgroups import SessionCgroup
from navi_trio.tools.procs._capture import wait_and_drain
from navi_trio.tools.procs._spawn import (
    KILL_GRACE_SEC,
    TAG_VAR,
    child_env,
    kill_group,
    new_tag,
    open_in,
    shell_argv,
)
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs
from navi_trio.tools.sandbox import SandboxedCommand, SandboxSpec, process_cwd, sandboxed_argv

WRITE_TIMEOUT_SEC = 5.0


@attrs.frozen
class ProcessInfo:
    handle_id: str
    command: str
    pid: int
    running: bool
    exit_code: int | None
    cwd: str
    ended: str = ""  # why navi ended it, when it did


@attrs.frozen
class ReadResult:
    output: str
    dropped: int  # characters lost because the buffer overflowed before this read
    pending: int  # characters still buffered (the read hit max_chars)
    running: bool
    exit_code: int | None
    ended: str = ""  # why navi ended it (idle, its session deleted, its user removed)


class _Handle:
    def __init__(
        self,
        session_id: str,
        handle_id: str,
        command: str,
        cwd: Path,
        process: trio.Process,
        user_id: str | None,
        idle_sec: float,
    ) -> None:
        self.session_id = session_id
        self.handle_id = handle_id
        self.command = command
        self.cwd = cwd
        self.process = process
        self.user_id = user_id
        self.idle_sec = idle_sec
        self.scope = trio.CancelScope()
        self.ended = ""  # why navi ended it
        self.used()
        self.pending = ""
        self.dropped = 0
        self.changed = trio.Event()  # set when output arrives or the process ends
        self.done = trio.Event()
        self.exit_code: int | None = None
        self.write_lock = trio.Lock()

    def used(self) -> None:
        """Opened, read or written: the idle limit counts from now."""
        self.scope.deadline = trio.current_time() + self.idle_sec

    def end(self, why: str) -> None:
        if not self.done.is_set() and not self.ended:
            self.ended = why
        self.scope.cancel()

    def info(self) -> ProcessInfo:
        return ProcessInfo(
            handle_id=self.handle_id,
            command=self.command,
            pid=self.process.pid,
            running=not self.done.is_set(),
            exit_code=self.exit_code,
            cwd=str(self.cwd),
            ended=self.ended,
        )


@attrs.frozen
class _Start:
    """How to start one process: its command line and fds, the folder to start in, its
    environment, whom it runs as."""

    cmd: SandboxedCommand
    cwd: str
    env: dict[str, str]
    user: RunAs | None
    cgroup: SessionCgroup | None


class ProcessPool(NurseryHolder):
    """Persistent processes per session, owned by one actor (see the module docstring)."""

    def __init__(
        self,
        *,
        buffer_chars: int = 64_000,
        max_per_session: int = 8,
        grace: float = KILL_GRACE_SEC,
        idle_sec: float = math.inf,
    ) -> None:
        self.buffer_chars = buffer_chars
        self.max_per_session = max_per_session
        self.grace = grace
        self.idle_sec = idle_sec  # NAVI_TERMINAL_IDLE_SEC
        self._handles: dict[tuple[str, str], _Handle] = {}
        self._counters: dict[str, itertools.count[int]] = {}

    def _get(self, session_id: str, handle_id: str) -> _Handle:
        handle = self._handles.get((session_id, handle_id))
        if handle is None:
            known = ", ".join(i.handle_id for i in self.list(session_id)) or "none"
            raise ToolInputError(
                f"no process '{handle_id}' in this session (open processes: {known})"
            )
        return handle

    def _prune_exited(self, session_id: str) -> None:
        mine = [h for h in self._handles.values() if h.session_id == session_id]
        exited = [h for h in mine if h.done.is_set()]
        for handle in exited[: max(0, len(mine) - self.max_per_session + 1)]:
            del self._handles[(session_id, handle.handle_id)]

    async def open(
        self,
        session_id: str,
        command: str,
        cwd: Path | Root,
        *,
        sandbox: SandboxSpec | None = None,
        bwrap_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        owner: str | None = None,
        roots: Sequence[Root] = (),
        user: RunAs | None = None,
        user_id: str | None = None,
        cgroup: SessionCgroup | None = None,
    ) -> str:
        """Start `command` (through the shell) in `cwd`; returns its handle id ("p1" …). The
        other arguments are as for `run_command`; `user_id`: whose it is (`close_users`).
        """
        with ExitStack() as stack:
            # First, before the checks: they must not go stale across an await.
            cmd = await sandboxed_argv(
                sandbox,
                shell_argv(command),
                cwd,
                bwrap_path,
                roots=roots,
                stack=stack,
                user=user,
            )
            environ = child_env({**(env or {}), **(user.env() if user else {})})
            start = _Start(cmd, process_cwd(cmd, cwd), environ, user, cgroup)
            return await self._start(session_id, command, start, cwd, owner, user_id)

    async def _start(
        self,
        session_id: str,
        command: str,
        start: _Start,
        cwd: Path | Root,
        owner: str | None,
        user_id: str | None,
    ) -> str:
        if not self.running:
            raise ToolInputError("the process pool is not running (the daemon is stopping)")
        self._prune_exited(session_id)
        mine = [h for h in self._handles.values() if h.session_id == session_id]
        if len(mine) >= self.max_per_session:
            raise ToolInputError(
                f"this session already has {len(mine)} processes open (the limit is "
                f"{self.max_per_session}); kill one first"
            )
        counter = self._counters.setdefault(session_id, itertools.count(1))
        handle_id = f"p{next(counter)}"
        shown = cwd.path if isinstance(cwd, Root) else cwd
        handle: _Handle = await self.nursery.start(
            self._serve, session_id, handle_id, command, start, shown, owner, user_id
        )
        return handle.handle_id

    async def _serve(
        self,
        session_id: str,
        handle_id: str,
        command: str,
        start: _Start,
        cwd: Path,
        owner: str | None,
        user_id: str | None,
        task_status: trio.TaskStatus[_Handle] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        tag = new_tag(owner)
        process, leaf = await open_in(
            start.cmd.argv,
            start.cgroup,
            cwd=start.cwd,
            pass_fds=start.cmd.fds,
            **(start.user.popen() if start.user and not start.cmd.switches_user else {}),
            env={**start.env, TAG_VAR: tag},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle = _Handle(session_id, handle_id, command, cwd, process, user_id, self.idle_sec)
        self._handles[(session_id, handle_id)] = handle
        try:
            with handle.scope:
                task_status.started(handle)
                await wait_and_drain(
                    process, lambda text: self._buffer(handle, text), None, cgroup=leaf
                )
            if handle.scope.cancelled_caught and not handle.ended:
                handle.ended = f"nobody used it for {self.idle_sec:g} s (NAVI_TERMINAL_IDLE_SEC)"
        finally:
            await kill_group(process, self.grace, tag, cgroup=leaf)
            if leaf is not None:
                if leaf.oom_kills() and not handle.ended:
                    handle.ended = f"memory limit {leaf.memory_mb} MB reached"
                leaf.remove()
            handle.exit_code = process.returncode
            handle.done.set()
            handle.changed.set()

    def _buffer(self, handle: _Handle, text: str) -> None:
        if not text:
            return
        handle.pending += text
        excess = len(handle.pending) - self.buffer_chars
        if excess > 0:
            handle.dropped += excess
            handle.pending = handle.pending[excess:]
        handle.changed.set()

    async def read(
        self, session_id: str, handle_id: str, max_chars: int, wait: float = 0.0
    ) -> ReadResult:
        """Output since the last read (oldest first, at most `max_chars`).

        With `wait` > 0 and nothing buffered yet, waits up to `wait` seconds for output
        or for the process to end.
        """
        handle = self._get(session_id, handle_id)
        if max_chars < 1:
            raise ToolInputError(f"max_chars must be at least 1 (got {max_chars})")
        if not handle.done.is_set():
            handle.used()
        if wait > 0 and not handle.pending and not handle.done.is_set():
            with trio.move_on_after(wait):
                await handle.changed.wait()
        text, handle.pending = handle.pending[:max_chars], handle.pending[max_chars:]
        dropped, handle.dropped = handle.dropped, 0
        if not handle.pending and not handle.done.is_set():
            handle.changed = trio.Event()
        return ReadResult(
            output=text,
            dropped=dropped,
            pending=len(handle.pending),
            running=not handle.done.is_set(),
            exit_code=handle.exit_code,
            ended=handle.ended,
        )

    async def write(self, session_id: str, handle_id: str, text: str, eof: bool = False) -> None:
        """Send `text` to the process's stdin; `eof` closes stdin afterwards."""
        handle = self._get(session_id, handle_id)
        stdin = handle.process.stdin
        assert stdin is not None
        if handle.done.is_set():
            why = f": {handle.ended}" if handle.ended else ""
            raise ToolInputError(f"process {handle_id} has exited (code {handle.exit_code}){why}")
        handle.used()
        async with handle.write_lock:
            try:
                with trio.fail_after(WRITE_TIMEOUT_SEC):
                    if text:
                        await stdin.send_all(text.encode("utf-8"))
                    if eof:
                        await stdin.aclose()
            except trio.TooSlowError:
                raise ToolInputError(
                    f"process {handle_id} is not reading its input (waited {WRITE_TIMEOUT_SEC:g} s)"
                ) from None
            except trio.ClosedResourceError:
                raise ToolInputError(f"the input of process {handle_id} was closed") from None
            except trio.BrokenResourceError:
                raise ToolInputError(f"process {handle_id} closed its input") from None

    async def kill(self, session_id: str, handle_id: str) -> ReadResult:
        """Kill the process's whole group, forget the handle; returns its unread output."""
        handle = self._get(session_id, handle_id)
        handle.end("killed")
        await handle.done.wait()
        self._handles.pop((session_id, handle_id), None)
        dropped = handle.dropped
        return ReadResult(
            output=handle.pending,
            dropped=dropped,
            pending=0,
            running=False,
            exit_code=handle.exit_code,
        )

    async def wait_exit(self, session_id: str, handle_id: str) -> int | None:
        """Wait until the process has ended (its group killed); returns its exit code."""
        handle = self._get(session_id, handle_id)
        await handle.done.wait()
        return handle.exit_code

    def list(self, session_id: str) -> list[ProcessInfo]:
        return [h.info() for h in self._handles.values() if h.session_id == session_id]

    async def close_session(self, session_id: str) -> int:
        """The session was deleted: end its processes (their groups killed), forget
        them; how many were running."""
        mine = [h for h in self._handles.values() if h.session_id == session_id]
        running = sum(1 for h in mine if not h.done.is_set())
        for handle in mine:
            handle.end("its session was deleted")
        for handle in mine:
            await handle.done.wait()
            self._handles.pop((session_id, handle.handle_id), None)
        self._counters.pop(session_id, None)
        return running

    def close_users(self, user_ids: Collection[str]) -> int:
        """These users were removed: end their processes (each group is killed as its
        task unwinds) and forget them; how many."""
        theirs = [h for h in self._handles.values() if h.user_id in user_ids]
        for handle in theirs:
            handle.end("its user was removed")
            self._handles.pop((handle.session_id, handle.handle_id), None)
        return len(theirs)
