"""Client tools: tools a client connection offers for one session, run by the client.

A client (``navi acp``, for the MCP servers the editor names) declares tools for a
session of its user with their JSON schemas (`declare`). The session's runs get them as
run-time tools (`ClientTools` is the registry's `ToolSource`), named ``mcp__…`` so that
the policy asks for them as for any MCP tool. When the model calls one, the call goes to
the declaring connection as a ``client_tool_call`` frame, and the run waits for its
``client_tool_result`` (`answer`), at most `CALL_TIMEOUT_SEC`, its output cut at the
tool output limit. The daemon never starts anything for them: the client runs them, as
its own user. A declaration lasts until its connection closes (`drop`); a call that
waits then fails, naming the tool.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from navi_trio.core.turn import runvars
from navi_trio.events import AgentEvent
from navi_trio.profiles import AgentProfile
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.result import cap_text

CALL_TIMEOUT_SEC = 120.0
Send = Callable[[dict[str, Any]], Awaitable[None]]


@attrs.define(eq=False)
class _Pending:
    done: trio.Event = attrs.Factory(trio.Event)
    ok: bool = False
    output: str = ""
    gone: bool = False  # its client went away before answering


@attrs.define(eq=False)
class _Declared:
    user_id: str  # the session's owner, who declared them: only their runs get them
    owner: object  # the connection that declared them
    send: Send
    tools: dict[str, ClientTool]


class ClientTool:
    """One declared tool: its call goes to the declaring client."""

    read_only = False  # the client may change files: a checkpoint comes first
    backgroundable = False

    def __init__(
        self, hub: ClientTools, session_id: str, name: str, description: str, params: dict[str, Any]
    ) -> None:
        self.hub = hub
        self.session_id = session_id
        self.name = name
        self.description = description
        self.parameters = params

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await self.hub.call(self, args, ctx)


class ClientTools:
    """The declared tools of every session, and the calls waiting for their clients."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Declared] = {}
        self._pending: dict[str, tuple[object, _Pending]] = {}
        self._ids = itertools.count(1)

    def declare(
        self,
        session_id: str,
        user_id: str,
        owner: object,
        send: Send,
        tools: list[tuple[str, str, Any]],
    ) -> None:
        """`tools` (name, description, JSON schema) for `session_id`, called through
        `send`; they replace what was declared for it before (none: withdrawn)."""
        if not tools:
            self._sessions.pop(session_id, None)
            return
        made = {n: ClientTool(self, session_id, n, d, dict(p)) for n, d, p in tools}
        self._sessions[session_id] = _Declared(user_id, owner, send, made)

    def drop(self, owner: object) -> None:
        """`owner` went away: its declarations go, and its calls waiting fail."""
        for sid in [s for s, d in self._sessions.items() if d.owner is owner]:
            del self._sessions[sid]
        for call_id, (who, pending) in list(self._pending.items()):
            if who is owner:
                del self._pending[call_id]
                pending.gone = True
                pending.done.set()

    def answer(self, owner: object, call_id: str, ok: bool, output: str) -> bool:
        """A client's result for one of its calls; False when none such waits."""
        found = self._pending.get(call_id)
        if found is None or found[0] is not owner:
            return False
        del self._pending[call_id]
        pending = found[1]
        pending.ok, pending.output = ok, output
        pending.done.set()
        return True

    async def call(self, tool: ClientTool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        declared = self._sessions.get(tool.session_id)
        if declared is None or declared.tools.get(tool.name) is not tool:
            return ToolResult.fail(f"{tool.name}: the client that offered it went away")
        call_id = f"ct-{next(self._ids)}"
        pending = _Pending()
        self._pending[call_id] = (declared.owner, pending)
        try:
            frame = {
                "type": "client_tool_call",
                "session_id": tool.session_id,
                "call_id": call_id,
                "name": tool.name,
                "arguments": args,
            }
            try:
                await declared.send(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return ToolResult.fail(f"{tool.name}: the client that offered it went away")
            with trio.move_on_after(CALL_TIMEOUT_SEC):
                await pending.done.wait()
            if not pending.done.is_set():
                return ToolResult.fail(
                    f"{tool.name}: the client did not answer within {CALL_TIMEOUT_SEC:g} s"
                )
        finally:
            self._pending.pop(call_id, None)
        if pending.gone:
            return ToolResult.fail(
                f"{tool.name}: the client that offered it went away during the call"
            )
        text = cap_text(pending.output, ctx.settings.tool_output_max_chars)
        if not pending.ok:
            return ToolResult.fail(f"{tool.name} failed", output=text)
        return ToolResult.success(text)

    # -- the registry's ToolSource ------------------------------------------------------

    def _current(self) -> _Declared | None:
        """What was declared for the run's session, when the run's sender declared it (a
        run of someone else there, an admin's, never calls into this user's client)."""
        declared = self._sessions.get(runvars.current_session_id.get() or "")
        if declared is None or declared.user_id != runvars.current_user_id.get():
            return None
        return declared

    async def prepare(
        self, profile: AgentProfile, publish: Callable[[AgentEvent], None]
    ) -> list[str]:
        declared = self._current()
        return [] if declared is None else sorted(declared.tools)

    def get(self, name: str) -> ClientTool | None:
        declared = self._current()
        return None if declared is None else declared.tools.get(name)
