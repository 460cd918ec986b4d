"""`navi mcp serve`: navi_trio as a Model Context Protocol server on stdio.

Another agent (Claude Code, Codex …) calls its tools: ``ask`` runs a message as one
turn and returns the answer (with progress notifications while it runs), ``sessions``
lists the newest sessions, ``rewind`` and ``fork`` undo or branch one. Each call goes
where `navi run` would send it; a private daemon is opened at the first such call and
kept until the server exits, so a turn's background jobs go on between calls.

A cancelled call stops its run as Ctrl-C stops `navi run`. An approval is asked of the
client through elicitation where it supports it, else denied, and the answer's notes
say so. Bad arguments are a tool error naming the problem. stdout carries nothing but
the protocol: logs go to stderr.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import attrs
import trio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, InputRequiredResult, TextContent
from pydantic import BaseModel, Field

from navi_trio import __version__, wire
from navi_trio.api.endpoint import Endpoint, RunTarget
from navi_trio.cli.common import config_source
from navi_trio.cli.mcp_approve import NO_ELICITATION, Asker, approver, elicitor, in_rounds
from navi_trio.cli.mcp_ask import (
    STOP_GRACE,
    AskFeed,
    ProgressPump,
    Stopper,
    follow_stopping_on_cancel,
    one_error,
)
from navi_trio.cli.mcp_rewind import add_rewind_tools
from navi_trio.cli.mcp_rounds import Parked, Rounds
from navi_trio.cli.mcp_sessions import SessionList, add_sessions_tool, sessions_from_daemon
from navi_trio.cli.rewinds import Rewinds
from navi_trio.cli.runner import RemoteRun, RunRequest, follow, new_session_id, private_endpoint
from navi_trio.errors import ConfigError, NaviError, UsageError
from navi_trio.llm.factory import choose_backend
from navi_trio.settings import Settings
from navi_trio.store.sqlite import check_session_id

if TYPE_CHECKING:
    from navi_trio.api.redial import Redialing

log = logging.getLogger(__name__)


class AskResult(BaseModel):
    answer: str = Field(description="the final answer of the turn")
    session_id: str = Field(description="pass it to `ask` again to continue this session")
    reason: str = Field(description="complete | max_iterations | error | context_too_large")
    notes: list[str] = Field(description="warnings and denied tool calls of the turn")


@attrs.frozen
class ServeOptions:
    target: RunTarget
    settings: Settings  # for a private daemon
    llm_configured: bool  # else `choose_backend` looks for Ollama / the local model
    profile: str | None = None  # for new sessions when a call names none
    mode: str | None = None


class NaviBridge:
    """What the tools do, through the daemon or a private one of this process."""

    def __init__(self, options: ServeOptions, nursery: trio.Nursery) -> None:
        self.options = options
        self._nursery = nursery
        self._private: Endpoint | None = None
        self._opening = trio.Lock()
        self._holding = False
        self._closed = trio.Event()  # the private daemon closed (once opened)
        self.rounds = Rounds(nursery)  # asks whose runs go on between their calls

    async def endpoint(self) -> Endpoint:
        """The daemon asked for or answering, else the private one: opened at the first
        call that needs it and kept until the server exits (so a turn's background jobs
        go on between calls; they end with the server)."""
        found = await self.options.target.daemon()
        if found is not None:
            return Endpoint(*found)
        async with self._opening:
            if self._private is None:
                self._private = await self._nursery.start(self._hold_private)
            return self._private

    async def _hold_private(self, *, task_status: trio.TaskStatus[Endpoint]) -> None:
        opts = self.options
        self._holding, self._closed = True, trio.Event()
        try:
            choice = await choose_backend(opts.settings, os.environ, configured=opts.llm_configured)
            if choice.note:
                log.warning("%s", choice.note)
            source = config_source(choice.settings)
            async with private_endpoint(choice.settings, source) as endpoint:
                log.info("runtime open in this process (db %s)", choice.settings.db_path)
                task_status.started(endpoint)
                await trio.sleep_forever()
        finally:
            self._private = None
            self._holding = False
            self._closed.set()

    async def wait_closed(self) -> None:
        """Until the private daemon (if one is open) has closed."""
        if self._holding:
            await self._closed.wait()

    async def ask(
        self,
        message: str,
        session_id: str | None,
        profile: str | None,
        cwd: str | None,
        report: Callable[[float, str], Awaitable[None]],
        on_busy: str | None = None,
        asker: Asker | str = NO_ELICITATION,
        on_run: Callable[[Callable[[], object]], None] | None = None,
    ) -> CallToolResult:
        """`asker`: how to ask the client about an approval (a string: why it cannot);
        `on_run` is given the run's stop once it runs."""
        try:
            if not message.strip():
                raise UsageError("message is empty")
            if on_busy is not None and on_busy not in wire.ON_BUSY:
                raise UsageError(
                    f"on_busy must be one of {', '.join(wire.ON_BUSY)}, not {on_busy!r}"
                )
            if session_id is not None:
                try:
                    check_session_id(session_id)
                except NaviError as exc:
                    raise UsageError(f"session_id: {exc}") from None
            folder = _folder(cwd)
            profile = profile or self.options.profile
            req = RunRequest(
                session_id or new_session_id(),
                message,
                folder,
                profile,
                False,
                self.options.mode,
                on_busy=on_busy,
            )
            feed = AskFeed(ProgressPump(report))
            endpoint = await self.endpoint()
            run = RemoteRun(req, feed, say=lambda line: print(line, file=sys.stderr, flush=True))
            decide = approver(feed, asker)

            async def check(daemon: Redialing) -> None:
                """What the call names exists, before its message goes."""
                known = daemon.welcome.get("profiles")
                if req.profile is not None and isinstance(known, list) and req.profile not in known:
                    raise ConfigError(
                        f"unknown profile {req.profile!r} (profiles: {', '.join(known)})"
                    )
                if session_id is not None:
                    listed = await daemon.request(wire.sessions_list())
                    if session_id not in {s.get("session_id") for s in listed["sessions"]}:
                        raise UsageError(_unknown_session(session_id))

            async def follow_it(stopper: Stopper) -> None:
                stopper.switch(run.stop)
                if on_run is not None:
                    on_run(run.stop)
                await follow(endpoint, run, decide, before=check)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(feed.pump.run)
                await follow_stopping_on_cancel(follow_it)
                feed.pump.finish()
            return _result(req.session_id, feed)
        except NaviError as exc:
            raise ToolError(str(exc)) from None
        except BaseExceptionGroup as group:
            leaf = one_error(group)
            if leaf is None:
                raise
            raise ToolError(str(leaf)) from None

    async def rewinds(self) -> Rewinds:
        """Where a rewind or a fork goes: the daemon, else the private one."""
        endpoint = await self.endpoint()
        return Rewinds(endpoint.url, endpoint.token)

    async def sessions(self, limit: int) -> SessionList:
        try:
            endpoint = await self.endpoint()
            rows = await sessions_from_daemon(endpoint.url, endpoint.token, limit)
        except NaviError as exc:
            raise ToolError(str(exc)) from None
        return SessionList(sessions=rows)


def _folder(cwd: str | None) -> Path:
    """The working directory a call asks for (relative: to the server's), checked."""
    folder = Path(cwd).expanduser() if cwd else Path.cwd()
    folder = (folder if folder.is_absolute() else Path.cwd() / folder).resolve()
    if not folder.is_dir():
        raise UsageError(f"cwd {str(folder)!r} is not a directory")
    return folder


def _unknown_session(session_id: str) -> str:
    return (
        f"no session {session_id!r}: the `sessions` tool lists them; leave session_id out "
        "to start a new one"
    )


def _result(session_id: str, feed: AskFeed) -> CallToolResult:
    end = feed.end
    reason = end.reason if end is not None else "error"
    answer = feed.answer
    failed = reason != "complete"
    lines = [answer] if answer else []
    if failed:
        why = feed.error or f"the run ended with reason {reason}"
        lines.append(f"[navi: the run failed: {why}]")
    lines += [f"[navi: {n}]" for n in feed.notes]
    lines.append(f"[navi session: {session_id} (pass it as session_id to continue)]")
    structured = AskResult(answer=answer, session_id=session_id, reason=reason, notes=feed.notes)
    return CallToolResult(
        content=[TextContent(type="text", text="\n\n".join(lines))],
        structured_content=structured.model_dump(mode="json"),
        is_error=failed,
    )


def build_server(bridge: NaviBridge) -> MCPServer:
    server: MCPServer = MCPServer(
        "navi",
        version=__version__,
        instructions="navi is a local LLM agent with tools (files, terminal, sub-agents). "
        "`ask` runs a message as a turn of a navi session and returns the answer; pass the "
        "session_id it returns to continue. `sessions` lists the sessions.",
    )

    async def ask(
        message: Annotated[str, Field(description="what navi should do or answer")],
        ctx: Context,
        session_id: Annotated[
            str | None, Field(description="continue this session (default: a new one)")
        ] = None,
        profile: Annotated[
            str | None,
            Field(description="profile of a new session, e.g. coder (one continued keeps its own)"),
        ] = None,
        cwd: Annotated[str | None, Field(description="working directory for navi's tools")] = None,
        on_busy: Annotated[
            Literal["enqueue", "reject", "interrupt", "steer"] | None,
            Field(
                description="when the session is running a turn: enqueue (wait, the default), "
                "reject, interrupt (stop it, run this next) or steer (join the running turn)"
            ),
        ] = None,
    ) -> Annotated[CallToolResult, AskResult] | InputRequiredResult:
        async def report(progress: float, line: str) -> None:
            await ctx.report_progress(progress, None, line)

        if ctx.request_state is not None:  # a round's answer: the ask's run goes on
            return await bridge.rounds.resume(ctx.request_state, ctx.input_responses, report)
        if in_rounds(ctx):  # the run is parked in the server's nursery, between calls

            async def parked_ask(parked: Parked) -> CallToolResult:
                return await bridge.ask(
                    message,
                    session_id,
                    profile,
                    cwd,
                    parked.report,
                    on_busy,
                    parked.ask,
                    parked.set_stop,
                )

            return await bridge.rounds.serve(bridge.rounds.start(parked_ask), report)
        return await bridge.ask(message, session_id, profile, cwd, report, on_busy, elicitor(ctx))

    server.add_tool(
        ask,
        description="Run a message in a navi session (a local LLM agent with tools) and "
        "return its final answer and session id; progress notifications show its steps.",
    )
    add_sessions_tool(server, bridge.sessions)
    add_rewind_tools(server, bridge.rewinds)
    return server


async def serve(options: ServeOptions) -> None:
    """Serve MCP on stdin/stdout until stdin closes (the client's way to stop a server).

    SIGTERM or SIGINT stops the runs in flight (saved), closes the private daemon, then
    ends the process by the same signal: the SDK reads stdin in a worker thread that only
    the end of stdin would let go.
    """
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            bridge = NaviBridge(options, nursery)

            async def on_signal() -> None:
                async for signum in signals:
                    log.info("%s: stopping", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    with trio.CancelScope(shield=True), trio.move_on_after(STOP_GRACE + 5):
                        await bridge.wait_closed()
                    signal.signal(signum, signal.SIG_DFL)
                    os.kill(os.getpid(), signum)

            nursery.start_soon(on_signal)
            await build_server(bridge).run_stdio_async()
            nursery.cancel_scope.cancel()
