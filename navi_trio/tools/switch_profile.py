"""The switch_profile tool: move the session to another agent profile, from the next
iteration on.
"""

from __future__ import annotations

from typing import Any

import attrs

from navi_trio.errors import ToolInputError
from navi_trio.tools.args import arg, parse, schema
from navi_trio.tools.base import ToolContext, ToolResult, input_errors_fail
from navi_trio.tools.services import unavailable


@attrs.frozen(kw_only=True)
class SwitchArgs:
    profile_id: str = arg("the profile to switch to")
    reason: str | None = arg("why, in a few words", default=None)


class SwitchProfileTool:
    name = "switch_profile"
    description = (
        "Switch this session to another agent profile (its model, prompt and tools) when "
        "the task needs it, e.g. to `coder` for programming work. Takes effect on the next "
        "iteration. Manual: read `manual:profiles` with the filesystem tool."
    )
    parameters = schema(SwitchArgs)

    @input_errors_fail
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        parsed = parse(SwitchArgs, args)
        profile_id, reason = parsed.profile_id, parsed.reason
        valid = sorted(ctx.config.profiles)
        if profile_id not in ctx.config.profiles:
            raise ToolInputError(
                f"unknown profile '{profile_id}'; valid profiles: {', '.join(valid)}"
            )
        if profile_id == ctx.profile.id:
            return ToolResult.success(f"already using profile '{profile_id}'")
        if ctx.services is None:
            return unavailable("switching profiles")
        ctx.services.switch_profile(profile_id)
        why = f" ({reason})" if reason else ""
        return ToolResult.success(
            f"switched to profile '{profile_id}'{why}; it takes effect on the next iteration",
            profile_id=profile_id,
        )
