"""The `tasks` tool: list, check, wait for and cancel this session's background jobs.

Everything is scoped to ``ctx.session_id``: another session's task id gets the same
answer as an unknown one.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import trio

from navi_trio.events import AgentEvent, event_to_dict
from navi_trio.tools.args import NoArgs, action_schema, arg, parse_action
from navi_trio.tools.base import ToolContext, ToolResult, cap_text, input_errors_fail
from navi_trio.tools.services import TaskJobView, TaskService

RESULT_MAX_CHARS = 2000
DEFAULT_WAIT_SEC = 30.0
RECENT_EVENTS = 10
EVENT_LINE_MAX = 160
# After a cancel, give the job this long to unwind so the answer can state the outcome.
CANCEL_SETTLE_SEC = 2.0


@attrs.frozen
class TaskArgs:
    """check, cancel: which task."""

    task_id: str = arg("The bt-... id returned when the task started (check, wait, cancel).")


@attrs.frozen(kw_only=True)
class WaitArgs(TaskArgs):
    timeout: float = arg(
        "wait only: seconds to wait (default 30, at most 120).",
        default=DEFAULT_WAIT_SEC,
        minimum=0,
        unit="seconds",
    )


ACTIONS: dict[str, type] = {
    "list": NoArgs,
    "check": TaskArgs,
    "wait": WaitArgs,
    "cancel": TaskArgs,
}


class TasksTool:
    name = "tasks"
    description = (
        "Manage this session's background tasks (tool calls started with "
        '"background": true). Actions: list (all tasks with status and age); check '
        "(status, result, live progress of one task); wait (block until a task finishes, "
        "timeout default 30 s, at most 120 s); cancel (stop a running task). "
        "Manual: read `manual:tasks` with the filesystem tool."
    )
    parameters = action_schema(ACTIONS)

    @input_errors_fail
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        service = ctx.services.tasks if ctx.services else None
        if service is None:
            return ToolResult.fail("background tasks are not available here")
        action, parsed = parse_action(ACTIONS, args)
        if not isinstance(parsed, TaskArgs):
            return self._list(service, ctx.session_id)
        task_id = parsed.task_id
        job = service.get(ctx.session_id, task_id)
        if job is None:
            return ToolResult.fail(
                f"no task {task_id} in this session (call tasks list to see its tasks)"
            )
        if action == "check":
            return ToolResult.success(_describe(job), task_id=task_id, status=job.status)
        if isinstance(parsed, WaitArgs):
            return await self._wait(service, ctx, job, parsed)
        return await self._cancel(service, ctx.session_id, job)

    def _list(self, service: TaskService, session_id: str) -> ToolResult:
        jobs = service.list_jobs(session_id)
        if not jobs:
            return ToolResult.success("No background tasks in this session.", count=0)
        now = trio.current_time()
        lines = [f"{len(jobs)} background task(s) in this session:"]
        for job in jobs:
            lines.append(
                f"- {job.task_id} ({job.tool}) {job.status}, {_age(job, now)} — {job.args_summary}"
            )
        return ToolResult.success("\n".join(lines), count=len(jobs))

    async def _wait(
        self, service: TaskService, ctx: ToolContext, job: TaskJobView, args: WaitArgs
    ) -> ToolResult:
        timeout = min(args.timeout, ctx.settings.tasks_wait_max_sec)
        if await service.wait(ctx.session_id, job.task_id, timeout):
            return ToolResult.success(_describe(job), task_id=job.task_id, status=job.status)
        return ToolResult.fail(
            f"wait_timeout: task {job.task_id} is still running after {timeout:g} s — "
            "continue with other work; its result arrives as a completion note, "
            "or call tasks check later",
            task_id=job.task_id,
            status=job.status,
        )

    async def _cancel(self, service: TaskService, session_id: str, job: TaskJobView) -> ToolResult:
        if not service.cancel(session_id, job.task_id):
            return ToolResult.fail(
                f"task {job.task_id} already finished ({job.status}); nothing to cancel"
            )
        if await service.wait(session_id, job.task_id, CANCEL_SETTLE_SEC):
            return ToolResult.success(
                f"task {job.task_id} ({job.tool}) {job.status}.", task_id=job.task_id
            )
        return ToolResult.success(
            f"cancel requested for task {job.task_id} ({job.tool}); it stops at its next "
            "checkpoint — tasks check shows when it has.",
            task_id=job.task_id,
        )


def _age(job: TaskJobView, now: float) -> str:
    if job.finished_at is None:
        return f"running for {_seconds(now - job.started_at)}"
    took = _seconds(job.finished_at - job.started_at)
    return f"took {took}, ended {_seconds(now - job.finished_at)} ago"


def _seconds(value: float) -> str:
    value = max(value, 0.0)
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.0f}min"
    return f"{value / 3600:.1f}h"


def _describe(job: TaskJobView) -> str:
    """The `check` answer: status, tokens, result, and the latest live events."""
    lines = [f"task {job.task_id} ({job.tool}): {job.status}", f"args: {job.args_summary}"]
    if job.is_spawn:
        lines.append(f"sub-agent tokens: {job.tokens}")
    if job.error:
        lines.append(f"error: {job.error}")
    if job.result is not None:
        lines.append("result:")
        lines.append(cap_text(job.result.output or "(no output)", RESULT_MAX_CHARS))
    events = _event_lines(list(job.ring))
    if events:
        shown = events[-RECENT_EVENTS:]
        dropped = f", {job.dropped} older dropped" if job.dropped else ""
        lines.append(f"recent events (last {len(shown)} of {len(events)}{dropped}):")
        lines.extend(f"- {line}" for line in shown)
    elif job.status == "running":
        lines.append("no progress events yet")
    return "\n".join(lines)


_DELTAS = ("text_delta", "thinking_delta")


def _event_lines(events: list[AgentEvent]) -> list[str]:
    """One compact line per event; runs of text/thinking deltas are joined into one."""
    lines: list[str] = []
    run_type, run_text = "", ""
    for event in events:
        data = event_to_dict(event)
        kind = str(data.pop("type"))
        if kind in _DELTAS:
            if kind != run_type and run_type:
                lines.append(_delta_line(run_type, run_text))
                run_text = ""
            run_type = kind
            run_text += str(data.get("text", ""))
            continue
        if run_type:
            lines.append(_delta_line(run_type, run_text))
            run_type, run_text = "", ""
        extras = {
            k: v
            for k, v in data.items()
            if k not in ("is_subagent", "agent_id") and v not in (None, "", {}, [], ())
        }
        lines.append(_flat(f"{kind} {json.dumps(extras, ensure_ascii=False, default=str)}"))
    if run_type:
        lines.append(_delta_line(run_type, run_text))
    return lines


def _delta_line(kind: str, text: str) -> str:
    # The latest words say what the sub-agent is doing now: keep the tail.
    flat = re.sub(r"\s+", " ", text).strip()
    label = kind.split("_")[0]
    room = EVENT_LINE_MAX - len(label) - 3
    return f"{label}: {flat}" if len(flat) <= room else f"{label}: …{flat[-(room - 1) :]}"


def _flat(text: str) -> str:
    flat = re.sub(r"\s+", " ", text).strip()
    return flat if len(flat) <= EVENT_LINE_MAX else flat[: EVENT_LINE_MAX - 1] + "…"
