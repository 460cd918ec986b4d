"""spawn_agent: delegate a bounded sub-task to an ephemeral sub-agent.

The tool validates its arguments into a `SpawnRequest` and calls
``ctx.services.spawn(request, publish)`` (the core's run_ephemeral bound to the current
run: a synchronous sub-agent's tokens count in the parent turn's totals). Synchronous
by default: the call returns when the sub-agent is done (≤ spawn_timeout_sec, which
also caps the model's `timeout_seconds`). With ``"background": true`` the tool executor
detaches the whole call to the task supervisor; the sub-agent's events flow into the
job's ring and its tokens are the job's, not the parent turn's.
"""

from __future__ import annotations

from typing import Any

from navi_trio.errors import ToolInputError
from navi_trio.tools.base import ToolContext, ToolResult, optional_number, optional_str, require_str
from navi_trio.tools.services import SUBAGENT_MAX_ITERATIONS, SpawnRequest, unavailable


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
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "What the sub-agent must do and report."},
            "profile_id": {
                "type": "string",
                "description": "Profile to use (default: this session's current profile).",
            },
            "briefing": {"type": "string", "description": "Background facts it needs."},
            "context_transfer": {
                "type": "string",
                "description": "A summary of this conversation to hand over.",
            },
            "custom_system_prompt": {"type": "string"},
            "inherit_system_prompt": {"type": "boolean"},
            "exclude_tools": {"type": "array", "items": {"type": "string"}},
            "max_iterations": {
                "type": "integer",
                "minimum": 1,
                "maximum": SUBAGENT_MAX_ITERATIONS,
            },
            "timeout_seconds": {"type": "number", "minimum": 1},
            "background": {"type": "boolean"},
        },
        "required": ["task"],
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if ctx.services is None:
            return unavailable("spawn_agent")
        try:
            outcome = await ctx.services.spawn(_request(args, ctx), ctx.publish)
        except ToolInputError as exc:
            return ToolResult.fail(str(exc))
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
    profile_id = optional_str(args, "profile_id")
    if profile_id is not None and profile_id not in ctx.config.profiles:
        known = ", ".join(sorted(ctx.config.profiles))
        raise ToolInputError(f"unknown profile_id {profile_id!r}; profiles: {known}")
    exclude = args.get("exclude_tools", [])
    if not isinstance(exclude, list) or not all(isinstance(x, str) for x in exclude):
        raise ToolInputError("argument 'exclude_tools' must be a list of tool names")
    inherit = args.get("inherit_system_prompt", False)
    if not isinstance(inherit, bool):
        raise ToolInputError("argument 'inherit_system_prompt' must be true or false")
    most = SUBAGENT_MAX_ITERATIONS
    max_iterations = int(optional_number(args, "max_iterations", most))
    if not 1 <= max_iterations <= most:
        raise ToolInputError(f"argument 'max_iterations' must be between 1 and {most}")
    # The model may ask for less time than NAVI_SPAWN_TIMEOUT_SEC, never for more.
    limit = ctx.settings.spawn_timeout_sec
    timeout = min(max(optional_number(args, "timeout_seconds", limit), 1.0), limit)
    return SpawnRequest(
        task=require_str(args, "task"),
        profile_id=profile_id,
        max_iterations=max_iterations,
        exclude_tools=tuple(exclude),
        briefing=optional_str(args, "briefing"),
        custom_system_prompt=optional_str(args, "custom_system_prompt"),
        inherit_system_prompt=inherit,
        context_transfer=optional_str(args, "context_transfer"),
        timeout_seconds=timeout,
    )
