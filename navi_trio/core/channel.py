"""The bounded merging channel: a sender that never blocks, a reader that waits.

The output path has two of them: a run's events (`core/emit.py`, sent from
synchronous callbacks that must never block) and each subscriber's frames
(`core/broadcast.py`, sent by the session without waiting for any client). Both need
the same thing: ``send_nowait`` that never waits, a queue that never grows without
bound, and waiting items merged instead of piling up (the rule is `core/deltas.py`).
What differs is only how a value goes in (merged, queued, an older one dropped, or
refused with `trio.WouldBlock`): that is a `MergingQueue` subclass's `put`. The queue,
its waiter and the two ends are written here once.

The ends behave as trio's memory channels do: closing the sender lets the reader take
what waits, then `trio.EndOfChannel`; after the reader closes, a send raises
`trio.BrokenResourceError`; a closed end raises `trio.ClosedResourceError`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Generic, TypeVar

import attrs
import trio

T = TypeVar("T")


@attrs.frozen
class ChannelStats:
    queued: int  # items waiting for the reader now
    merged: int  # items merged into one that waited
    dropped: int  # items dropped (their newer neighbours went through)


class MergingQueue(Generic[T]):
    """The items waiting and the reader's waiter; `put` is the policy (subclasses)."""

    def __init__(self) -> None:
        self.items: collections.deque[T] = collections.deque()
        self.merged = 0
        self.dropped = 0
        self.send_closed = False
        self.recv_closed = False
        self._waiter = trio.Event()

    def put(self, value: T) -> bool:
        """Queue or merge `value`; True when the reader has something new to wake for.
        May raise `trio.WouldBlock` (the queue is full and `value` cannot merge)."""
        raise NotImplementedError

    def merge_into_tail(self, value: T, merged: Callable[[T, T], T | None]) -> bool:
        """Merge `value` into the item waiting last, when `merged` (the rule) lets it."""
        if not self.items:
            return False
        item = merged(self.items[-1], value)
        if item is None:
            return False
        self.items[-1] = item
        self.merged += 1
        return True

    def take(self) -> T:
        return self.items.popleft()

    def clear(self) -> None:
        self.items.clear()

    def wake(self) -> None:
        self._waiter.set()

    async def wait(self) -> None:
        self._waiter = trio.Event()
        await self._waiter.wait()


class MergingSender(trio.abc.SendChannel[T]):
    """The producer's end: `send_nowait` never blocks."""

    def __init__(self, queue: MergingQueue[T]) -> None:
        self._q = queue

    def send_nowait(self, value: T) -> None:
        q = self._q
        if q.send_closed:
            raise trio.ClosedResourceError("this channel was closed")
        if q.recv_closed:
            raise trio.BrokenResourceError("the reader of this channel left")
        if q.put(value):
            q.wake()

    async def send(self, value: T) -> None:
        await trio.lowlevel.checkpoint()
        self.send_nowait(value)

    def close(self) -> None:
        self._q.send_closed = True
        self._q.wake()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def __enter__(self) -> MergingSender[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MergingReceiver(trio.abc.ReceiveChannel[T]):
    """The reader's end: ``async for item in receiver`` until the sender closes it."""

    def __init__(self, queue: MergingQueue[T]) -> None:
        self._q = queue

    @property
    def merged(self) -> int:
        """Items merged into one that waited (for tests and benchmarks)."""
        return self._q.merged

    def statistics(self) -> ChannelStats:
        q = self._q
        return ChannelStats(queued=len(q.items), merged=q.merged, dropped=q.dropped)

    def receive_nowait(self) -> T:
        q = self._q
        if q.recv_closed:
            raise trio.ClosedResourceError("this channel was closed")
        if q.items:
            return q.take()
        if q.send_closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    async def receive(self) -> T:
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                value = self.receive_nowait()
            except trio.WouldBlock:
                await self._q.wait()
                continue
            await trio.lowlevel.cancel_shielded_checkpoint()
            return value

    def close(self) -> None:
        self._q.recv_closed = True
        self._q.clear()
        self._q.wake()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def __enter__(self) -> MergingReceiver[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_merging_channel(queue: MergingQueue[T]) -> tuple[MergingSender[T], MergingReceiver[T]]:
    """The two ends of a channel over `queue` (its class says how values go in)."""
    return MergingSender(queue), MergingReceiver(queue)
