"""The MCP server's ``sessions`` tool: the newest sessions (at most `SESSIONS_MAX`), each
with its title (else its first user message, cut to `TITLE_MAX`), profile and last
update.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, Field

from navi_trio import wire
from navi_trio.api.remote import request
from navi_trio.cli.mcp_ask import cut

SESSIONS_DEFAULT = 20
SESSIONS_MAX = 200
TITLE_MAX = 120


class SessionInfo(BaseModel):
    session_id: str
    title: str = Field(description="the session's title, else its first message")
    profile: str
    updated: str = Field(description="last change, local time YYYY-MM-DD HH:MM:SS")
    updated_at: float = Field(description="last change, seconds since the epoch")


class SessionList(BaseModel):
    sessions: list[SessionInfo] = Field(description="newest first")


def add_sessions_tool(
    server: MCPServer, list_sessions: Callable[[int], Awaitable[SessionList]]
) -> None:
    """Add the ``sessions`` tool to `server`; `list_sessions(limit)` answers it."""

    async def sessions(
        limit: Annotated[
            int, Field(ge=1, le=SESSIONS_MAX, description="how many, newest first")
        ] = SESSIONS_DEFAULT,
    ) -> SessionList:
        return await list_sessions(limit)

    server.add_tool(sessions, description="List navi's sessions, newest first.")


async def sessions_from_daemon(url: str, token: str, limit: int) -> list[SessionInfo]:
    reply = await request(url, token, wire.sessions_list())
    listed = sorted(reply["sessions"], key=lambda s: -float(s["updated_at"]))[:limit]
    found = []
    for s in listed:
        title = str(s.get("title") or "")
        if not title:
            history = await request(url, token, wire.history(str(s["session_id"])))
            title = _first_message(history.get("messages", []))
        found.append(_info(s["session_id"], title, s["profile"], float(s["updated_at"])))
    return found


def _first_message(messages: list[dict[str, Any]]) -> str:
    for m in messages:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return str(m["content"])
    return ""


def _info(session_id: str, title: str, profile: str, updated_at: float) -> SessionInfo:
    updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(updated_at))
    return SessionInfo(
        session_id=session_id,
        title=cut(title, TITLE_MAX),
        profile=profile,
        updated=updated,
        updated_at=updated_at,
    )
