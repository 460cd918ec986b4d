"""Test-only tools for the sub-agent, background and parallel-batch tests (issue 4).

Every tool keeps its state on its own instance (what it saw, the events it waits on),
so a test makes fresh ones with `make_kit()`; nothing here is a module-level singleton.

- `MeetTool` ("meet"): announces its start on a shared `Rendezvous`, then waits for the
  start (or the end) of the other calls it names. Three of them in one batch deadlock
  when run one by one and finish when run concurrently.
- `BoomTool` ("boom"): always raises.
- `BlockTool` ("block"): waits on a per-label gate that only the test opens (forever
  otherwise); counts how often it was cancelled; reports progress through `ctx.emit`
  and `ctx.publish` after the gate opens, i.e. possibly long after the turn that
  started it has ended.
- `SnapshotTool` ("snapshot"): records `runvars.snapshot()` and its ToolContext.
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from navi_trio.core.turn import runvars
from navi_trio.events import WarningEvent
from navi_trio.runtime import default_tools
from navi_trio.settings import DEFAULT_BACKGROUNDABLE, Settings
from navi_trio.tools.base import Tool, ToolContext, ToolResult

_OPEN: dict[str, Any] = {"type": "object", "properties": {}}


class _Changed:
    """Wait until a predicate over some state holds, woken on every change (no polling)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            await self._event.wait()


class Rendezvous:
    """Shared start/finish events of the `meet` calls of one test, and their order."""

    def __init__(self) -> None:
        self.started: collections.defaultdict[str, trio.Event] = collections.defaultdict(trio.Event)
        self.finished: collections.defaultdict[str, trio.Event] = collections.defaultdict(
            trio.Event
        )
        self.log: list[str] = []


class MeetTool:
    name = "meet"
    description = "meets other calls"
    parameters = _OPEN

    def __init__(self, rendezvous: Rendezvous) -> None:
        self.rv = rendezvous

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        me = str(args["name"])
        patience = args.get("patience")
        self.rv.log.append(f"start:{me}")
        ctx.emit({"who": me, "phase": "arrived"})
        self.rv.started[me].set()
        with trio.move_on_after(math.inf if patience is None else float(patience)) as waited:
            for other in args.get("wait_start", []):
                await self.rv.started[other].wait()
            for other in args.get("wait_end", []):
                await self.rv.finished[other].wait()
        self.rv.log.append(f"end:{me}")
        self.rv.finished[me].set()
        if waited.cancelled_caught:
            return ToolResult.fail(f"{me} gave up waiting for the others")
        return ToolResult.success(f"{me} met the others")


class BoomTool:
    name = "boom"
    description = "always raises"
    parameters = _OPEN

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise RuntimeError("boom: a deliberate tool bug")


@attrs.frozen
class BlockCall:
    label: str
    args: dict[str, Any]
    ctx: ToolContext
    vars: dict[str, Any]


class BlockTool:
    """Blocks until the test calls `release(label)`; forever if it never does."""

    name = "block"
    description = "waits until released"
    parameters = _OPEN

    def __init__(self) -> None:
        self.calls: list[BlockCall] = []
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        self._gates: collections.defaultdict[str, trio.Event] = collections.defaultdict(trio.Event)
        self._changed = _Changed()

    def release(self, label: str = "default") -> None:
        self._gates[label].set()

    async def wait_started(self, n: int = 1) -> None:
        await self._changed.until(lambda: len(self.calls) >= n)

    async def wait_finished(self, n: int = 1) -> None:
        await self._changed.until(lambda: len(self.finished) + len(self.cancelled) >= n)

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        label = str(args.get("label", "default"))
        self.calls.append(BlockCall(label, dict(args), ctx, runvars.snapshot()))
        self._changed.notify()
        ctx.emit({"phase": "waiting", "label": label})
        try:
            await self._gates[label].wait()
        except trio.Cancelled:
            self.cancelled.append(label)
            self._changed.notify()
            raise
        # Spoken after the gate opens: for a background job, long after its turn ended.
        ctx.emit({"phase": "released", "label": label})
        ctx.publish(WarningEvent(message=f"{label} says goodbye", code="block"))
        self.finished.append(label)
        self._changed.notify()
        return ToolResult.success(f"block {label} released")


class SnapshotTool:
    """Records the run variables and the context it ran with; returns them as JSON."""

    name = "snapshot"
    description = "records the run variables"
    parameters = _OPEN

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        vars_now = runvars.snapshot()
        self.records.append(
            {
                "label": args.get("label"),
                "vars": vars_now,
                "args": dict(args),
                "session_id": ctx.session_id,
                "session_dir": ctx.session_dir,
                "cwd": ctx.cwd,
                "is_subagent": ctx.is_subagent,
            }
        )
        return ToolResult.success(json.dumps(vars_now, default=str, sort_keys=True))

    def by_label(self, label: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["label"] == label]


@attrs.define(eq=False)
class Kit:
    """One test's tools, with the standard ones they run beside."""

    rendezvous: Rendezvous
    meet: MeetTool
    boom: BoomTool
    block: BlockTool
    snapshot: SnapshotTool

    def tools(self, settings: Settings | None = None) -> list[Tool]:
        return [
            *default_tools(settings or Settings()),
            self.meet,
            self.boom,
            self.block,
            self.snapshot,
        ]


def make_kit() -> Kit:
    rv = Rendezvous()
    return Kit(
        rendezvous=rv,
        meet=MeetTool(rv),
        boom=BoomTool(),
        block=BlockTool(),
        snapshot=SnapshotTool(),
    )


TEST_TOOLS = ("meet", "boom", "block", "snapshot")
# "block" joins the spec's list so that the executor detaches it like terminal run.
BACKGROUNDABLE = (*DEFAULT_BACKGROUNDABLE, "block")


def profile(agent: Iterable[str], subagent: Iterable[str] = (), **flags: Any) -> dict[str, Any]:
    """Profile changes for test_config: exactly these tool lists, plus any flags."""
    return {"tools": {"agent": list(agent), "subagent": list(subagent)}, **flags}


def call(tool: str, /, **arguments: Any) -> dict[str, Any]:
    """One tool call of a fake-LLM reply."""
    return {"name": tool, "arguments": arguments}


def calls(*items: dict[str, Any]) -> dict[str, Any]:
    """A fake-LLM reply making these tool calls (in one response)."""
    return {"tool_calls": list(items)}


def of_type(frames: Sequence[Mapping[str, Any]], type_: str, **match: Any) -> list[Any]:
    return [
        f for f in frames if f["type"] == type_ and all(f.get(k) == v for k, v in match.items())
    ]


def system_texts(body: Mapping[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "system"]


def tool_names(body: Mapping[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or []]
