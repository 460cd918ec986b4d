"""A command's output: read in large blocks, split into lines, kept as head and tail.

Lines (split UTF-8 sequences survive) go a block at a time to an `OutputProgress`
and/or a per-line callback; the result keeps only head and tail within a cap.
"""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

import attrs
import trio

from navi_trio.errors import ToolInputError
from navi_trio.tools.cgroups import CommandGroup, SessionCgroup
from navi_trio.tools.procs._spawn import (
    KILL_GRACE_SEC,
    child_env,
    kill_group,
    new_tag,
    open_in,
    shell_argv,
    signal_group,
)
from navi_trio.tools.progress import OutputProgress
from navi_trio.tools.result import cap_text
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs
from navi_trio.tools.sandbox import SandboxSpec, process_cwd, sandboxed_argv

DRAIN_SEC = 1.0  # reading what is left in the pipe after the group is gone
MAX_LINE_CHARS = 4000  # a "line" longer than this is streamed in pieces
READ_CHUNK = 65536

LineCallback = Callable[[str], None]
LinesCallback = Callable[[list[str]], None]


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


async def wait_and_drain(
    process: trio.Process,
    on_text: Callable[[str], None],
    on_lines: LinesCallback | None,
    progress: OutputProgress | None = None,
    on_errors: Callable[[str], None] | None = None,
    cgroup: CommandGroup | None = None,
) -> None:
    """Stream output until the leader exits, then kill its leftovers (its process group,
    or all its `cgroup` holds) and drain the pipe (and stderr's, to `on_errors`, when it
    is a pipe of its own)."""
    assert process.stdout is not None
    eofs = [trio.Event()]
    async with trio.open_nursery() as nursery:
        if progress is not None:
            nursery.start_soon(progress.run)
        nursery.start_soon(_pump, process.stdout, on_text, on_lines, eofs[0])
        if on_errors is not None and process.stderr is not None:
            eofs.append(trio.Event())
            nursery.start_soon(_pump, process.stderr, on_errors, None, eofs[1])
        await process.wait()
        # Anything still in the group is an orphan-to-be that also holds the pipe open.
        signal_group(process.pid, signal.SIGKILL)
        if cgroup is not None:
            with trio.CancelScope(shield=True):
                await cgroup.group.kill()
        with trio.move_on_after(DRAIN_SEC):
            for eof in eofs:
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
    # With `stderr_max`: stderr on its own (head+tail capped); `output` is stdout only.
    errors: str = ""
    # How many characters the output had, before the cap.
    output_chars: int = 0
    # The memory limit (MiB) of its cgroup, when the kernel killed a process for it.
    memory_limit_mb: int | None = None

    def status_text(self) -> str:
        if self.memory_limit_mb is not None:
            return (
                f"memory limit {self.memory_limit_mb} MB reached (the kernel killed a "
                "process of the command)"
            )
        if self.timed_out:
            return f"timed out after {self.timeout:g} s (the process group was killed)"
        if self.exit_code is not None and self.exit_code < 0:
            return f"killed by signal {-self.exit_code}"
        return f"exited with code {self.exit_code}"


async def run_command(
    command: str | Sequence[str],
    *,
    cwd: Path | Root,
    time_limit: float,
    on_line: LineCallback | None = None,
    progress: OutputProgress | None = None,
    max_chars: int = 20000,
    env: Mapping[str, str] | None = None,
    grace: float = KILL_GRACE_SEC,
    sandbox: SandboxSpec | None = None,
    bwrap_path: Path | None = None,
    owner: str | None = None,
    roots: Sequence[Root] = (),
    pass_fds: Sequence[int] = (),
    user: RunAs | None = None,
    stdin: bytes | None = None,
    stderr_max: int | None = None,
    cgroup: SessionCgroup | None = None,
) -> CommandResult:
    """Run `command` in its own process group until it exits or `time_limit` passes.

    stdin is /dev/null, or the bytes `stdin` (from an anonymous file: no pipe to fill).
    With `stderr_max`, stderr is kept apart. The output is kept as head and tail within
    `max_chars`, however much is printed. On timeout the group is killed and the output so
    far returned; if the caller is cancelled the group is killed and `trio.Cancelled`
    propagates. OSError when the process cannot start. With a `sandbox` it runs under
    bwrap, or raises `SandboxUnavailableError` (never unsandboxed instead). A held `cwd`
    and `roots` are used through their fds, never by path; a `user` is never root; with a
    `cgroup` the process and all it forks run in a leaf of their own and die with it.
    """
    if time_limit <= 0:
        raise ToolInputError(f"the time limit must be positive (got {time_limit:g})")
    tag = new_tag(owner)
    with ExitStack() as stack:
        cmd = await sandboxed_argv(
            sandbox, shell_argv(command), cwd, bwrap_path, roots=roots, stack=stack, user=user
        )
        source: int = subprocess.DEVNULL
        if stdin is not None:
            source = memory_file(stdin)
            stack.callback(os.close, source)
        started = trio.current_time()
        process, leaf = await open_in(
            cmd.argv,
            cgroup,
            cwd=process_cwd(cmd, cwd),
            env=child_env({**(env or {}), **(user.env() if user else {})}, tag=tag),
            stdin=source,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if stderr_max is None else subprocess.PIPE,
            start_new_session=True,
            pass_fds=(*cmd.fds, *pass_fds),
            **(user.popen() if user and not cmd.switches_user else {}),
        )
    output = HeadTail(max_chars)
    errors = HeadTail(stderr_max or 1)
    on_lines = _lines_to(on_line, progress)
    on_errors = None if stderr_max is None else errors.add
    oom = 0
    try:
        with trio.move_on_after(time_limit) as scope:
            await wait_and_drain(process, output.add, on_lines, progress, on_errors, cgroup=leaf)
    finally:
        await kill_group(process, grace, tag, cgroup=leaf)
        if leaf is not None:
            oom = leaf.oom_kills()
            leaf.remove()
        if progress is not None:
            progress.flush()
    return CommandResult(
        exit_code=None if scope.cancelled_caught else process.returncode,
        output=output.text(),
        timed_out=scope.cancelled_caught,
        timeout=time_limit,
        duration=trio.current_time() - started,
        errors=errors.text() if stderr_max is not None else "",
        output_chars=output.total,
        memory_limit_mb=leaf.memory_mb if leaf is not None and oom else None,
    )


def memory_file(data: bytes, name: str = "navi-stdin") -> int:
    """An anonymous file holding `data`, at its start: a process's stdin or a script."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
