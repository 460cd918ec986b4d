"""The scratchpad tool: one free-form note per session, for the agent's own use.

Stored in the kv table, scope ``"scratchpad"``, key = session id, as a string of at most
``settings.tool_output_max_chars`` characters (so a read always fits one tool result).
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from navi_trio.errors import ToolInputError
from navi_trio.tools.args import NoArgs, action_schema, arg, parse_action
from navi_trio.tools.base import ToolContext, ToolResult, input_errors_fail

SCOPE = "scratchpad"


@attrs.frozen
class Content:
    """write / append: the text to store."""

    content: str = arg("write / append: the text")


ACTIONS: dict[str, type] = {"read": NoArgs, "write": Content, "append": Content, "clear": NoArgs}


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
    parameters = action_schema(ACTIONS)

    def __init__(self) -> None:
        self._lock = trio.Lock()  # append is read-modify-write

    @input_errors_fail
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        action, parsed = parse_action(ACTIONS, args)
        async with self._lock:
            return await self._do(action, parsed, ctx)

    async def _do(self, action: str, args: Any, ctx: ToolContext) -> ToolResult:
        current = await load_scratchpad(ctx.kv, ctx.session_id)
        if action == "read":
            return ToolResult.success(current or "(the scratchpad is empty)")
        if action == "clear":
            await ctx.kv.kv_delete(SCOPE, ctx.session_id)
            return ToolResult.success("cleared the scratchpad")
        content = args.content
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
