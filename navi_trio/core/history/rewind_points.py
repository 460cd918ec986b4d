"""Where a session can be rewound to: its user messages, its checkpoints, its branches.

- a **point** is a user message of the display history, named by its id; rewinding to
  it means "just before it";
- the **files checkpoint** of a point is the session's first checkpoint taken at or after
  that message arrived (every writing call is preceded by its round's checkpoint, so
  nothing navi did in between changed a file); None when none came after it. One of a
  time the store says was pruned is refused: a later one would restore too much;
- the **context before** a point is the LLM context up to that message, or, when a
  compression summarised it away, the display history before it;
- a **branch** is what a rewind cut off (kv ``branches``): the messages after the point,
  the context as it was and the checkpoint of the files as they were: the rewind's undo.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import attrs

from navi_trio.core.checkpoints import CheckpointInfo
from navi_trio.core.turn import PRUNED_SCOPE, message_id
from navi_trio.errors import NotFoundError
from navi_trio.tools.base import KVStore

BRANCH_SCOPE = "branches"
BRANCHES_MAX = 20  # a session keeps its newest branches; older ones go
POINTS_MAX = 200  # the newest user messages listed
TEXT_SHOWN = 200  # characters of a message shown in a list
RESTORES = ("chat", "files", "both")

Message = dict[str, Any]


def new_branch_id() -> str:
    return "b-" + secrets.token_hex(6)


def excerpt(message: Message, limit: int = TEXT_SHOWN) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@attrs.frozen
class Point:
    """A user message one can rewind or fork to."""

    message_id: str
    index: int  # in the display history
    text: str
    created_at: float


def points(messages: Sequence[Message]) -> list[Point]:
    return [
        Point(message_id(m, i), i, excerpt(m), float(m.get("created_at") or 0.0))
        for i, m in enumerate(messages)
        if m.get("role") == "user"
    ]


def find_point(messages: Sequence[Message], wanted: str, session_id: str) -> int:
    """The display index of the user message named `wanted`; NotFoundError if none."""
    for i, m in enumerate(messages):
        if m.get("role") == "user" and message_id(m, i) == wanted:
            return i
    shown = wanted if len(wanted) <= 64 else wanted[:63] + "…"
    raise NotFoundError(
        f"session {session_id!r} has no user message {shown!r} (the checkpoints "
        "frame, `navi rewind --list` or /rewind list them)"
    )


def context_before(
    messages: Sequence[Message], context: Sequence[Message], index: int
) -> list[Message]:
    """The LLM context just before the user message at `index` (see the module docstring)."""
    target = messages[index]
    for j, entry in enumerate(context):
        if _same(entry, target):
            return list(context[:j])
    return list(messages[:index])


def _same(a: Message, b: Message) -> bool:
    if a.get("role") != "user":
        return False
    if a.get("id") or b.get("id"):
        return a.get("id") == b.get("id")
    return a.get("content") == b.get("content") and a.get("created_at") == b.get("created_at")


def message_at(messages: Sequence[Message], created: float) -> Point | None:
    """The newest user message that had arrived when a checkpoint was made."""
    found = None
    for point in points(messages):
        if point.created_at <= created:
            found = point
    return found


async def files_checkpoint(
    kv: KVStore, infos: Sequence[CheckpointInfo], session_id: str, since: float
) -> CheckpointInfo | None:
    """The first checkpoint at or after `since` (None: no file changed since); a refusal
    when the one that would be it was pruned."""
    pruned = await kv.kv_get(PRUNED_SCOPE, session_id) or {}
    if since <= float(pruned.get("pruned_until", 0.0)):
        raise NotFoundError(
            "the files as they were then are no longer kept: that checkpoint was pruned "
            "(NAVI_CHECKPOINT_KEEP, NAVI_CHECKPOINT_MAX_AGE_SEC); rewind the chat only"
        )
    return next((info for info in infos if info.created >= since), None)


async def branches(kv: KVStore, session_id: str) -> list[dict[str, Any]]:
    """The session's branches, oldest first."""
    rows = await kv.kv_list(BRANCH_SCOPE, f"{session_id}:")
    found = [value for _, value in rows if isinstance(value, dict)]
    return sorted(found, key=lambda b: float(b.get("created_at", 0.0)))


async def get_branch(kv: KVStore, session_id: str, branch_id: str) -> dict[str, Any]:
    value = await kv.kv_get(BRANCH_SCOPE, f"{session_id}:{branch_id}")
    if not isinstance(value, dict):
        shown = branch_id if len(branch_id) <= 64 else branch_id[:63] + "…"
        raise NotFoundError(
            f"session {session_id!r} has no branch {shown!r} (the checkpoints frame lists "
            f"them; the newest {BRANCHES_MAX} are kept)"
        )
    return value


def branch_summary(branch: dict[str, Any]) -> dict[str, Any]:
    """A branch as a list shows it (never its messages in full)."""
    tail = branch.get("messages") or []
    first = next((m for m in tail if m.get("role") == "user"), None)
    return {
        "branch_id": branch.get("id"),
        "created_at": branch.get("created_at"),
        "restore": branch.get("restore"),
        "at": branch.get("at"),
        "messages": len(tail),
        "text": excerpt(first) if first else "",
        "checkpoint": branch.get("checkpoint"),
    }
