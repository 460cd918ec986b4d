"""A connection's outbox: the frames' texts waiting for its writer, bounded in bytes.

Every frame a connection sends waits here, encoded, until the writer hands it to the
socket, unless it could go to the socket at once while the writer waited (it then
counts here until the writer next runs: `sent_at_once`). A client that does not read
leaves the writer blocked on the socket; the outbox then fills and whoever sends next
waits for room: the reader (so the client's next requests stay unread in its socket,
where they cost the daemon nothing), a subscription's pump (its session then cuts that
subscription off: ``lagged``). Two bounds: `max_frames`
texts, and `max_bytes` of them in memory (`sys.getsizeof`, what the text really holds,
measured once as it comes in and kept beside it).
A text bigger than `max_bytes` alone still goes, when nothing else waits: it was built
already, and the daemon bounds each frame where it is made (a history reply is a page).

Senders take turns in arrival order (a `trio.Lock` is fair): a big reply is not starved
by small frames slipping past it. `close()` drops what waits, at once, whoever still
holds the outbox. The first wait of a stall is logged (at info, naming `who`): the
client stopped reading, or reads slower than the daemon answers.
"""

from __future__ import annotations

import collections
import logging
import sys

import trio

log = logging.getLogger(__name__)


class Outbox:
    def __init__(self, max_frames: int, max_bytes: int, who: str = "a connection") -> None:
        self.max_frames = max(max_frames, 1)
        self.max_bytes = max_bytes
        self.who = who
        self._stalled = False  # a sender waited since the outbox was last empty
        self._texts: collections.deque[tuple[str, int]] = collections.deque()  # with sizes
        self.bytes = 0
        self._turn = trio.Lock()  # the sender whose turn it is waits for room, alone
        self._room = trio.lowlevel.ParkingLot()  # that sender, parked
        self._ready = trio.lowlevel.ParkingLot()  # the writer, waiting for a text
        self._closed = False
        self._woken = False  # `wake` asked the writer to look up with nothing queued
        # Frames written at once (`sent_at_once`) since the writer last ran, and their
        # sizes: they count as waiting here, so a burst meets the bounds where it did.
        self._at_once = 0
        self._at_once_bytes = 0

    def __len__(self) -> int:
        return len(self._texts)

    def _fits(self, size: int) -> bool:
        # Nothing queued: it goes (and the writer, woken for it, frees the rest).
        if not self._texts:
            return True
        return self._has_room(len(self._texts), self.bytes + size)

    def _has_room(self, frames: int, size: int) -> bool:
        """`frames` more frames of `size` bytes in all, beside those sent at once since
        the writer last ran, are within both bounds."""
        return (
            frames + self._at_once < self.max_frames
            and size + self._at_once_bytes <= self.max_bytes
        )

    def put_nowait(self, text: str) -> bool:
        """Queue `text` now if nobody waits for room and it fits (no turn to take: a
        turn costs each frame a trip through the scheduler); False when it must wait."""
        return self._put_now(text, sys.getsizeof(text))

    def _put_now(self, text: str, size: int) -> bool:
        if self._turn.locked() or self._closed or not self._fits(size):
            return False
        self._texts.append((text, size))
        self.bytes += size
        if self._ready:  # unpark_all on an empty lot costs most of a microsecond
            self._ready.unpark_all()
        return True

    async def put(self, text: str) -> None:
        """Queue `text` for the writer, once there is room for it."""
        await trio.lowlevel.checkpoint_if_cancelled()
        size = sys.getsizeof(text)
        if self._put_now(text, size):
            return
        async with self._turn:
            while not self._fits(size):
                if self._closed:
                    raise trio.ClosedResourceError("the connection's outbox is closed")
                if not self._stalled:
                    self._stalled = True
                    log.info(
                        "%s: the client is not reading: %d frames (%d bytes) wait to be "
                        "sent; its requests wait",
                        self.who,
                        len(self._texts),
                        self.bytes,
                    )
                await self._room.park()
            if self._closed:
                raise trio.ClosedResourceError("the connection's outbox is closed")
            self._texts.append((text, size))
            self.bytes += size
            self._ready.unpark_all()

    def may_send_at_once(self, text: str) -> bool:
        """The writer is parked in `next` with nothing queued (it sends nothing now), and
        `text` fits: it may go to the socket without it, then `sent_at_once`."""
        if not self._ready or self._texts:
            return False
        return not self._at_once or self._has_room(0, sys.getsizeof(text))

    def sent_at_once(self, text: str) -> None:
        """`text` went to the socket without the writer: until the writer next runs it
        counts as waiting here (a burst in one call fills the bounds as it did)."""
        self._at_once += 1
        self._at_once_bytes += sys.getsizeof(text)

    def wake(self) -> None:
        """Make the writer's `next` return None once, if nothing is queued by then: it
        has something to do that is not a text (api/connection.py: a frame's rest)."""
        self._woken = True
        if self._ready:
            self._ready.unpark_all()

    async def get(self) -> str:
        """The oldest text waiting."""
        while (text := await self.next()) is None:
            pass
        return text

    async def next(self) -> str | None:
        """The oldest text waiting (the writer's end), or None after `wake`."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._at_once = self._at_once_bytes = 0  # the writer runs: they have gone
        waited = False
        while not self._texts:
            if self._closed:
                raise trio.EndOfChannel
            if self._woken:
                self._woken = False
                return None
            await self._ready.park()
            self._at_once = self._at_once_bytes = 0
            waited = True
        text, size = self._texts.popleft()
        self.bytes -= size
        if not self._texts:
            self._stalled = False
        if self._room:
            self._room.unpark_all()
        if not waited:  # a writer that waited has yielded already
            await trio.lowlevel.cancel_shielded_checkpoint()
        return text

    def close(self) -> None:
        """Drop what waits; a sender waiting for room, and any later one, gets
        `trio.ClosedResourceError`, the writer `trio.EndOfChannel`."""
        self._closed = True
        self._texts.clear()
        self.bytes = 0
        self._room.unpark_all()
        self._ready.unpark_all()
