"""Pair every assistant tool call that never got a result (a crash, a kill -9 mid-tool).

Models and chat APIs reject a history where an assistant message announces tool calls
and no tool message answers them, so a session interrupted between the two cannot go
on. On load the store runs `repair_dangling_tool_calls` and persists the placeholders it
returns; a second load then finds every call answered and adds nothing (idempotent).

A call is *dangling* when no tool message answering it follows the assistant message
before the next user or assistant message (or the end). A call is answered by a tool
message with the same ``tool_call_id``; calls without an id (foreign or legacy data)
are answered, in order, by the tool messages of that stretch whose ``tool_call_id`` is
missing or names none of the assistant's calls. A placeholder goes right after the
assistant message and the results it already has.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

PLACEHOLDER_CONTENT = "[no result: the run ended before this tool call finished]"


def placeholder_result(tool_call_id: str, name: str) -> dict[str, Any]:
    """The tool message that stands in for a result that never came."""
    return {
        "role": "tool",
        "tool_call_id": tool_call_id,
        "name": name,
        "content": PLACEHOLDER_CONTENT,
        "repaired": True,
    }


def repair_dangling_tool_calls(
    messages: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any]]]]:
    """Return the repaired list and the placeholders inserted, each with its index in it.

    Pure: the input is not modified; the repaired list holds the same dict objects plus
    the new placeholders. With nothing dangling, the list equals the input and the
    second element is empty.
    """
    out: list[dict[str, Any]] = []
    inserted: list[tuple[int, dict[str, Any]]] = []
    n = len(messages)
    i = 0
    while i < n:
        msg = messages[i]
        out.append(msg)
        i += 1
        calls = _tool_calls(msg) if _role(msg) == "assistant" else []
        if not calls:
            continue
        end = i
        while end < n and _role(messages[end]) not in ("user", "assistant"):
            end += 1
        window = messages[i:end]
        missing = _unanswered(calls, window)
        if not missing:
            continue
        tool_indexes = [k for k in range(i, end) if _role(messages[k]) == "tool"]
        last = tool_indexes[-1] + 1 if tool_indexes else i
        out.extend(messages[i:last])
        for placeholder in missing:
            inserted.append((len(out), placeholder))
            out.append(placeholder)
        i = last
    return out, inserted


def _role(msg: object) -> object:
    return msg.get("role") if isinstance(msg, dict) else None


def _tool_calls(msg: dict[str, Any]) -> list[dict[str, Any]]:
    calls = msg.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [c for c in calls if isinstance(c, dict)]


def _call_id(call: dict[str, Any]) -> str | None:
    cid = call.get("id")
    return cid if isinstance(cid, str) and cid else None


def _call_name(call: dict[str, Any]) -> str:
    name = call.get("name")
    if not isinstance(name, str):
        # OpenAI's shape nests the name under "function".
        function = call.get("function")
        name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else ""


def _unanswered(
    calls: list[dict[str, Any]], window: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    call_ids = {cid for c in calls if (cid := _call_id(c)) is not None}
    answered_by_id: Counter[str] = Counter()
    unclaimed = 0  # results answering no known id: they pair with id-less calls in order
    for msg in window:
        if _role(msg) != "tool":
            continue
        tcid = msg.get("tool_call_id")
        if isinstance(tcid, str) and tcid in call_ids:
            answered_by_id[tcid] += 1
        else:
            unclaimed += 1
    missing: list[dict[str, Any]] = []
    for index, call in enumerate(calls):
        cid = _call_id(call)
        if cid is not None:
            if answered_by_id[cid] > 0:
                answered_by_id[cid] -= 1
            else:
                missing.append(placeholder_result(cid, _call_name(call)))
        elif unclaimed > 0:
            unclaimed -= 1
        else:
            # The placeholder needs an id; it names no call, so on the next load it is
            # an unclaimed result and pairs with this id-less call again.
            missing.append(placeholder_result(f"missing-id-{index}", _call_name(call)))
    return missing


def placeholder_positions(
    original: Sequence[float], inserted: Sequence[tuple[int, dict[str, Any]]]
) -> list[float]:
    """Positions strictly between the original neighbours of each run of placeholders."""
    indexes = [i for i, _ in inserted]
    out: list[float] = []
    start = 0
    while start < len(indexes):
        end = start
        while end + 1 < len(indexes) and indexes[end + 1] == indexes[end] + 1:
            end += 1
        before = indexes[start] - start  # originals preceding this run (>= 1: the assistant)
        low = original[before - 1]
        high = original[before] if before < len(original) else low + 1.0
        count = end - start + 1
        out.extend(low + (high - low) * (k + 1) / (count + 1) for k in range(count))
        start = end + 1
    return out
