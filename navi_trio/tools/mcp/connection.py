"""Our connection to one configured MCP server: the actor that keeps a session with it.

Each attempt opens the transport (a child process over stdio, or streamable HTTP), runs
the SDK's `ClientSession` and waits until the connection breaks, then restarts with
exponential backoff; after `MAX_FAILURES` attempts in a row that never got ready it is
`failed` until a run needs it again. Meanwhile its tools answer "MCP server X is
restarting" at once.

A stdio child carries the process tag, so when the session ends every process still
carrying it is killed too, shielded and bounded; where cgroups are used, the child runs
in a cgroup of its own (``mcp-<server>``, under its entry's `limits`) and that group is
killed. The server is the daemon's, shared by sessions, so it is in no session's cgroup.

Calls run in the caller's task, inside the run's cancel scope: Stop cancels the request
and the SDK tells the server; `timeout_sec` is the SDK's request timeout.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import trio

from navi_trio import __version__
from navi_trio.backoff import backoff_delay
from navi_trio.errors import leaves
from navi_trio.profiles import MCP_PREFIX, McpServerConfig
from navi_trio.tools.base import ToolContext, ToolResult, cap_text
from navi_trio.tools.cgroups import CommandGroup, tree_for
from navi_trio.tools.mcp.content import result_text
from navi_trio.tools.mcp.schema import SchemaError, check_schema
from navi_trio.tools.mcp.stderr import log_lines, open_stderr_pipe
from navi_trio.tools.procs import TAG_VAR, new_tag
from navi_trio.tools.proctree import find_strays
from navi_trio.tools.runas import run_as
from navi_trio.tools.sandbox import dropped_argv

log = logging.getLogger("navi_trio.mcp")
stderr_log = logging.getLogger("navi_trio.mcp.stderr")

State = Literal["idle", "starting", "ready", "restarting", "failed"]
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
MAX_FAILURES = 5
STOP_GRACE = 3.0  # after the SDK's own shutdown: the tagged strays, then the stderr pipe
# OpenAI-style function names: what a tool name may hold, and how long it may be.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def tool_name(server: str, tool: str) -> str:
    return f"{MCP_PREFIX}{server}__{tool}"


class McpTool:
    """A tool of an MCP server, offered to the model as ``mcp__<server>__<tool>``."""

    def __init__(
        self, connection: McpConnection, remote: str, description: str, parameters: dict[str, Any]
    ) -> None:
        self.connection = connection
        self.remote = remote
        self.name = tool_name(connection.name, remote)
        self.description = description
        self.parameters = parameters
        self.backgroundable = connection.config.background
        self.read_only = connection.config.read_only  # no checkpoint before its calls

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await self.connection.call(self.remote, args, ctx)


class _Watched:
    """The session's read stream; sets `closed` when it ends (the server is gone). It takes
    out of a tools/list result each tool whose input schema is not an object, telling
    `skipped` (name, why): the SDK refuses the whole listing for one.
    """

    def __init__(self, inner: Any, closed: trio.Event, skipped: Callable[[str, str], None]) -> None:
        self._inner = inner
        self._closed = closed
        self._skipped = skipped

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            item = await self._inner.receive()
        except BaseException as exc:
            if not isinstance(exc, trio.Cancelled):
                self._closed.set()
            raise
        _drop_bad_tools(item, self._skipped)
        return item

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._closed.set()
        await self._inner.aclose()

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _drop_bad_tools(item: Any, skipped: Callable[[str, str], None]) -> None:
    """Remove, in place, the tools of a tools/list result (a result holding a "tools"
    list: no other method's does) whose input schema is not an object."""
    result = getattr(getattr(item, "message", None), "result", None)
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(result, dict) or not isinstance(tools, list):
        return
    kept = []
    for tool in tools:
        schema = tool.get("inputSchema") if isinstance(tool, dict) else None
        try:
            check_schema(schema)
        except SchemaError as exc:
            name = tool.get("name") if isinstance(tool, dict) else None
            skipped(str(name), str(exc))
            continue
        kept.append(tool)
    result["tools"] = kept


class McpConnection:
    """The actor of our connection to one server. State is read by others, changed
    only by `run`."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        tool_user: str = "",
        bwrap_path: Path | None = None,
        cgroup_owner: str | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.tool_user = tool_user  # NAVI_TOOL_USER: whom a root daemon starts it as
        self.bwrap_path = bwrap_path  # NAVI_BWRAP: what it starts through then
        # `procs.tag_owner` of the daemon whose cgroup tree a stdio child goes in; None:
        # no cgroups (NAVI_CGROUPS=0, or a brief start by `probe`).
        self.cgroup_owner = cgroup_owner
        self._leaf: CommandGroup | None = None  # the running child's cgroup, if any
        self.state: State = "idle"
        self.error: str | None = None
        self.tools: dict[str, McpTool] = {}  # by navi name, kept while restarting
        self.notes: list[str] = []  # warnings (schema cuts, skipped tools) not yet shown
        self.starts = 0
        self.ever_ready = False
        self.settled = trio.Event()  # the current start attempt is over, ready or not
        self._session: Any = None
        self._broken = trio.Event()
        self._retry = trio.Event()
        self._changed = trio.Event()
        self.scope = trio.CancelScope()

    def _set(self, state: State) -> None:
        self.state = state
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, state: State, starts: int = 1) -> None:
        """Wait until the server is in `state` after at least `starts` starts."""
        while not (self.state == state and self.starts >= starts):
            await self._changed.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        failures = 0
        with self.scope:
            while True:
                self.starts += 1
                self._set("starting" if self.starts == 1 else "restarting")
                self._broken = trio.Event()
                ready = await self._attempt()
                failures = 0 if ready else failures + 1
                self.settled.set()
                if failures >= MAX_FAILURES:
                    self._set("failed")
                    log.error(
                        "MCP server %s failed to start %d times in a row (%s); it starts "
                        "again when a run needs it",
                        self.name,
                        failures,
                        self.error,
                    )
                    self._retry = trio.Event()
                    await self._retry.wait()
                    failures = 0
                    continue
                self._set("restarting")
                delay = backoff_delay(max(failures, 1), base=BACKOFF_FIRST, cap=BACKOFF_MAX)
                log.warning("MCP server %s: %s; restarting in %g s", self.name, self.error, delay)
                await trio.sleep(delay)

    def retry(self) -> None:
        """A failed server tries again (a run needs it); `settled` is cleared for it."""
        if self.state == "failed":
            self.settled = trio.Event()
            self._retry.set()

    async def _attempt(self) -> bool:
        """One session: connect, list, serve until broken. True when it got ready."""
        ready = False
        timeout = self.config.timeout_sec
        waiting_for = "initialize"  # the request a silent server leaves unanswered
        try:
            async with self._connect(self._broken) as session:
                with trio.fail_after(timeout):
                    await session.initialize()
                    waiting_for = "tools/list"
                    listed = await _list_tools(session)
                self._install(listed)
                self._session = session
                self.error, ready, self.ever_ready = None, True, True
                self._set("ready")
                self.settled.set()
                log.info("MCP server %s ready: %d tool(s)", self.name, len(self.tools))
                await self._broken.wait()
                # Calls answer "restarting" from now on, not once the session has closed.
                self._session = None
                self.error = "the connection closed (the server exited or dropped it)"
                self._set("restarting")
        except* trio.TooSlowError:
            self.error = (
                f"no answer to {waiting_for} within {timeout:g} s (timeout_sec) while starting"
            )
        except* Exception as group:
            self.error = _describe(group)
        finally:
            self._session = None
        return ready

    @asynccontextmanager
    async def _connect(self, closed: trio.Event) -> AsyncIterator[Any]:
        from mcp.client.session import ClientSession
        from mcp_types import Implementation

        cfg = self.config
        async with AsyncExitStack() as stack:
            if cfg.command is not None:
                read, write = await self._stdio(stack)
            else:
                import httpx2
                from mcp.client.streamable_http import streamable_http_client

                client = httpx2.AsyncClient(
                    headers=dict(cfg.headers), timeout=httpx2.Timeout(30.0, read=300.0)
                )
                await stack.enter_async_context(client)
                assert cfg.url is not None
                read, write = await stack.enter_async_context(
                    streamable_http_client(cfg.url, http_client=client)
                )
            info = Implementation(name="navi_trio", version=__version__)
            watched = _Watched(read, closed, self._skip)
            session = ClientSession(watched, write, client_info=info)
            yield await stack.enter_async_context(session)

    async def _stdio(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        from mcp.client.stdio import StdioServerParameters, stdio_client

        cfg = self.config
        assert cfg.command is not None
        tag = new_tag()
        errlog, errread = open_stderr_pipe()
        drained = trio.Event()

        async def read_stderr() -> None:
            try:
                await log_lines(errread, stderr_log, self.name)
            finally:
                drained.set()

        nursery = await stack.enter_async_context(trio.open_nursery())
        nursery.start_soon(read_stderr)
        leaf = self._leaf = self._open_leaf()
        # Runs after the SDK's shutdown (the stack unwinds in reverse).
        stack.push_async_callback(_end_strays, tag, errread, drained, leaf)
        command, args, env = cfg.command, list(cfg.args), {**cfg.env, TAG_VAR: tag}
        # The child has its own copy of `errlog`: EOF comes when the last holder exits. Ours
        # is closed whatever happens here: `_end_strays` waits for that EOF (STOP_GRACE at
        # most), so a program that never started would otherwise cost that wait each time.
        with errlog:
            user = run_as(self.tool_user)  # never root (tools/runas.py)
            if user is not None or leaf is not None:
                # Started through a drop or bash, a missing program would only be a closed pipe.
                path = env.get("PATH") or os.environ.get("PATH")
                if shutil.which(command, path=path) is None:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
            if user is not None:
                command, *args = await dropped_argv(user, command, args, self.bwrap_path, path=path)
                env = {**user.env(), "HOME": user.home, **env}  # what the entry sets wins
            if leaf is not None:  # in its cgroup before it runs anything of the server
                command, *args = leaf.self_entry_argv([command, *args])
            params = StdioServerParameters(command=command, args=args, env=env, cwd=cfg.cwd)
            streams: tuple[Any, Any] = await stack.enter_async_context(
                stdio_client(params, errlog=errlog)
            )
        return streams

    def _open_leaf(self) -> CommandGroup | None:
        """A cgroup for the child about to start, under its entry's limits; None where
        cgroups are not used (or cannot be made now: logged, it runs without)."""
        tree = None if self.cgroup_owner is None else tree_for(self.cgroup_owner)
        if tree is None or self.config.command is None:
            return None
        try:
            return tree.server(self.name, self.config.limits)
        except OSError as exc:
            log.warning(
                "MCP server %s runs outside cgroups: cannot make its cgroup: %s", self.name, exc
            )
            return None

    def _install(self, listed: list[Any]) -> None:
        allow = self.config.tools
        tools: dict[str, McpTool] = {}
        for t in listed:
            if allow is not None and t.name not in allow:
                continue
            name = tool_name(self.name, t.name)
            if not _NAME.match(name):
                self._note(
                    f"tool {t.name!r} skipped: {name!r} is not a valid function name "
                    "(letters, digits, _ and -, 64 at most)"
                )
                continue
            try:
                schema, warning = check_schema(t.input_schema)
            except SchemaError as exc:
                self._note(f"tool {t.name!r} skipped: {exc}")
                continue
            if warning:
                self._note(f"tool {t.name!r}: {warning}")
            description = t.description or t.title or t.name
            tools[name] = McpTool(self, t.name, cap_text(description, 2000), schema)
        if allow is not None:
            missing = sorted(set(allow) - {t.name for t in listed})
            if missing:
                self._note(f"tools {', '.join(missing)} of the allow-list are not offered")
        self.tools = tools

    def _skip(self, tool: str, why: str) -> None:
        """A tool of the listing that cannot be offered (the allow-list's, if any)."""
        if self.config.tools is None or tool in self.config.tools:
            self._note(f"tool {tool!r} skipped: {why}")

    def _note(self, text: str) -> None:
        message = f"MCP server {self.name}: {text}"
        log.warning("%s", message)
        self.notes.append(message)

    def take_notes(self) -> list[str]:
        notes, self.notes = self.notes, []
        return notes

    def unavailable(self) -> str:
        why = f" ({self.error})" if self.error else ""
        if self.state == "failed" or not self.ever_ready:
            return f"MCP server {self.name} could not start{why}; its tools are not available"
        return f"MCP server {self.name} is restarting{why}; try again in a moment"

    async def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        session, broken = self._session, self._broken
        if session is None or self.state != "ready" or broken.is_set():
            return ToolResult.fail(self.unavailable())

        async def progress(done: float, total: float | None, message: str | None) -> None:
            ctx.emit({"progress": done, "total": total, "message": message})

        timeout = self.config.timeout_sec
        leaf = self._leaf
        hits = leaf.limit_hits() if leaf is not None else (0, 0)
        try:
            result = await session.call_tool(
                tool, args, read_timeout_seconds=timeout, progress_callback=progress
            )
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                return ToolResult.fail(
                    f"MCP server {self.name} did not answer {tool} within {timeout:g} s "
                    "(timeout_sec); the call was cancelled"
                )
            if exc.code == CONNECTION_CLOSED:
                broken.set()
                return ToolResult.fail(
                    f"MCP server {self.name} closed the connection during the call"
                    f"{self._struck(leaf, hits)}; it is restarting, so the call may not "
                    "have finished"
                )
            return ToolResult.fail(f"MCP server {self.name} refused {tool}: {exc.message}")
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            broken.set()
            return ToolResult.fail(f"MCP server {self.name} is unreachable: {exc}")
        text = cap_text(
            result_text(result.content, result.structured_content),
            ctx.settings.tool_output_max_chars,
        )
        if result.is_error:
            return ToolResult.fail(
                f"{self.name} {tool} failed{self._struck(leaf, hits)}", output=text
            )
        return ToolResult.success(text)

    def _struck(self, leaf: CommandGroup | None, before: tuple[int, int]) -> str:
        """The limits of the server's cgroup that struck since `before` (`limit_hits`),
        as a clause of a failed result ("" when none did)."""
        if leaf is None:
            return ""
        ooms, refused = leaf.limit_hits()
        limits, said = self.config.limits, ""
        if ooms > before[0]:
            said += f"; memory limit {limits.memory_mb} MB reached (the kernel killed a process)"
        if refused > before[1]:
            said += f"; process limit {limits.pids} reached (a fork or thread was refused)"
        return said


async def _list_tools(session: Any) -> list[Any]:
    """Every page of tools/list."""
    from mcp_types import PaginatedRequestParams

    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(100):  # a server that never stops paging is a broken one
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


async def _end_strays(
    tag: str, errread: trio.lowlevel.FdStream, drained: trio.Event, leaf: CommandGroup | None
) -> None:
    """Kill what is left of the child (its cgroup, else what still carries its tag),
    read the rest of its stderr, close it."""
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + STOP_GRACE
        if leaf is not None:
            await leaf.group.kill()
        else:
            strays = await trio.to_thread.run_sync(find_strays, None, TAG_VAR, tag)
            try:
                strays.signal(signal.SIGKILL)
                await strays.wait()
            finally:
                strays.close()
        await drained.wait()  # EOF once the last holder of the pipe is gone
    if leaf is not None:
        leaf.remove()  # a folder still held is removed with the daemon's tree
    await errread.aclose()  # whoever still holds it is not ours to wait for


def _describe(group: BaseException) -> str:
    parts = [f"{type(e).__name__}: {e}" if str(e) else type(e).__name__ for e in leaves(group)]
    return "; ".join(dict.fromkeys(parts)) or "unknown error"
