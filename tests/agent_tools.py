"""Test-only tools and helpers for the agent loop tests (tests/test_agent_*.py).

Each tool instance keeps its own state (what it saw, an event to open), so a test makes
fresh ones; nothing here is a module-level singleton. `toolset()` gives the built-in
state tools the loop tests need (todo, memory, switch_profile) plus the test tools.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from navi_trio.core.turn import runvars
from navi_trio.testing import open_harness
from navi_trio.tools.base import Tool, ToolContext, ToolResult
from navi_trio.tools.memory import MemoryTool
from navi_trio.tools.switch_profile import SwitchProfileTool
from navi_trio.tools.todo import SCOPE as TODO_SCOPE
from navi_trio.tools.todo import TodoTool

_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


class RecordTool:
    """Records the run variables and the ToolContext it ran with; reports progress once."""

    name = "record"
    description = "records what it sees"
    parameters = _OBJECT

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.seen.append(
            {**runvars.snapshot(), "ctx_cwd": ctx.cwd, "ctx_sandbox": ctx.sandbox, "args": args}
        )
        ctx.emit({"progress": "half way"})
        return ToolResult.success("recorded")


class ExplodeTool:
    """Raises: the loop must turn it into an error result and go on."""

    name = "explode"
    description = "always raises"
    parameters = _OBJECT

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise RuntimeError("kaboom in the tool")


class BlockTool:
    """Waits forever (until the run is stopped); `started` is set when it runs."""

    name = "block"
    description = "never returns"
    parameters = _OBJECT

    def __init__(self) -> None:
        self.started = trio.Event()
        self.cancelled = False

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


class GateTool:
    """Waits until the test opens the gate; `entered` is set when it starts waiting."""

    name = "gate"
    description = "waits for the test"
    parameters = _OBJECT

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.gate = trio.Event()

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.entered.set()
        await self.gate.wait()
        return ToolResult.success("gate opened")


class EchoTool:
    """Returns its `text` argument (or `size` words): output without todo progress."""

    name = "echo"
    description = "echoes text"
    parameters = _OBJECT

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if "size" in args:
            return ToolResult.success("word " * int(args["size"]))
        return ToolResult.success(str(args.get("text", "")))


class BumpTool:
    """Adds a todo step on every call (real todo progress) and always answers "ok"."""

    name = "bump"
    description = "adds a todo step"
    parameters = _OBJECT

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raw = await ctx.kv.kv_get(TODO_SCOPE, ctx.session_id)
        steps = list(raw) if isinstance(raw, list) else []
        steps.append({"text": f"extra step {len(steps) + 1}", "status": "pending"})
        await ctx.kv.kv_set(TODO_SCOPE, ctx.session_id, steps)
        return ToolResult.success("ok")


def toolset(*extra: Tool) -> list[Tool]:
    """The built-in state tools the loop tests use, plus `extra`."""
    return [TodoTool(), MemoryTool(), SwitchProfileTool(), *extra]


def with_tools(names: Iterable[str], **flags: Any) -> dict[str, Any]:
    """Profile changes: offer exactly `names` to the agent, plus any flags."""
    return {"tools": {"agent": list(names), "subagent": []}, **flags}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A fake-LLM reply that makes one tool call."""
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def gated_harness(tmp_path: Path, gate: GateTool, replies: list[dict[str, Any]], **kw: Any) -> Any:
    """A harness whose first LLM reply calls `gate` (the turn waits in it), then `replies`."""
    return open_harness(
        tmp_path,
        replies=[call("gate"), *replies],
        tools=toolset(gate),
        profiles={"general": with_tools(["gate"])},
        **kw,
    )


def of_type(frames: Sequence[Mapping[str, Any]], type_: str) -> list[Mapping[str, Any]]:
    return [f for f in frames if f["type"] == type_]


def system_notes(body: Mapping[str, Any]) -> list[str]:
    """The contents of the system messages of one recorded request body."""
    return [m["content"] for m in body["messages"] if m["role"] == "system"]


def tool_contents(body: Mapping[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def assert_paired(messages: Sequence[Mapping[str, Any]]) -> None:
    """Every assistant tool call is followed DIRECTLY by exactly one result with its id.

    An assistant message with n tool calls is followed by n tool messages answering
    those n calls (each once, none other, in any order); a tool message anywhere else
    (a second result, an orphan, a result after a user message) fails.
    """
    i = 0
    while i < len(messages):
        m = messages[i]
        if m["role"] == "tool":
            raise AssertionError(
                f"message {i}: tool result {m.get('tool_call_id')!r} does not follow its call"
            )
        calls = m.get("tool_calls") or ()
        ids = [c["id"] for c in calls]
        after = messages[i + 1 : i + 1 + len(ids)]
        got = [x.get("tool_call_id") for x in after if x["role"] == "tool"]
        assert sorted(got, key=str) == sorted(ids, key=str) and len(got) == len(after), (
            f"message {i}: calls {ids} are not followed directly by their results "
            f"(got {[(x['role'], x.get('tool_call_id')) for x in after]})"
        )
        i += 1 + len(ids)


def assert_wire_paired(messages: Sequence[Mapping[str, Any]]) -> None:
    """The same on Ollama's wire, which has no ids: n calls, then their n results in order."""
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") or ()
        after = messages[i + 1 : i + 1 + len(calls)]
        names = [c["function"]["name"] for c in calls]
        assert [(x["role"], x.get("tool_name")) for x in after] == [("tool", n) for n in names], (
            f"message {i}: calls {names} are not followed by their results"
        )


async def seed(h: Any, session_id: str = "s1", profile_id: str = "general") -> None:
    """Create a session with one earlier user message: the next message is not the
    session's first, so a non-casual message runs no planning (unless a flag says so)."""
    earlier = {"role": "user", "content": "earlier"}
    await h.runtime.store.create_session(session_id, profile_id=profile_id)
    await h.runtime.store.append(session_id, messages=[earlier], context=[earlier])
