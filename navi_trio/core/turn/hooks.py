"""Running a turn's hooks: the one place an event becomes hook commands and one answer.

The hooks of config.json and the trusted hook files run one after another, each as a
tool command runs (sandbox, environment allow-list, timeout, bounded answer); a stop
kills a running hook's group. The first ``deny`` / ``block`` decides, a ``modify``
hands its arguments on, contexts add up. A hook that fails is an `ErrorEvent` and the
event's default: ``pre_tool`` denies, every other event goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import trio

from navi_trio.core.turn.hook_answers import HookAnswer, HookFailed, claude_answer, navi_answer
from navi_trio.core.turn.hook_files import (
    Hook,
    our_arguments,
    read_hook_files,
    their_tool,
)
from navi_trio.core.turn.policy import CallFacts
from navi_trio.errors import ToolInputError
from navi_trio.events import AgentEvent, ErrorEvent, WarningEvent
from navi_trio.profiles import TOOL_EVENTS
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.procs import run_command
from navi_trio.tools.terminal import command_folder, command_options

STDIN_MAX_BYTES = 64 * 1024
STRING_MAX_CHARS = 8000  # one string of the event (an argument, a result) on stdin
STDOUT_MAX_CHARS = 64 * 1024
STDERR_MAX_CHARS = 2000

Publish = Callable[[AgentEvent], None]


NO_OPINION = HookAnswer()


@attrs.frozen
class TurnHooks:
    """The hooks of one run, by event."""

    hooks: tuple[Hook, ...] = ()

    @classmethod
    async def load(cls, ctx: ToolContext, publish: Publish) -> TurnHooks:
        """config.json's hooks and those of the run folder's trusted hook files."""
        config = ctx.config
        hooks = [
            Hook(event, h.command, h.matcher, h.timeout_sec, "config.json")
            for event, items in config.hooks.items()
            for h in items
        ]
        if config.hook_files.read:
            cwd = ctx.held.cwd if ctx.held is not None else None
            found = await trio.to_thread.run_sync(read_hook_files, cwd, config.hook_files)
            hooks += found.hooks
            for warning in found.warnings:
                publish(WarningEvent(message=warning, code="hook_file_untrusted"))
        return cls(tuple(hooks))

    async def fire(
        self,
        event: str,
        ctx: ToolContext,
        *,
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
        result: ToolResult | None = None,
        **fields: Any,
    ) -> HookAnswer:
        """Run the event's hooks (for a tool event, the matching ones) and combine their
        answers; a failed one is an ErrorEvent on `ctx.publish` and the event's default.
        No hook for the event (a tool call's usual case): no opinion, nothing looked at."""
        if all(h.event != event for h in self.hooks):
            return NO_OPINION
        args = dict(arguments or {})
        facts = CallFacts.of(tool, args) if tool is not None else None
        chosen = [
            h
            for h in self.hooks
            if h.event == event
            and (facts is None or event not in TOOL_EVENTS or facts.matches(h.matcher))
        ]
        allowed, modified, contexts = False, False, []
        for hook in chosen:
            payload = _payload(hook, event, ctx, tool, args, result, fields)
            try:
                answer = await _run(hook, ctx, payload)
            except HookFailed as exc:
                default = "the call is denied" if event == "pre_tool" else "ignored"
                ctx.publish(
                    ErrorEvent(
                        message=f"the {event} hook {hook.command!r} ({hook.source}) failed: "
                        f"{exc}; {default}",
                        code="hook_failed",
                    )
                )
                if event == "pre_tool":
                    return HookAnswer("deny", reason=f"a pre_tool hook failed ({exc})")
                continue
            if answer.context:
                contexts.append(answer.context)
            if answer.decision in ("deny", "block"):
                return attrs.evolve(answer, context="\n".join(contexts))
            if answer.decision == "modify" and answer.arguments is not None:
                args = (
                    our_arguments(tool or "", args, answer.arguments)
                    if hook.dialect == "claude"
                    else dict(answer.arguments)
                )
                modified = True
            allowed = allowed or answer.decision == "allow"
        decision = "modify" if modified else "allow" if allowed else None
        return HookAnswer(
            decision, arguments=args if modified else None, context="\n".join(contexts)
        )


async def _run(hook: Hook, ctx: ToolContext, payload: dict[str, Any]) -> HookAnswer:
    """One hook, as a tool command of `ctx` runs; its answer, or HookFailed."""
    stdin = json.dumps(payload, ensure_ascii=False).encode()
    try:
        async with command_folder(ctx, None) as place:
            done = await run_command(
                hook.command,
                cwd=place.cwd,
                time_limit=hook.timeout_sec,
                max_chars=STDOUT_MAX_CHARS,
                stdin=stdin,
                stderr_max=STDERR_MAX_CHARS,
                **command_options(ctx, place),
            )
    except (OSError, ToolInputError) as exc:
        raise HookFailed(f"cannot start: {getattr(exc, 'strerror', None) or exc}") from None
    if done.timed_out:
        raise HookFailed(f"no answer within {hook.timeout_sec:g} s (killed)")
    if done.output_chars > STDOUT_MAX_CHARS:
        raise HookFailed(f"its answer is over {STDOUT_MAX_CHARS} characters")
    read = claude_answer if hook.dialect == "claude" else navi_answer
    return read(done.exit_code if done.exit_code is not None else -1, done.output, done.errors)


def _payload(
    hook: Hook,
    event: str,
    ctx: ToolContext,
    tool: str | None,
    args: dict[str, Any],
    result: ToolResult | None,
    fields: dict[str, Any],
) -> dict[str, Any]:
    """The JSON object a hook reads on stdin, within `STDIN_MAX_BYTES`."""
    cwd = str(ctx.cwd) if ctx.cwd is not None else None
    payload: dict[str, Any] = {
        "event": event,
        "session": ctx.session_id,
        "user": ctx.user_id,
        "cwd": cwd,
        "mode": ctx.mode,
        **fields,
    }
    if tool is not None:
        payload["tool"], payload["arguments"] = tool, args
    if result is not None:
        payload["result"] = {"ok": result.ok, "output": result.output, "error": result.error}
    if hook.dialect == "claude":
        payload |= {
            "hook_event_name": hook.their_event,
            "session_id": ctx.session_id,
            "transcript_path": None,
        }
        if tool is not None:
            payload["tool_name"], payload["tool_input"] = their_tool(tool, args)
        if result is not None:
            payload["tool_response"] = payload["result"]
        if "message" in fields:
            payload["prompt"] = fields["message"]
    return _bounded(payload)


def _bounded(payload: dict[str, Any]) -> dict[str, Any]:
    """Every string cut to `STRING_MAX_CHARS`; then, if still too large, the arguments
    and result replaced by a note saying they were too large."""
    cut = _cut(payload)
    assert isinstance(cut, dict)
    if len(json.dumps(cut, ensure_ascii=False).encode()) <= STDIN_MAX_BYTES:
        return cut
    for key in ("arguments", "tool_input", "result", "tool_response"):
        if key in cut:
            cut[key] = {"truncated": f"over {STDIN_MAX_BYTES} bytes: left out"}
    return cut


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > STRING_MAX_CHARS:
        return value[:STRING_MAX_CHARS] + f"…[{len(value) - STRING_MAX_CHARS} characters cut]"
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cut(v) for v in value]
    return value
