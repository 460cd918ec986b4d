"""How many trips through trio's scheduler a frame costs on its way out.

Each hop of the output path (a subscriber's frame queue read by its pump, the outbox read
by the connection's writer) is a task that waits for the next item. A reader woken for
an item has yielded already: it takes the item in that one step, with no second trip
through the scheduler, and a sender whose text fits in an outbox nobody waits on puts it
without yielding. A session's frame reaches its connection's outbox in the publisher's
own call (no task switch) while the connection's pump waits. Counted with a trio
`Instrument` (the steps of each task), so the figures are exact, not timed.

Rules: trio alone (no I/O, no threads): `wait_all_tasks_blocked` says when the reader
waits; the autojump clock's limit bounds each test.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable

import trio
import trio.testing

from navi_trio.api.outbox import Outbox
from navi_trio.api.protocol import event_frame, resync_frame
from navi_trio.core.session import Follower, LocalBroadcast
from navi_trio.core.turn import open_frame_channel
from navi_trio.events import TextDelta

LIMIT = 60  # virtual seconds
ITEMS = 50


class Steps(trio.abc.Instrument):
    """The steps each task took, by its name."""

    def __init__(self) -> None:
        self.steps: collections.Counter[str] = collections.Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name] += 1


async def _steps_to_read(
    read: Callable[[], Awaitable[object]], put: Callable[[int], Awaitable[None]]
) -> tuple[int, int]:
    """ITEMS items put one at a time while the reader waits: (reader's steps, putter's)."""
    steps = Steps()
    got: list[object] = []

    async def reader() -> None:
        while True:
            got.append(await read())

    async def putter() -> None:
        for i in range(ITEMS):
            await put(i)
            await trio.testing.wait_all_tasks_blocked()

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader, name="reader")
            await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.add_instrument(steps)
            try:
                await putter()
            finally:
                trio.lowlevel.remove_instrument(steps)
            nursery.cancel_scope.cancel()
    assert len(got) == ITEMS
    return steps.steps["reader"], steps.steps[trio.lowlevel.current_task().name]


async def test_a_waiting_pump_takes_each_frame_in_one_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, frames = open_frame_channel(ITEMS, 10**6)

    async def put(i: int) -> None:
        send.send_nowait({"type": "tool_started", "seq": i})

    reader, _ = await _steps_to_read(frames.receive, put)
    assert reader == ITEMS, reader


async def test_a_waiting_writer_takes_each_text_in_one_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outbox = Outbox(ITEMS, 10**6)

    async def put(i: int) -> None:
        await outbox.put(f"frame {i}")

    reader, putter = await _steps_to_read(outbox.get, put)
    assert reader == ITEMS, reader
    # The putter's own steps are its waits for the reader (one each), none for the put.
    assert putter == ITEMS, putter


async def test_a_waiting_pump_hands_each_frame_on_in_the_publishers_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A `Follower` with a hand, its reader waiting: each frame the session publishes
    goes to the hand in `publish` itself (the reader takes no step) and counts as seen
    (`last_seq`); one the hand declines is read by the reader as before."""
    b = LocalBroadcast("s1", encode=event_frame, resync=resync_frame)
    handed: list[int] = []
    read: list[object] = []

    def hand(frame: dict[str, object]) -> bool:
        if frame.get("text") == "declined":
            return False
        handed.append(int(str(frame["seq"])))
        return True

    steps = Steps()
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            follower = Follower(b.subscribe, lambda: b.epoch, hand=hand)

            async def reader() -> None:
                async for item in follower:
                    read.append(item)

            nursery.start_soon(reader, name="reader")
            await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.add_instrument(steps)
            for i in range(ITEMS):
                b.publish(TextDelta(text=f"t{i}"))
            assert follower.last_seq == ITEMS
            b.publish(TextDelta(text="declined"))
            await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.remove_instrument(steps)
            nursery.cancel_scope.cancel()
    follower.close()
    assert handed == list(range(1, ITEMS + 1))
    assert [f["text"] for f in read if isinstance(f, dict)] == ["declined"]
    assert follower.last_seq == ITEMS + 1
    assert steps.steps["reader"] == 1
