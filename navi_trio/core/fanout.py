"""A subscriber's frame queue: bounded, and deltas that wait are merged.

The session actor sends every frame to each subscriber without waiting
(`FrameSender.send_nowait`). While a subscriber is behind, a text (or thinking) delta
frame is merged into the same kind of delta frame waiting at the tail of its queue
(same session, epoch and agent): the texts joined, the seq the new frame's. A frame
with seq N still means "everything up to N", so replay and ``lagged`` work as before,
and a reader that is behind gets one frame where it would have got one per token.
Frames of any other type are never merged and never merged across. When `max_frames`
frames wait and the new one cannot merge, `send_nowait` raises `trio.WouldBlock`: the
actor cuts that subscriber off (``lagged``).
"""

from __future__ import annotations

import collections
from typing import Any

import trio

from navi_trio.core.replay import MERGE_MAX_CHARS, MERGEABLE, SAME_SOURCE

Frame = dict[str, Any]


def merged_frame(old: Frame, new: Frame) -> Frame | None:
    """`new` with `old`'s text in front, when both are deltas of one kind and source."""
    kind = new.get("type")
    if kind not in MERGEABLE or old.get("type") != kind:
        return None
    a, b = old.get("text"), new.get("text")
    if not (isinstance(a, str) and isinstance(b, str)) or len(a) + len(b) > MERGE_MAX_CHARS:
        return None
    if not (isinstance(old.get("seq"), int) and isinstance(new.get("seq"), int)):
        return None
    if any(old.get(k) != new.get(k) for k in SAME_SOURCE):
        return None
    return {**new, "text": a + b}


class _Queue:
    def __init__(self, max_frames: int) -> None:
        self.max_frames = max(max_frames, 1)
        self.items: collections.deque[Frame] = collections.deque()
        self.send_closed = False
        self.recv_closed = False
        self.merged = 0
        self.waiter = trio.Event()


class FrameSender:
    """The actor's end of one subscription."""

    def __init__(self, queue: _Queue) -> None:
        self._q = queue

    def send_nowait(self, frame: Frame) -> None:
        q = self._q
        if q.send_closed:
            raise trio.ClosedResourceError("this subscription was closed")
        if q.recv_closed:
            raise trio.BrokenResourceError("the subscriber left")
        if q.items:
            merged = merged_frame(q.items[-1], frame)
            if merged is not None:
                q.items[-1] = merged
                q.merged += 1
                return
        if len(q.items) >= q.max_frames:
            raise trio.WouldBlock
        q.items.append(frame)
        q.waiter.set()

    def close(self) -> None:
        self._q.send_closed = True
        self._q.waiter.set()


class FrameReceiver(trio.abc.ReceiveChannel[Frame]):
    """The subscriber's end: ``async for frame in frames`` until the actor closes it."""

    def __init__(self, queue: _Queue) -> None:
        self._q = queue

    @property
    def merged(self) -> int:
        """Frames merged into one that waited (for tests and benchmarks)."""
        return self._q.merged

    def receive_nowait(self) -> Frame:
        q = self._q
        if q.recv_closed:
            raise trio.ClosedResourceError("this subscription was closed")
        if q.items:
            return q.items.popleft()
        if q.send_closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    async def receive(self) -> Frame:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q
        while True:
            try:
                frame = self.receive_nowait()
            except trio.WouldBlock:
                q.waiter = trio.Event()
                await q.waiter.wait()
                continue
            await trio.lowlevel.cancel_shielded_checkpoint()
            return frame

    def close(self) -> None:
        self._q.recv_closed = True
        self._q.items.clear()
        self._q.waiter.set()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()


def open_frame_channel(max_frames: int) -> tuple[FrameSender, FrameReceiver]:
    """One subscriber's queue, at most `max_frames` frames waiting (module docstring)."""
    queue = _Queue(max_frames)
    return FrameSender(queue), FrameReceiver(queue)
