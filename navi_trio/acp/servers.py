"""The MCP servers an editor passes at ``session/new``: run here, used by that session.

The daemon never starts a command a user names, so the servers run in this process, as
the editor's own account. Their tools are declared to the daemon for the session's runs
(``mcp__editor-<server>__<tool>``): the policy asks for them as for any MCP tool.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any, cast

import attrs
import trio

from navi_trio.acp.jsonrpc import INVALID_PARAMS, RpcError
from navi_trio.profiles import McpServerConfig

if TYPE_CHECKING:
    from navi_trio.settings import Settings
    from navi_trio.tools.base import ToolContext
    from navi_trio.tools.mcp.connection import McpConnection, McpTool

log = logging.getLogger(__name__)

PREFIX = "editor-"  # the navi names of an editor's servers: apart from the daemon's own
SERVERS_MAX = 16
START_TIMEOUT_SEC = 30.0  # one server's start (initialize and its list of tools)
# What one call's output may be, in characters: the daemon's frame limit is 1 MiB.
RESULT_MAX_CHARS = 200_000
_TOOL = re.compile(r"mcp__[A-Za-z0-9_-]{1,40}__[A-Za-z0-9_.-]{1,64}")


def server_config(server: Any) -> tuple[str, McpServerConfig]:
    """An ACP server entry (stdio or http) as navi's name and config."""
    raw = str(getattr(server, "name", "") or "")
    name = PREFIX + (re.sub(r"[^A-Za-z0-9_-]", "_", raw)[:32] or "server")
    if getattr(server, "type", None) == "sse":
        raise RpcError(INVALID_PARAMS, f"mcpServers: {raw!r}: sse is not supported")
    if getattr(server, "command", None) is not None:
        env = {str(e.name): str(e.value) for e in server.env or []}
        conf = McpServerConfig(
            command=str(server.command),
            args=tuple(server.args or ()),
            env=env,
            timeout_sec=START_TIMEOUT_SEC,
        )
    elif getattr(server, "url", None) is not None:
        headers = {str(h.name): str(h.value) for h in server.headers or []}
        conf = McpServerConfig(url=str(server.url), headers=headers, timeout_sec=START_TIMEOUT_SEC)
    else:
        raise RpcError(INVALID_PARAMS, f"mcpServers: {raw!r}: neither a command nor a url")
    return name, conf


@attrs.define(eq=False)
class _CallContext:
    """What navi's MCP client reads of a tool context for a call: the output limit and
    where progress goes (nowhere: the editor sees the daemon's tool card)."""

    settings: Settings

    def emit(self, data: dict[str, Any]) -> None:
        pass


@attrs.define(eq=False)
class EditorServers:
    """One session's servers and their tools (by navi name)."""

    connections: list[McpConnection]
    settings: Settings

    @property
    def tools(self) -> dict[str, McpTool]:
        found: dict[str, McpTool] = {}
        for c in self.connections:
            found.update({n: t for n, t in c.tools.items() if _TOOL.fullmatch(n)})
        return found

    def declaration(self, session_id: str) -> dict[str, Any]:
        """The ``client_tools`` frame offering them for `session_id`."""
        tools = [
            {"name": t.name, "description": t.description[:4096], "parameters": t.parameters}
            for t in self.tools.values()
        ]
        return {"type": "client_tools", "session_id": session_id, "tools": tools[:64]}

    async def call(self, name: str, args: dict[str, Any]) -> tuple[bool, str]:
        tool = self.tools.get(name)
        if tool is None:
            return False, f"{name}: no such tool among the editor's MCP servers"
        ctx = cast("ToolContext", _CallContext(self.settings))  # only these two are read
        result = await tool.execute(args, ctx)
        text = result.output if result.ok else result.content()
        return result.ok, text[:RESULT_MAX_CHARS]

    def stop(self) -> None:
        for c in self.connections:
            c.scope.cancel()


@attrs.define(eq=False)
class ServerHost:
    """Where the editor's servers run: this process's nursery, as this process's user."""

    nursery: trio.Nursery
    settings: Settings

    async def start(self, servers: list[Any]) -> EditorServers:
        """`servers` started, each ready or an error naming it (the others stopped)."""
        from navi_trio.tools.mcp.connection import McpConnection

        if len(servers) > SERVERS_MAX:
            raise RpcError(INVALID_PARAMS, f"mcpServers: more than {SERVERS_MAX}")
        configs = [server_config(s) for s in servers]
        started = EditorServers([], self.settings)
        for name, conf in configs:
            conn = McpConnection(name, conf)  # no tool user: the editor's own account
            started.connections.append(conn)
            self.nursery.start_soon(conn.run)
        with trio.move_on_after(START_TIMEOUT_SEC + 5):
            for conn in started.connections:
                await conn.settled.wait()
        failed = [c for c in started.connections if c.state != "ready"]
        if failed:
            started.stop()
            why = "; ".join(f"{c.name}: {c.error or 'no answer'}" for c in failed)
            raise RpcError(INVALID_PARAMS, f"mcpServers: could not start {why}")
        log.info("the editor's MCP servers: %s", ", ".join(sorted(started.tools)))
        return started
