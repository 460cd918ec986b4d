"""The memory tool: durable facts about the user, shared by all their sessions.

Stored in the kv table, scope ``"memory"``, key = user id, as
``{"next": n, "items": [{"id": "m1", "text": ...}, ...]}``; ids are never reused. The
context builder calls `load_memories` for the "What I remember about the user" message.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from navi_trio.errors import ToolInputError
from navi_trio.tools.args import NoArgs, action_schema, arg, parse_action
from navi_trio.tools.base import KVStore, ToolContext, ToolResult, input_errors_fail

SCOPE = "memory"
MAX_ITEMS = 100
MAX_FACT = 500
_FACT = "remember / forget: the fact"
_NO_FACT = "argument 'fact' is required and must be a non-empty string"


@attrs.frozen
class Remember:
    fact: str = arg(_FACT)


@attrs.frozen(kw_only=True)
class Forget:
    fact: str | None = arg(_FACT, default=None)
    id: str | None = arg('forget: the fact\'s id, e.g. "m3"', default=None)


ACTIONS: dict[str, type] = {"remember": Remember, "forget": Forget, "list": NoArgs}


async def _load(kv: KVStore, user_id: str) -> tuple[int, list[dict[str, str]]]:
    raw = await kv.kv_get(SCOPE, user_id)
    if not isinstance(raw, dict):
        return 1, []
    items = [
        {"id": i["id"], "text": i["text"]}
        for i in raw.get("items", [])
        if isinstance(i, dict) and isinstance(i.get("id"), str) and isinstance(i.get("text"), str)
    ]
    nxt = raw.get("next")
    if not isinstance(nxt, int) or nxt < 1:
        used = [int(i["id"][1:]) for i in items if i["id"][1:].isdigit()]
        nxt = max(used, default=0) + 1
    return nxt, items


async def load_memories(kv: KVStore, user_id: str) -> list[str]:
    """The remembered facts about `user_id`, oldest first."""
    _, items = await _load(kv, user_id)
    return [i["text"] for i in items]


def _format(items: list[dict[str, str]]) -> str:
    if not items:
        return "(nothing remembered about the user yet)"
    return "\n".join(f"{i['id']}: {i['text']}" for i in items)


class MemoryTool:
    name = "memory"
    description = (
        "Long-term memory about the user, kept across sessions and shown to you at the "
        "start of every turn. Actions: remember (fact), forget (id or exact fact), list. "
        "Store stable preferences and facts, not task details. Manual: read "
        "`manual:memory` with the filesystem tool."
    )
    parameters = action_schema(ACTIONS)

    def __init__(self) -> None:
        self._lock = trio.Lock()

    @input_errors_fail
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        action, parsed = parse_action(ACTIONS, args)
        async with self._lock:
            nxt, items = await _load(ctx.kv, ctx.user_id)
            if action == "list":
                return ToolResult.success(_format(items))
            if action == "remember":
                result = self._remember(parsed, nxt, items)
                if items and items[-1]["id"] == f"m{nxt}":
                    nxt += 1  # that id is now taken for good
            else:
                result = self._forget(parsed, items)
            await ctx.kv.kv_set(SCOPE, ctx.user_id, {"next": nxt, "items": items})
            return result

    def _remember(self, args: Remember, nxt: int, items: list[dict[str, str]]) -> ToolResult:
        fact = " ".join(args.fact.split())
        if not fact:
            raise ToolInputError(_NO_FACT)
        if len(fact) > MAX_FACT:
            raise ToolInputError(f"argument 'fact' is longer than {MAX_FACT} characters")
        for item in items:
            if item["text"] == fact:
                return ToolResult.success(f"already remembered as {item['id']}", id=item["id"])
        if len(items) >= MAX_ITEMS:
            raise ToolInputError(
                f"memory is full ({MAX_ITEMS} facts); forget something outdated first"
            )
        new_id = f"m{nxt}"
        items.append({"id": new_id, "text": fact})
        return ToolResult.success(f"remembered {new_id}: {fact}", id=new_id)

    def _forget(self, args: Forget, items: list[dict[str, str]]) -> ToolResult:
        target_id, fact = args.id, args.fact
        if not target_id and not (fact and fact.strip()):
            raise ToolInputError("forget needs argument 'id' (e.g. \"m3\") or the exact 'fact'")
        wanted = " ".join(fact.split()) if fact is not None else None
        for n, item in enumerate(items):
            if item["id"] == target_id or item["text"] == wanted:
                del items[n]
                return ToolResult.success(f"forgot {item['id']}: {item['text']}", id=item["id"])
        what = f"id '{target_id}'" if target_id else f"fact {wanted!r}"
        raise ToolInputError(f"no remembered {what}; the list has: {_format(items)}")
