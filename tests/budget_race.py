"""Many new sessions of one user started at once, every model call of theirs held until
each has one waiting or has ended: the worst case for a shared budget, made on purpose.

`race(clients, fake, n)` sends `n` messages (each a new session) spread over `clients`
(connections of one user, to one daemon or several), closes the fake LLM's gate and
opens it only when every session has a call waiting at the fake or has ended: so no
session spends before all have asked to (a budget counted only after the fact lets all
`n` through). With `tool` (a `HeldEcho`), the first tool calls are held the same way.
Every wait is on a trio.Event; nothing sleeps. Returns each session's `stream_end`.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
from api_ws import Client

from navi_trio.testing import FakeLLMServer
from navi_trio.tools.base import ToolContext, ToolResult


@attrs.define
class Changes:
    """Something a waiter looks at changed: `poke` wakes whoever `wait`s now."""

    event: trio.Event = attrs.Factory(trio.Event)

    def poke(self) -> None:
        self.event.set()
        self.event = trio.Event()

    async def wait(self) -> None:
        await self.event.wait()


class HeldEcho:
    """An ``echo`` tool whose calls wait for `gate`; `waiting` names their sessions."""

    name = "echo"
    description = "echoes"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.changes = Changes()
        self.calls = 0
        self.waiting: set[str] = set()

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.calls += 1
        self.waiting.add(ctx.session_id)
        self.changes.poke()
        await self.gate.wait()
        return ToolResult.success("echo")


async def race(
    clients: list[Client], fake: FakeLLMServer, n: int, tool: HeldEcho | None = None
) -> dict[str, dict[str, Any]]:
    """Start `n` sessions at once (see the module); each one's stream_end, by session."""
    fake.gate = trio.Event()
    changes = tool.changes if tool is not None else Changes()
    ends: dict[str, dict[str, Any]] = {}
    for i in range(n):
        await clients[i % len(clients)].send({"type": "message", "content": f"loop {i}"})

    async def read(c: Client) -> None:
        while True:
            frame = await c.next()
            if frame["type"] == "error":
                raise AssertionError(f"a message was refused: {frame}")
            if frame["type"] == "stream_end" and not frame["is_subagent"]:
                ends[frame["session_id"]] = frame
                changes.poke()

    async def watch_fake() -> None:
        while True:
            await fake.wait_requests(len(fake.requests) + 1)
            changes.poke()

    async def keep(gate: trio.Event, waiting: Any) -> None:
        while waiting() + len(ends) < n:
            await changes.wait()
        gate.set()

    async with trio.open_nursery() as nursery:
        for c in clients:
            nursery.start_soon(read, c)
        nursery.start_soon(watch_fake)
        await keep(fake.gate, lambda: fake.waiting)
        if tool is not None:
            await keep(tool.gate, lambda: len(tool.waiting - set(ends)))
        while len(ends) < n:
            await changes.wait()
        nursery.cancel_scope.cancel()
    return ends
