"""What a hook said: its exit code, stdout and stderr turned into one `HookAnswer`.

Ours is a JSON object on stdout (``decision``, ``reason``, ``arguments``, ``context``);
exit code 2 blocks in every dialect; Claude Code's and Codex's answers are read by
`claude_answer`. Anything else is a failed hook (`HookFailed`).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

DECISIONS = ("allow", "deny", "modify", "block")
ANSWER_KEYS = frozenset({"decision", "reason", "arguments", "context"})
BLOCK_EXIT = 2


class HookFailed(Exception):
    """The hook did not answer: it failed, timed out, or said something unreadable."""


@attrs.frozen
class HookAnswer:
    decision: str | None = None  # allow | deny | modify | block; None: no opinion
    reason: str = ""
    arguments: dict[str, Any] | None = None  # modify: the call's new arguments
    context: str = ""  # text to add (user_message: to the context; pre_compact: to keep)


def navi_answer(exit_code: int, stdout: str, stderr: str) -> HookAnswer:
    """Our dialect: exit 0 with an empty stdout or a JSON answer; exit 2 blocks."""
    if exit_code == BLOCK_EXIT:
        return HookAnswer("block", reason=stderr.strip() or "blocked by a hook (exit code 2)")
    if exit_code != 0:
        raise HookFailed(f"exited with code {exit_code}: {stderr.strip()[-300:]}")
    if not stdout.strip():
        return HookAnswer()
    data = _json_object(stdout)
    unknown = sorted(set(data) - ANSWER_KEYS)
    if unknown:
        raise HookFailed(f"unknown keys {unknown} in its answer (keys: {sorted(ANSWER_KEYS)})")
    decision = data.get("decision")
    if decision is not None and decision not in DECISIONS:
        raise HookFailed(f"decision {decision!r} is not one of {', '.join(DECISIONS)}")
    reason, context, arguments = (
        data.get("reason", ""),
        data.get("context", ""),
        data.get("arguments"),
    )
    if not isinstance(reason, str) or not isinstance(context, str):
        raise HookFailed("reason and context must be strings")
    if (decision == "modify") != isinstance(arguments, dict):
        raise HookFailed('"modify" goes with "arguments", an object (and only it)')
    return HookAnswer(decision, reason=reason, arguments=arguments, context=context)


def claude_answer(exit_code: int, stdout: str, stderr: str) -> HookAnswer:
    """Claude Code's (and Codex's) dialect, as far as it maps (docs/pages/hooks.md)."""
    if exit_code == BLOCK_EXIT:
        return HookAnswer("block", reason=stderr.strip() or "blocked by a hook (exit code 2)")
    if exit_code != 0:
        raise HookFailed(f"exited with code {exit_code}: {stderr.strip()[-300:]}")
    text = stdout.strip()
    if not text.startswith("{"):
        return HookAnswer(context=text)  # plain text: context (UserPromptSubmit, SessionStart)
    data = _json_object(text)
    reason = _text(data.get("reason")) or _text(data.get("stopReason"))
    if data.get("continue") is False or data.get("decision") == "block":
        return HookAnswer("block", reason=reason or "blocked by a hook")
    specific = data.get("hookSpecificOutput")
    specific = specific if isinstance(specific, dict) else {}
    context = _text(specific.get("additionalContext"))
    permission = specific.get("permissionDecision")
    why = _text(specific.get("permissionDecisionReason")) or reason
    behaviour = specific.get("decision")
    if isinstance(behaviour, dict):  # PermissionRequest
        permission = behaviour.get("behavior")
        why = _text(behaviour.get("message")) or why
    updated = specific.get("updatedInput")
    if permission == "deny":
        return HookAnswer("deny", reason=why or "denied by a hook", context=context)
    if isinstance(updated, dict):
        return HookAnswer("modify", reason=why, arguments=updated, context=context)
    if permission == "allow" or data.get("decision") == "approve":
        return HookAnswer("allow", reason=why, context=context)
    return HookAnswer(context=context)


def _json_object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HookFailed(f"its answer is not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise HookFailed(f"its answer is JSON but not an object: {text[:80]!r}")
    return data


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
