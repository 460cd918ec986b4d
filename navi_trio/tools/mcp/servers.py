"""McpServers: our connections to the configured MCP servers, and their tools for a run.

A server's actor starts the first time a run's profile names it (`prepare` waits until
it is ready or failed, at most its `timeout_sec`). A server whose entry changed in a
reloaded config gets a new actor; a disabled one is never started. `probe` starts
servers briefly, for ``navi mcp list`` and ``navi doctor``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import trio

from navi_trio.actor import NurseryHolder
from navi_trio.events import AgentEvent, WarningEvent
from navi_trio.profiles import MCP_PREFIX, AgentProfile, McpServerConfig, NaviConfig
from navi_trio.tools.base import Tool
from navi_trio.tools.mcp.connection import McpConnection

Publish = Callable[[AgentEvent], None]


class McpServers(NurseryHolder):
    """Owns the connections' actors until cancelled (runtime shutdown stops them all)."""

    def __init__(
        self,
        config: Callable[[], NaviConfig],
        tool_user: str = "",
        bwrap_path: Path | None = None,
        cgroup_owner: str | None = None,
    ) -> None:
        self._config = config  # the config in force (it may be reloaded)
        self._tool_user = tool_user  # NAVI_TOOL_USER, NAVI_BWRAP (tools/runas.py)
        self._bwrap_path = bwrap_path
        # The daemon's cgroup tree the stdio servers run in (None: no cgroups).
        self._cgroup_owner = cgroup_owner
        self._connections: dict[str, McpConnection] = {}

    def connection(self, name: str) -> McpConnection | None:
        return self._connections.get(name)

    def start(self, name: str, conf: McpServerConfig) -> McpConnection:
        """The actor of `name`, started now unless it runs with this same entry."""
        nursery = self.nursery  # RuntimeError when not running, before anything changes
        actor = self._connections.get(name)
        if actor is not None and actor.config != conf:
            actor.scope.cancel()  # the entry changed: its successor starts afresh
            actor = None
        if actor is None:
            actor = McpConnection(name, conf, self._tool_user, self._bwrap_path, self._cgroup_owner)
            self._connections[name] = actor
            nursery.start_soon(actor.run)
        actor.retry()
        return actor

    async def settle(self, actors: Iterable[McpConnection]) -> None:
        """Wait until each of `actors` is ready or its start failed (its timeout at most)."""
        async with trio.open_nursery() as nursery:
            for actor in actors:

                async def wait(a: McpConnection = actor) -> None:
                    with trio.move_on_after(a.config.timeout_sec + 5):
                        await a.settled.wait()

                nursery.start_soon(wait)

    async def prepare(self, profile: AgentProfile, publish: Publish) -> list[str]:
        """The names of the MCP tools `profile` gets, its servers started first.

        Warnings (a server that is not available, a schema cut) go to `publish`.
        """
        if not profile.mcp_servers:
            return []
        cfg = self._config()
        actors = []
        for name in profile.mcp_servers:
            conf = cfg.mcp_servers.get(name)
            if conf is not None and conf.enabled:
                actors.append(self.start(name, conf))
        await self.settle(actors)
        names: list[str] = []
        for actor in actors:
            for note in actor.take_notes():
                publish(WarningEvent(message=note, code="mcp_tools"))
            if actor.state != "ready":
                publish(WarningEvent(message=actor.unavailable(), code="mcp_unavailable"))
            names.extend(actor.tools)
        return names

    def get(self, name: str) -> Tool | None:
        if not name.startswith(MCP_PREFIX):
            return None
        actor = self._connections.get(name.removeprefix(MCP_PREFIX).split("__", 1)[0])
        return None if actor is None else actor.tools.get(name)

    def status(self) -> list[dict[str, Any]]:
        """Every configured server: name, transport, enabled, state, error, tools."""
        out = []
        for name, conf in sorted(self._config().mcp_servers.items()):
            actor = self._connections.get(name)
            state = actor.state if actor is not None else "idle"
            out.append(
                {
                    "name": name,
                    "transport": conf.transport,
                    "enabled": conf.enabled,
                    "state": state if conf.enabled else "disabled",
                    "error": actor.error if actor is not None else None,
                    "tools": sorted(t.remote for t in actor.tools.values()) if actor else [],
                    "notes": list(actor.notes) if actor is not None else [],
                }
            )
        return out


async def probe(
    cfg: NaviConfig,
    start_cap: float | None = None,
    tool_user: str = "",
    bwrap_path: Path | None = None,
) -> list[dict[str, Any]]:
    """Start every enabled server of `cfg` briefly, as the daemon would; the status of
    each. `start_cap` caps each server's start (its timeout_sec otherwise).
    """
    servers = McpServers(lambda: cfg, tool_user, bwrap_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(servers.run)
        actors = []
        for name, conf in cfg.mcp_servers.items():
            if conf.enabled:
                if start_cap is not None:
                    conf = _capped(conf, start_cap)
                actors.append(servers.start(name, conf))
        await servers.settle(actors)
        nursery.cancel_scope.cancel()
    status = servers.status()
    for entry in status:
        entry["ok"] = not entry["enabled"] or entry["state"] == "ready"
        if not entry["ok"]:
            entry["state"] = "failed"  # it would be retried; here it is given up
    return status


def _capped(conf: McpServerConfig, timeout: float) -> McpServerConfig:
    import attrs

    return attrs.evolve(conf, timeout_sec=min(conf.timeout_sec, timeout))
