"""Child processes without orphans.

Every process a tool starts is the leader of a new session (``start_new_session=True``),
so it and everything it forks share one process group. When the owner of a process is
done with it — the command finished, its timeout fired, its call or job was cancelled,
or the daemon is shutting down — `kill_group` signals the *whole group*, under a
shielded scope with a deadline, and reaps the leader: SIGTERM, a short grace for the
leader, then SIGKILL when the command ended or timed out; at once (frozen, looked at,
SIGKILLed) when its owner was cancelled — a stop, a task cancel, the shutdown: those
mean now. Background children (``sleep 300 &``) die with their command.

A process that calls ``setsid`` leaves the group. To catch those too, every command's
environment carries a tag (``NAVI_PROC_TAG``) that its descendants inherit, and
`kill_group` also kills (see `proctree`) every process below the leader by parent id
and every process whose environment carries the tag, even after it was reparented.
Only a descendant that leaves the session, empties its environment and loses its
parent escapes.

A tool process gets an allow-listed environment (`child_env`): the locale, terminal,
user, shell, PATH and temp-folder variables of the daemon (`PASSED_VARS`, ``LC_*``),
plus what its caller adds (the tools: the names the profile's ``env`` lists, and HOME).
Everything else (cloud keys, tokens, database URLs) stays in the daemon.

The tag's value starts with its owner (`tag_owner`: a digest of the data folder, the
daemon's pid and start time), so that a daemon starting on a data folder finds what a
dead daemon of that folder left running (`kill_orphans`: a ``full``-mode command that
outlived a SIGKILL) and leaves a live daemon's processes alone.

A sandboxed command (`sandbox`) is led by bwrap, with the command in its own PID
namespace: killing the group kills bwrap, and with it everything inside, ``setsid``
daemons included (the kernel empties a PID namespace whose init is gone).

Two ways to run something:

- `run_command` — run to completion (or timeout) and return the output, read in large
  blocks and kept only as head and tail within a cap; output lines go, a block at a
  time, to an `OutputProgress` (coalesced, rate-limited live events) and/or a per-line
  callback (stdout and stderr merged).
- `ProcessPool` — an actor owning persistent processes (``terminal open``): started by
  the runtime with ``await nursery.start(pool.run)``; each process lives in the pool's
  nursery, its output goes to a bounded buffer read with `read`; a session sees only
  its own handles. Cancelling `run` (daemon shutdown) kills every group it owns.
"""

from __future__ import annotations

import codecs
import hashlib
import itertools
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import trio

from navi_trio.errors import ToolInputError
from navi_trio.profiles import is_secret as is_secret
from navi_trio.tools.proctree import (
    PROC,
    Query,
    Strays,
    find_strays_many,
    process_count,
    start_time,
    tag_values,
)
from navi_trio.tools.progress import OutputProgress
from navi_trio.tools.result import cap_text
from navi_trio.tools.sandbox import SandboxSpec, sandboxed_argv

KILL_GRACE_SEC = 2.0  # between SIGTERM and SIGKILL
DRAIN_SEC = 1.0  # reading what is left in the pipe after the group is gone
MAX_LINE_CHARS = 4000  # a "line" longer than this is streamed in pieces
WRITE_TIMEOUT_SEC = 5.0
READ_CHUNK = 65536

LineCallback = Callable[[str], None]
LinesCallback = Callable[[list[str]], None]
TAG_VAR = "NAVI_PROC_TAG"
# What every tool process gets of the daemon's environment (and every LC_* variable).
PASSED_VARS = (
    "PATH", "HOME", "LANG", "LANGUAGE", "TERM", "COLORTERM", "TZ", "USER", "LOGNAME",
    "SHELL", "TMPDIR",
)  # fmt: skip
ORPHAN_WAIT_SEC = 5.0
log = logging.getLogger(__name__)


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


def passed_env(names: Sequence[str]) -> dict[str, str]:
    """The daemon's values of the variables `names` (a profile's ``env``) that are set;
    never navi's own secrets."""
    return {n: os.environ[n] for n in names if n in os.environ and not is_secret(n)}


def child_env(extra: Mapping[str, str] | None = None, *, tag: str | None = None) -> dict[str, str]:
    """The environment of a tool process: the allow-listed part of ours, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k in PASSED_VARS or k.startswith("LC_")}
    env["PYTHONUNBUFFERED"] = "1"  # so Python children stream their lines
    if tag is not None:
        env[TAG_VAR] = tag
    if extra:
        env.update(extra)
    return env


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # nobody left in the group


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
) -> None:
    """Kill the process group led by `process`, its strays, and reap the leader.

    Strays are the processes that left the group with ``setsid``: below the leader by
    parent id, or carrying `tag` in their environment (see `proctree`). Safe to call
    when the leader already exited: whatever it left behind is killed. Runs shielded,
    so it completes even inside a cancelled scope.

    Two ways, chosen by `at_once` (default: whether the caller's scope is cancelled —
    a stop, a task cancel, the daemon shutting down):

    - graceful (the command ended, timed out, or ``terminal kill``): SIGTERM, up to
      `grace` for the leader to exit, SIGKILL, then a second look for strays, as the
      group ran on during the grace and may have started some.
    - at once (the user asked to stop *now*): the group is frozen (SIGSTOP) before the
      look for strays, then SIGKILLed. A frozen group cannot fork or ``setsid``, so
      when that one look found no strays there is nothing to look for again; only
      strays found (they ran on during the look) cost a second one.
    """
    if at_once is None:
        at_once = trio.current_effective_deadline() == -math.inf
    pgid = process.pid  # the leader of a new session: its pid is the group id
    with trio.CancelScope(shield=True):
        with trio.move_on_after(grace + 5.0):
            # Strays start after the leader: older processes are skipped cheaply. Read
            # only while the leader is unreaped (a reaped leader's pid may be reused).
            since = start_time(process.pid) if process.returncode is None else None
            if at_once:
                _signal_group(pgid, signal.SIGSTOP)
            # Before the leader dies, while its descendants still hang below it.
            strays = await _find_strays(process, tag, since)
            try:
                if at_once:
                    _signal_group(pgid, signal.SIGKILL)
                    # The frozen members of the group did nothing during the look.
                    again = bool(strays.outside)
                else:
                    if process.returncode is None:
                        _signal_group(pgid, signal.SIGTERM)
                        strays.signal(signal.SIGTERM)
                        with trio.move_on_after(grace):
                            await process.wait()
                    # Always: grandchildren may ignore SIGTERM or outlive their parent.
                    _signal_group(pgid, signal.SIGKILL)
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
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                await stream.aclose()


class LineSplitter:
    """Bytes in, complete text lines out; decoding survives split UTF-8 sequences."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, data: bytes | bytearray) -> tuple[str, list[str]]:
        """The decoded text of `data`, and the lines it completed."""
        text = self._decoder.decode(data)
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        while len(self._partial) > MAX_LINE_CHARS:
            lines.append(self._partial[:MAX_LINE_CHARS])
            self._partial = self._partial[MAX_LINE_CHARS:]
        return text, [line.rstrip("\r") for line in lines]

    def flush(self) -> tuple[str, list[str]]:
        text = self._decoder.decode(b"", final=True)
        rest = self._partial + text
        self._partial = ""
        return text, ([rest.rstrip("\r")] if rest else [])


class HeadTail:
    """Keeps the head and the tail of a long text, within a fixed memory bound."""

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 1)
        self.total = 0
        self._head = ""
        self._tail = ""

    def add(self, text: str) -> None:
        self.total += len(text)
        room = self.limit - len(self._head)
        if room > 0:
            self._head += text[:room]
            text = text[room:]
        if text:
            self._tail = (self._tail + text)[-self.limit :]

    def text(self) -> str:
        whole = self._head + self._tail
        if len(whole) == self.total:  # nothing was dropped: cap it the usual way
            return cap_text(whole, self.limit)
        head = self.limit * 2 // 3
        tail = self.limit - head
        cut = self.total - head - tail
        return f"{self._head[:head]}\n[… {cut} characters cut …]\n{self._tail[-tail:]}"


async def _pump(
    stream: trio.abc.ReceiveStream,
    on_text: Callable[[str], None],
    on_lines: LinesCallback | None,
    eof: trio.Event,
) -> None:
    # Large blocks, and lines handed on a block at a time: a line-by-line loop over
    # millions of short lines is what made big outputs slow.
    splitter = LineSplitter()
    try:
        while data := await stream.receive_some(READ_CHUNK):
            text, lines = splitter.feed(data)
            on_text(text)
            if on_lines is not None and lines:
                on_lines(lines)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        pass  # closed by kill_group: the process is gone
    finally:
        text, lines = splitter.flush()
        on_text(text)
        if on_lines is not None and lines:
            on_lines(lines)
        eof.set()


async def _wait_and_drain(
    process: trio.Process,
    on_text: Callable[[str], None],
    on_lines: LinesCallback | None,
    progress: OutputProgress | None = None,
) -> None:
    """Stream output until the leader exits, then kill its leftovers and drain the pipe."""
    assert process.stdout is not None
    eof = trio.Event()
    async with trio.open_nursery() as nursery:
        if progress is not None:
            nursery.start_soon(progress.run)
        nursery.start_soon(_pump, process.stdout, on_text, on_lines, eof)
        await process.wait()
        # Anything still in the group is an orphan-to-be that also holds the pipe open.
        _signal_group(process.pid, signal.SIGKILL)
        with trio.move_on_after(DRAIN_SEC):
            await eof.wait()
        nursery.cancel_scope.cancel()


def _lines_to(
    on_line: LineCallback | None, progress: OutputProgress | None
) -> LinesCallback | None:
    if on_line is None:
        return None if progress is None else progress.add

    def both(lines: list[str]) -> None:
        for line in lines:
            on_line(line)
        if progress is not None:
            progress.add(lines)

    return both


@attrs.frozen
class CommandResult:
    exit_code: int | None  # None when it timed out (the group was killed)
    output: str  # merged stdout+stderr, head+tail capped
    timed_out: bool
    timeout: float
    duration: float

    def status_text(self) -> str:
        if self.timed_out:
            return f"timed out after {self.timeout:g} s (the process group was killed)"
        if self.exit_code is not None and self.exit_code < 0:
            return f"killed by signal {-self.exit_code}"
        return f"exited with code {self.exit_code}"


async def run_command(
    command: str | Sequence[str],
    *,
    cwd: Path,
    time_limit: float,
    on_line: LineCallback | None = None,
    progress: OutputProgress | None = None,
    max_chars: int = 20000,
    env: Mapping[str, str] | None = None,
    grace: float = KILL_GRACE_SEC,
    sandbox: SandboxSpec | None = None,
    bwrap_path: Path | None = None,
    owner: str | None = None,
) -> CommandResult:
    """Run `command` in its own process group until it exits or `time_limit` passes.

    stdin is /dev/null. Output lines go to `progress` (coalesced, rate-limited) and/or
    `on_line` (each line); the result keeps only the head and tail of the output, within
    `max_chars`, however much is printed. On timeout the group is killed and the output
    so far returned; if the caller is cancelled the group is killed and `trio.Cancelled`
    propagates. Raises OSError when the process cannot be started (e.g. `cwd` does not
    exist). With a `sandbox` the command runs under bwrap (see `sandbox`); when bwrap
    cannot run here, raises `SandboxUnavailableError` instead of running it unsandboxed.
    `env` is added to the allow-listed environment (`child_env`); `owner` (`tag_owner`)
    starts the process tag.
    """
    if time_limit <= 0:
        raise ToolInputError(f"the time limit must be positive (got {time_limit:g})")
    argv = await sandboxed_argv(sandbox, shell_argv(command), cwd, bwrap_path)
    started = trio.current_time()
    tag = new_tag(owner)
    process = await trio.lowlevel.open_process(
        argv,
        cwd=str(cwd),
        env=child_env(env, tag=tag),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    output = HeadTail(max_chars)
    on_lines = _lines_to(on_line, progress)
    try:
        with trio.move_on_after(time_limit) as scope:
            await _wait_and_drain(process, output.add, on_lines, progress)
    finally:
        await kill_group(process, grace, tag)
        if progress is not None:
            progress.flush()
    return CommandResult(
        exit_code=None if scope.cancelled_caught else process.returncode,
        output=output.text(),
        timed_out=scope.cancelled_caught,
        timeout=time_limit,
        duration=trio.current_time() - started,
    )


@attrs.frozen
class ProcessInfo:
    handle_id: str
    command: str
    pid: int
    running: bool
    exit_code: int | None
    cwd: str


@attrs.frozen
class ReadResult:
    output: str
    dropped: int  # characters lost because the buffer overflowed before this read
    pending: int  # characters still buffered (the read hit max_chars)
    running: bool
    exit_code: int | None


class _Handle:
    def __init__(
        self, session_id: str, handle_id: str, command: str, cwd: Path, process: trio.Process
    ) -> None:
        self.session_id = session_id
        self.handle_id = handle_id
        self.command = command
        self.cwd = cwd
        self.process = process
        self.scope = trio.CancelScope()
        self.pending = ""
        self.dropped = 0
        self.changed = trio.Event()  # set when output arrives or the process ends
        self.done = trio.Event()
        self.exit_code: int | None = None
        self.write_lock = trio.Lock()

    def info(self) -> ProcessInfo:
        return ProcessInfo(
            handle_id=self.handle_id,
            command=self.command,
            pid=self.process.pid,
            running=not self.done.is_set(),
            exit_code=self.exit_code,
            cwd=str(self.cwd),
        )


class ProcessPool:
    """Persistent processes per session, owned by one actor (see the module docstring)."""

    def __init__(
        self,
        *,
        buffer_chars: int = 64_000,
        max_per_session: int = 8,
        grace: float = KILL_GRACE_SEC,
    ) -> None:
        self.buffer_chars = buffer_chars
        self.max_per_session = max_per_session
        self.grace = grace
        self._nursery: trio.Nursery | None = None
        self._handles: dict[tuple[str, str], _Handle] = {}
        self._counters: dict[str, itertools.count[int]] = {}

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                # Each process task kills its own group as the cancellation reaches it.
                self._nursery = None

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
        cwd: Path,
        *,
        sandbox: SandboxSpec | None = None,
        bwrap_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        owner: str | None = None,
    ) -> str:
        """Start `command` (through the shell) in `cwd`; returns its handle id ("p1" …).

        With a `sandbox` it runs under bwrap, or is refused (`SandboxUnavailableError`);
        `env` and `owner` as for `run_command`.
        """
        # First, before the checks: they must not go stale across an await.
        argv = await sandboxed_argv(sandbox, shell_argv(command), cwd, bwrap_path)
        nursery = self._nursery
        if nursery is None:
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
        handle: _Handle = await nursery.start(
            self._serve, session_id, handle_id, command, argv, cwd, child_env(env), owner
        )
        return handle.handle_id

    async def _serve(
        self,
        session_id: str,
        handle_id: str,
        command: str,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        owner: str | None,
        task_status: trio.TaskStatus[_Handle] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        tag = new_tag(owner)
        process = await trio.lowlevel.open_process(
            argv,
            cwd=str(cwd),
            env={**env, TAG_VAR: tag},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle = _Handle(session_id, handle_id, command, cwd, process)
        self._handles[(session_id, handle_id)] = handle
        try:
            with handle.scope:
                task_status.started(handle)
                await _wait_and_drain(process, lambda text: self._buffer(handle, text), None)
        finally:
            await kill_group(process, self.grace, tag)
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
        )

    async def write(self, session_id: str, handle_id: str, text: str, eof: bool = False) -> None:
        """Send `text` to the process's stdin; `eof` closes stdin afterwards."""
        handle = self._get(session_id, handle_id)
        stdin = handle.process.stdin
        assert stdin is not None
        if handle.done.is_set():
            raise ToolInputError(f"process {handle_id} has exited (code {handle.exit_code})")
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
        handle.scope.cancel()
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
    """SIGKILL what dead daemons of `data_dir` left running; their pids (for the log).

    Run at a daemon's start: a ``full``-mode command (no sandbox to take it down) and
    what it started outlive a SIGKILLed daemon. A live daemon's processes (another
    ``navi serve`` or ``navi run`` on the same folder) carry a live owner and stay.
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
            len(killed), data_dir, " ".join(map(str, killed)),
        )  # fmt: skip
    return killed


def python_argv(script: Path) -> list[str]:
    """Isolated (-I), unbuffered (-u) Python running `script`."""
    return [sys.executable, "-I", "-u", str(script)]
