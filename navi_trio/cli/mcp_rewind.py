"""The MCP server's ``rewind`` and ``fork`` tools.

``rewind`` takes three steps, so that another agent never changes a session by
accident: with the session only, it lists the user messages and branches; with `to` or
`branch`, it answers the preview and a token and changes nothing; called again with
``confirm`` set to that token, it rewinds. ``fork`` makes a new session from the
history before `at`. A refusal is a tool error naming it.
"""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TextIO

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from navi_trio.cli.rewinds import Rewinds, resolve_point
from navi_trio.client.rewind_text import print_done, print_overview, print_preview
from navi_trio.errors import NaviError


class RewindResult(BaseModel):
    action: str = Field(description="list | preview | done")
    summary: str = Field(description="what the list, the preview or the rewind says")
    token: str | None = Field(description="preview: pass it as confirm to apply it")
    undo: str | None = Field(description="done: the branch that undoes this rewind")
    details: dict[str, Any] = Field(description="the daemon's reply, in full")


class ForkResult(BaseModel):
    new_session_id: str = Field(description="pass it to `ask` to continue the fork")
    messages: int = Field(description="messages copied into it")
    folder: str | None = Field(description="its copy of the working folder, if one was made")


def _result(
    action: str, show: Callable[[dict[str, Any], TextIO], None], fields: dict[str, Any]
) -> RewindResult:
    text = io.StringIO()
    show(fields, text)
    return RewindResult(
        action=action,
        summary=text.getvalue().strip(),
        token=fields.get("token") if action == "preview" else None,
        undo=(fields.get("undo") or None) if action == "done" else None,
        details=fields,
    )


async def rewind_call(
    rewinds: Rewinds,
    session_id: str,
    to: str | None,
    branch: str | None,
    restore: str,
    confirm: str | None,
) -> RewindResult:
    listed = await rewinds.overview(session_id)
    if to is None and branch is None:
        return _result("list", print_overview, listed)
    point = resolve_point(listed, to) if to is not None else None
    target: dict[str, Any] = {"to": point, "branch": branch, "restore": restore}
    if confirm is None:
        return _result("preview", print_preview, await rewinds.preview(session_id, target))
    done = await rewinds.apply(session_id, target, confirm)
    return _result("done", lambda f, out: print_done(f, session_id, out), done)


async def fork_call(rewinds: Rewinds, session_id: str, at: str | None, files: bool) -> ForkResult:
    point = resolve_point(await rewinds.overview(session_id), at) if at is not None else None
    made = await rewinds.fork(session_id, at=point, files=files, folder=None, new_session_id=None)
    return ForkResult(
        new_session_id=str(made["new_session_id"]),
        messages=int(made.get("messages") or 0),
        folder=made.get("folder"),
    )


def add_rewind_tools(server: MCPServer, rewinds: Callable[[], Awaitable[Rewinds]]) -> None:
    async def rewind(
        session_id: Annotated[str, Field(description="the session to rewind")],
        to: Annotated[
            str | None,
            Field(
                description="rewind to just before this user message: its id or number "
                "(1 the first, -1 the last); leave to and branch out to list them"
            ),
        ] = None,
        branch: Annotated[
            str | None, Field(description="bring back this branch instead (undo a rewind)")
        ] = None,
        restore: Annotated[
            Literal["chat", "files", "both"],
            Field(description="the conversation, the files, or both"),
        ] = "both",
        confirm: Annotated[
            str | None,
            Field(
                description="the token of this rewind's preview: applies it (without: "
                "the preview only, nothing changed)"
            ),
        ] = None,
    ) -> RewindResult:
        try:
            return await rewind_call(await rewinds(), session_id, to, branch, restore, confirm)
        except NaviError as exc:
            raise ToolError(str(exc)) from None

    async def fork(
        session_id: Annotated[str, Field(description="the session to fork")],
        at: Annotated[
            str | None,
            Field(
                description="the new session holds the history before this user message "
                "(id or number); all of it without"
            ),
        ] = None,
        files: Annotated[
            bool, Field(description="also copy the session's files as they were then")
        ] = False,
    ) -> ForkResult:
        try:
            return await fork_call(await rewinds(), session_id, at, files)
        except NaviError as exc:
            raise ToolError(str(exc)) from None

    server.add_tool(
        rewind,
        description="Rewind a navi session's conversation and/or files to just before one "
        "of its messages, or undo a rewind (its branch). Without to/branch: the list; "
        "then the preview and a token; then again with confirm=token to apply it.",
    )
    server.add_tool(
        fork,
        description="Start a new navi session from a session's history up to a message "
        "(optionally with a copy of its files); returns the new session id.",
    )
