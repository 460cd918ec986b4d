"""The scratchpad tool: one free-form note per session, for the agent's own use.

Stored in the kv table, scope ``"scratchpad"``, key = session id, as a string of at most
``settings.tool_output_max_chars`` characters (so a read always fits one tool result).
"""

from __future__ import annotations

from typing import Any

import trio

from navi_trio.errors import ToolInputError
from navi_trio.tools.base import ToolContext, ToolResult, require_choice

SCOPE = "scratchpad"
ACTIONS = ("read", "write", "append", "clear")


async def load_scratchpad(kv: Any, session_id: str) -> str:
    value = await kv.kv_get(SCOPE, session_id)
    return value if isinstance(value, str) else ""


class ScratchpadTool:
    name = "scratchpad"
    description = (
        "A private notepad for this session: keep findings, intermediate results and "
        "decisions you will need later (it survives context compression). Actions: read, "
        "write (replace), append, clear. Manual: read `manual:scratchpad` with the "
        "filesystem tool."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(ACTIONS)},
            "content": {"type": "string", "description": "write / append: the text"},
        },
        "required": ["action"],
    }

    def __init__(self) -> None:
        self._lock = trio.Lock()  # append is read-modify-write

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            action = require_choice(args, "action", ACTIONS)
            async with self._lock:
                return await self._do(action, args, ctx)
        except ToolInputError as exc:
            return ToolResult.fail(str(exc))

    async def _do(self, action: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        current = await load_scratchpad(ctx.kv, ctx.session_id)
        if action == "read":
            return ToolResult.success(current or "(the scratchpad is empty)")
        if action == "clear":
            await ctx.kv.kv_delete(SCOPE, ctx.session_id)
            return ToolResult.success("cleared the scratchpad")
        content = args.get("content")
        if not isinstance(content, str) or not content:
            raise ToolInputError(f"argument 'content' is required for '{action}'")
        new = content if action == "write" else current + content
        cap = ctx.settings.tool_output_max_chars
        if len(new) > cap:
            raise ToolInputError(
                f"the scratchpad holds at most {cap} characters and this {action} would make "
                f"it {len(new)}; shorten it (write a condensed version)"
            )
        await ctx.kv.kv_set(SCOPE, ctx.session_id, new)
        verb = "wrote" if action == "write" else "appended"
        return ToolResult.success(f"{verb} {len(content)} characters ({len(new)}/{cap} used)")
