"""The terminal tool: one-shot commands, and persistent processes through the pool.

`run` executes a shell command in its own process group, streams its output coalesced
and rate-limited, and returns the exit code with the capped output; a stop kills the
whole group. `open`/`read`/`write`/`kill`/`list` use the session's persistent
processes. With ``ctx.sandbox`` set, `run` and `open` run under bwrap, or are refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict

import attrs
import trio

from navi_trio.errors import ConfigError, ToolInputError
from navi_trio.settings import Settings
from navi_trio.tools.args import NoArgs, action_of, action_schema, arg, parse
from navi_trio.tools.base import ToolContext, ToolResult, input_errors_fail
from navi_trio.tools.cgroups import SessionCgroup, tree_for
from navi_trio.tools.filesystem import resolve_dir
from navi_trio.tools.procs import CommandResult, ReadResult, passed_env, run_command, tag_owner
from navi_trio.tools.progress import OutputProgress
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs, run_as
from navi_trio.tools.sandbox import SandboxSpec
from navi_trio.tools.services import unavailable

READ_WAIT_MAX_SEC = 30.0
_COMMAND = "run / open: a bash command line"
_CWD = "run / open: folder to run in"
_HANDLE = 'read/write/kill: e.g. "p1"'


def timeout_arg(description: str) -> Any:
    """A command's optional timeout in seconds (capped by `read_timeout`)."""
    return arg(description, default=None, above=0, unit="seconds")


@attrs.frozen(kw_only=True)
class Run:
    command: str = arg(_COMMAND)
    timeout: float | None = timeout_arg("run: seconds before it is killed")
    cwd: str | None = arg(_CWD, default=None)


@attrs.frozen(kw_only=True)
class Open:
    command: str = arg(_COMMAND)
    cwd: str | None = arg(_CWD, default=None)


@attrs.frozen
class Handle:
    handle: str = arg(_HANDLE)


@attrs.frozen(kw_only=True)
class Write(Handle):
    text: str = arg("write: text for stdin (add \\n)", default="")
    eof: bool = arg("write: close stdin afterwards", default=False)


@attrs.frozen(kw_only=True)
class Read(Handle):
    wait: float = arg(
        "read: seconds to wait for output",
        default=0.0,
        minimum=0,
        maximum=READ_WAIT_MAX_SEC,
        unit="seconds",
    )
    max_chars: int | None = arg("read: at most this much", default=None, minimum=1)


ACTIONS: dict[str, type] = {
    "run": Run,
    "open": Open,
    "read": Read,
    "write": Write,
    "kill": Handle,
    "list": NoArgs,
}


def command_env(ctx: ToolContext) -> dict[str, str]:
    """What a command's environment adds to the allow-list (`procs.child_env`): the
    variables the profile's ``env`` names, and HOME = the session folder, the run's
    own (unless the profile passes the daemon's HOME on)."""
    env = passed_env(ctx.profile.env, ctx.config)
    env.setdefault("HOME", str(ctx.session_dir))
    return env


def read_timeout(timeout: float | None, settings: Settings) -> tuple[float, str]:
    """The timeout to use (capped at settings.terminal_timeout_sec) and a note if capped."""
    cap = settings.terminal_timeout_sec
    if timeout is None:
        return cap, ""
    if timeout > cap:
        return cap, f"[timeout capped at {cap:g} s]\n"
    return timeout, ""


def command_result(result: CommandResult, note: str = "") -> ToolResult:
    """The tool result for a finished `run_command`: non-zero exit is a failure."""
    output = note + (result.output if result.output else "(no output)")
    data = {"exit_code": result.exit_code, "duration_s": round(result.duration, 3)}
    if result.timed_out or result.memory_limit_mb is not None:
        return ToolResult.fail(result.status_text(), output=output, **data)
    if result.exit_code != 0:
        return ToolResult.fail(f"the command {result.status_text()}", output=output, **data)
    return ToolResult.success(f"{output}\n[exit code 0]", **data)


@asynccontextmanager
async def command_folder(ctx: ToolContext, raw: str | None) -> AsyncIterator[Place]:
    """Where a command runs (`resolve_dir`) and the roots its sandbox binds, held open
    until the block ends (once the process started)."""
    roots = await trio.to_thread.run_sync(ctx.call_roots)
    try:
        cwd = await trio.to_thread.run_sync(resolve_dir, ctx, raw, roots)
        try:
            yield Place(cwd, roots.all())
        finally:
            cwd.close()
    finally:
        roots.close()


@attrs.frozen
class Place:
    """A command's folder and the run's roots, held (see `command_folder`)."""

    cwd: Root
    roots: tuple[Root, ...]


async def run_in(
    ctx: ToolContext,
    place: Place,
    command: str | Sequence[str],
    time_limit: float,
    pass_fds: Sequence[int] = (),
) -> CommandResult:
    """`run_command` for a call of `ctx`, in `place`: its sandbox, environment, live
    output and caps, as the user tools run as (never root)."""
    return await run_command(
        command,
        cwd=place.cwd,
        time_limit=time_limit,
        progress=output_progress(ctx),
        max_chars=ctx.settings.tool_output_max_chars,
        pass_fds=pass_fds,
        **command_options(ctx, place),
    )


class CommandOptions(TypedDict):
    """How every command of a call runs: its sandbox, environment, tag, roots, user and
    cgroup."""

    sandbox: SandboxSpec | None
    bwrap_path: Path | None
    env: dict[str, str]
    owner: str
    roots: tuple[Root, ...]
    user: RunAs | None
    cgroup: SessionCgroup | None


def command_options(ctx: ToolContext, place: Place) -> CommandOptions:
    """The options of `run_command` (and the pool's `open`) for a command of `ctx` in
    `place`: the run's sandbox, the environment allow-list, the user tools run as, the
    session's cgroup."""
    return CommandOptions(
        sandbox=ctx.sandbox,
        bwrap_path=ctx.settings.bwrap_path,
        env=command_env(ctx),
        owner=tag_owner(ctx.settings.data_dir),
        roots=place.roots,
        user=command_user(ctx),
        cgroup=session_cgroup(ctx),
    )


def session_cgroup(ctx: ToolContext) -> SessionCgroup | None:
    """Where the commands of `ctx`'s session go (`cgroups`), under its profile's limits;
    None where cgroups are off (NAVI_CGROUPS) or cannot be used here."""
    if not ctx.settings.cgroups:
        return None
    tree = tree_for(tag_owner(ctx.settings.data_dir))
    return None if tree is None else SessionCgroup(tree, ctx.session_id, ctx.profile.limits)


def command_user(ctx: ToolContext) -> RunAs | None:
    """Whom a command of `ctx` runs as (never root)."""
    try:
        return run_as(ctx.settings.tool_user)
    except ConfigError as exc:
        raise ToolInputError(str(exc)) from None


def output_progress(ctx: ToolContext) -> OutputProgress:
    """The live view of a command's output for this call (see `progress`)."""
    return OutputProgress(
        ctx.emit,
        interval=ctx.settings.tool_progress_interval_sec,
        max_chars=ctx.settings.tool_progress_max_chars,
    )


class TerminalTool:
    name = "terminal"
    parameters = action_schema(ACTIONS)

    def __init__(self, settings: Settings | None = None) -> None:
        default = (settings or Settings()).terminal_timeout_sec
        self.description = (
            "Run shell commands (bash). `run` waits for the command and returns its exit "
            f"code and output (timeout default and maximum {default:g} s); `open` starts a "
            "persistent process you talk to with read / write / kill; `list` shows them. "
            "Manual: read `manual:terminal` with the filesystem tool."
        )

    @input_errors_fail
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        action = action_of(ACTIONS, args)
        if action == "run":
            return await self._run(parse(Run, args), ctx)
        pool = ctx.services.processes if ctx.services else None
        if pool is None:
            return unavailable("persistent processes (terminal open/read/write/kill)")
        parsed: object = parse(ACTIONS[action], args)
        if isinstance(parsed, Open):
            return await self._open(pool, parsed, ctx)
        if isinstance(parsed, Read):
            return await self._read(pool, parsed, ctx)
        if isinstance(parsed, Write):
            return await self._write(pool, parsed, ctx)
        if isinstance(parsed, Handle):
            result = await pool.kill(ctx.session_id, parsed.handle)
            return _format_read(parsed.handle, result, killed=True)
        return self._list(pool, ctx)

    async def _run(self, args: Run, ctx: ToolContext) -> ToolResult:
        timeout, note = read_timeout(args.timeout, ctx.settings)
        try:
            async with command_folder(ctx, args.cwd) as place:
                result = await run_in(ctx, place, args.command, timeout)
        except OSError as exc:
            return ToolResult.fail(f"cannot start the command: {exc.strerror or exc}")
        return command_result(result, note)

    async def _open(self, pool: Any, args: Open, ctx: ToolContext) -> ToolResult:
        # A "background" flag is accepted and ignored: an opened process is persistent.
        command = args.command
        try:
            async with command_folder(ctx, args.cwd) as place:
                handle = await pool.open(
                    ctx.session_id,
                    command,
                    place.cwd,
                    user_id=ctx.user_id,
                    **command_options(ctx, place),
                )
        except OSError as exc:
            return ToolResult.fail(f"cannot start the process: {exc.strerror or exc}")
        return ToolResult.success(
            f"started process {handle}: {command}\nRead its output with "
            f'{{"action": "read", "handle": "{handle}", "wait": 2}}.',
            handle=handle,
        )

    def _list(self, pool: Any, ctx: ToolContext) -> ToolResult:
        infos = pool.list(ctx.session_id)
        if not infos:
            return ToolResult.success("no open processes")
        lines = []
        for info in infos:
            state = "running" if info.running else f"exited (code {info.exit_code})"
            state += f": {info.ended}" if info.ended else ""
            lines.append(f"{info.handle_id}  pid {info.pid}  {state}  {info.command}")
        return ToolResult.success("\n".join(lines))

    async def _read(self, pool: Any, args: Read, ctx: ToolContext) -> ToolResult:
        cap = ctx.settings.tool_output_max_chars
        max_chars = cap if args.max_chars is None else min(args.max_chars, cap)
        result = await pool.read(ctx.session_id, args.handle, max_chars, args.wait)
        return _format_read(args.handle, result)

    async def _write(self, pool: Any, args: Write, ctx: ToolContext) -> ToolResult:
        text, eof = args.text, args.eof
        if not text and not eof:
            raise ToolInputError("argument 'text' is required (or set 'eof': true)")
        await pool.write(ctx.session_id, args.handle, text, eof)
        closed = " and closed its input" if eof else ""
        return ToolResult.success(f"sent {len(text)} characters to {args.handle}{closed}")


def _format_read(handle: str, result: ReadResult, killed: bool = False) -> ToolResult:
    parts = []
    if result.dropped:
        parts.append(f"[… {result.dropped} earlier characters were dropped (buffer full) …]")
    parts.append(result.output if result.output else "(no new output)")
    if result.pending:
        parts.append(f"[{result.pending} more characters waiting: read again]")
    if killed:
        parts.append(f"[{handle} killed]")
    elif result.ended:
        parts.append(f"[{handle} ended by navi: {result.ended}]")
    elif not result.running:
        parts.append(f"[{handle} exited with code {result.exit_code}]")
    return ToolResult.success("\n".join(parts), running=result.running, exit_code=result.exit_code)
