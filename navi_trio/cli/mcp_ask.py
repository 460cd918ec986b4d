"""One `ask` call of `navi mcp serve`: its progress, its answer, its stop on cancel.

A cancelled call stops the run as Ctrl-C stops `navi run`, and waits at most
`STOP_GRACE` seconds for it to end.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from navi_trio.cli.common import one_line
from navi_trio.errors import NaviError, leaves
from navi_trio.events import (
    ErrorEvent,
    StreamEnd,
    SubagentStarted,
    TextDelta,
    ToolStarted,
    WarningEvent,
    event_from_dict,
)
from navi_trio.wire import Frame

PROGRESS_INTERVAL = 0.5  # seconds between two progress notifications of one call
PROGRESS_LIMIT = 200  # notifications per call; the rest is dropped
STEPS_WAITING = 20  # steps kept while the client reads slowly (the oldest go first)
LINE_MAX = 300  # characters of one progress message
STOP_GRACE = 10.0  # seconds a cancelled call waits for its run to stop and save


def cut(text: str, limit: int = LINE_MAX) -> str:
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@attrs.define(eq=False)
class ProgressPump:
    """Sends one call's progress: waiting steps joined, else the newest answer text, at
    most one notification per `interval` and `limit` in all. `step` and `text` are
    synchronous; `finish` makes `run` send what still waits and return.
    """

    report: Callable[[float, str], Awaitable[None]]
    interval: float = PROGRESS_INTERVAL
    limit: int = PROGRESS_LIMIT
    steps: deque[str] = attrs.field(factory=lambda: deque(maxlen=STEPS_WAITING))
    tail: str = ""  # the end of the answer so far
    text_new: bool = False
    sent: int = 0
    _closing: trio.Event = attrs.field(factory=trio.Event)
    _wake: trio.Event = attrs.field(factory=trio.Event)

    def step(self, line: str) -> None:
        self.steps.append(cut(line))
        self._wake.set()

    def text(self, delta: str) -> None:
        self.tail = (self.tail + delta)[-LINE_MAX:]
        self.text_new = True
        self._wake.set()

    def finish(self) -> None:
        self._closing.set()
        self._wake.set()

    def _next(self) -> str | None:
        if self.steps:
            line = " | ".join(self.steps)
            self.steps.clear()
            return cut(line)
        if self.text_new:
            self.text_new = False
            return "answer: " + cut(self.tail)
        return None

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self.sent < self.limit and (line := self._next()) is not None:
                self.sent += 1
                await self.report(float(self.sent), line)
                with trio.move_on_after(self.interval):  # the rate limit, cut by `finish`
                    await self._closing.wait()
            if self._closing.is_set():
                return


@attrs.define(eq=False)
class AskFeed:
    """The frame sink of one ask: keeps the answer, turns steps into progress."""

    pump: ProgressPump
    since_tool: list[str] = attrs.field(factory=list)  # top-level text after the last call
    end: StreamEnd | None = None
    error: str | None = None
    notes: list[str] = attrs.field(factory=list)

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.pump.step(text)

    def show(self, frame: Frame) -> bool:
        if frame.get("type") == "resync":
            return False  # some frames were skipped: the answer comes whole in stream_end
        event = event_from_dict({k: v for k, v in frame.items() if k != "epoch"})
        top = not event.is_subagent
        who = "" if top else f"[{event.agent_id or 'sub-agent'}] "
        if isinstance(event, TextDelta) and top:
            self.since_tool.append(event.text)
            self.pump.text(event.text)
        elif isinstance(event, ToolStarted):
            if top:
                self.since_tool.clear()
            self.pump.step(f"{who}tool {event.name} {_arguments(event.arguments)}")
        elif isinstance(event, SubagentStarted):
            self.pump.step(f"{who}sub-agent ({event.profile_id}): {event.task}")
        elif isinstance(event, WarningEvent):
            self.note(f"warning: {who}{one_line(event.message)}")
        elif isinstance(event, ErrorEvent) and top:
            self.error = one_line(event.message)
        elif isinstance(event, StreamEnd) and top:
            self.end = event
            return True
        return False

    @property
    def answer(self) -> str:
        if self.end is not None and self.end.text:
            return self.end.text
        return "".join(self.since_tool)


def _arguments(arguments: dict[str, Any]) -> str:
    parts = [f"{k}={v!r}" for k, v in arguments.items()]
    return cut(", ".join(parts), 200)


@attrs.define(eq=False)
class Stopper:
    """Stops the run when the call is cancelled, as soon as there is a run to stop."""

    wanted: bool = False
    action: Callable[[], object] | None = None

    def switch(self, action: Callable[[], object]) -> None:
        self.action = action
        if self.wanted:
            action()

    def want(self) -> None:
        self.wanted = True
        if self.action is not None:
            self.action()


async def follow_stopping_on_cancel(
    follow: Callable[[Stopper], Awaitable[None]], grace: float = STOP_GRACE
) -> None:
    """Run `follow` shielded from the caller's cancellation; when that comes, stop the
    run and give it `grace` seconds to end (its stopped turn saved). The cancellation
    then goes on as usual."""
    stopper = Stopper()
    shield = trio.CancelScope(shield=True)
    done = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            try:
                await trio.sleep_forever()
            finally:
                if not done:  # the caller was cancelled (or `follow` failed)
                    stopper.want()
                    shield.deadline = trio.current_time() + grace

        nursery.start_soon(watch)
        with shield:
            await follow(stopper)
        done = True
        nursery.cancel_scope.cancel()


def one_error(group: BaseExceptionGroup[Any]) -> BaseException | None:
    """The single expected leaf of a group from a nursery, else None."""
    found = leaves(group)
    return found[0] if len(found) == 1 and isinstance(found[0], NaviError) else None
