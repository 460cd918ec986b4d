"""spawn_agent: delegate a bounded sub-task to an ephemeral sub-agent.

Synchronous by default: the call returns when the sub-agent is done (at most
spawn_timeout_sec, which also caps `timeout_seconds`), and its tokens count in the
parent turn's. With ``"background": true`` the whole call becomes a background job,
whose events and tokens are the job's.
"""

from __future__ import annotations

from typing import Any

import attrs

from navi_trio.tools.args import Strings, arg, parse, schema
from navi_trio.tools.base import ToolContext, ToolResult, input_errors_fail
from navi_trio.tools.services import SUBAGENT_MAX_ITERATIONS, SpawnRequest, unavailable


@attrs.frozen(kw_only=True)
class SpawnArgs:
    task: str = arg("What the sub-agent must do and report.")
    profile_id: str | None = arg(
        "Profile to use (default: this session's current profile).", default=None
    )
    briefing: str | None = arg("Background facts it needs.", default=None)
    context_transfer: str | None = arg("A summary of this conversation to hand over.", default=None)
    custom_system_prompt: str | None = arg(default=None)
    inherit_system_prompt: bool = arg(default=False)
    exclude_tools: Strings = arg(default=(), expected="a list of tool names")
    max_iterations: int = arg(
        default=SUBAGENT_MAX_ITERATIONS, minimum=1, maximum=SUBAGENT_MAX_ITERATIONS
    )
    # Clamped to 1..NAVI_SPAWN_TIMEOUT_SEC by the tool, not refused.
    timeout_seconds: float | None = arg(default=None, extra={"minimum": 1})
    # Read by the tool executor (it detaches the call), declared here for the schema.
    background: bool = arg(default=False)


class SpawnAgentTool:
    name = "spawn_agent"
    description = (
        "Delegate a bounded sub-task (3+ tool calls) to a sub-agent with its own fresh "
        "context. It works on this session's files, todo and scratchpad, and returns a "
        "report. Give it everything it needs in `task` and `briefing`: it cannot see this "
        "conversation unless you pass `context_transfer`. Set `background: true` to keep "
        "working while it runs (collect with the tasks tool). "
        "Manual: read `manual:spawn_agent` with the filesystem tool."
    )
    parameters = schema(SpawnArgs)

    @input_errors_fail
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if ctx.services is None:
            return unavailable("spawn_agent")
        outcome = await ctx.services.spawn(_request(args, ctx), ctx.publish)
        data = {
            "tokens": outcome.tokens,
            "completed": outcome.completed,
            "agent_id": outcome.agent_id,
        }
        if outcome.completed:
            return ToolResult.success(outcome.text, **data)
        why = outcome.failure or "it did not finish"
        return ToolResult.fail(
            f"the sub-agent did not finish: {why}; its last words follow",
            output=outcome.text,
            **data,
        )


def _request(args: dict[str, Any], ctx: ToolContext) -> SpawnRequest:
    """The checked arguments; a bad one is a ToolInputError naming it."""
    parsed = parse(SpawnArgs, args)
    # A profile_id the config lacks may name an agent kept as a file: the spawner looks.
    profile_id = parsed.profile_id
    # The model may ask for less time than NAVI_SPAWN_TIMEOUT_SEC, never for more.
    limit = ctx.settings.spawn_timeout_sec
    asked = limit if parsed.timeout_seconds is None else parsed.timeout_seconds
    return SpawnRequest(
        task=parsed.task,
        profile_id=profile_id,
        max_iterations=parsed.max_iterations,
        exclude_tools=parsed.exclude_tools,
        briefing=parsed.briefing,
        custom_system_prompt=parsed.custom_system_prompt,
        inherit_system_prompt=parsed.inherit_system_prompt,
        context_transfer=parsed.context_transfer,
        timeout_seconds=min(max(asked, 1.0), limit),
    )
