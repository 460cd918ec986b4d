"""The output path's merging: the one rule for what merges, and the bounded channels
where deltas wait and merge (never-blocking senders, waiting readers).

The rule ("may two deltas merge", for events and for frames alike). Text (and thinking)
deltas that wait for a slow reader are merged: the texts joined, one item to hand on
instead of one per token. Two deltas merge when they are of the same kind (text with
text, thinking with thinking) and from the same source: the same agent
(``is_subagent``, ``agent_id``) and, for frames, the same session and epoch. A merged
frame carries the later seq: a frame with seq N still means "everything up to N", so
replay and ``lagged`` work as before. Nothing else merges, and a delta never merges
across an item of its own source's that came between. A merged frame stops growing at
`MERGE_MAX_CHARS` of text (one WebSocket message, one replay entry); an event has no
such cap, since the answer's own size cap (``answer_max_chars``) bounds it.

The merge points, the only three on the output path: a run's event channel and each
subscriber's frame queue (here), and the session's replay buffer (`core/session/broadcast.py`).
The connection's writer does not merge: what its pumps hand it comes out of a
subscriber's queue, where deltas already merged while the pump waited.

The channels. A delta on its way to a client waits in two kinds of queue: a run's events
(sent from synchronous callbacks that must never block: `open_event_channel`) and each
subscriber's frames (sent by the session without waiting for any client:
`open_frame_channel`, core/session/broadcast.py). Both need ``send_nowait`` that never waits, a
queue that never grows without bound, and waiting deltas merged instead of piling up.
What differs is only how a value goes in — merged, queued, an older one dropped, or
refused with `trio.WouldBlock` — which is a `MergingQueue` subclass's `put`
(`EventQueue`, `FrameQueue`). The queue, its waiter and the two ends are written once.

The ends behave as trio's memory channels do: closing the sender lets the reader take
what waits, then `trio.EndOfChannel`; after the reader closes, a send raises
`trio.BrokenResourceError`; a closed end raises `trio.ClosedResourceError`.

A run's events (`EventQueue`). The run cannot be pushed back on (a tool's progress
callback must never block), and an unbounded channel turned a slow reader plus a
chatty tool into gigabytes:

- A text (thinking) delta sent while the last waiting event is a delta it may merge
  with (the rule) is merged into it: one event to hand on instead of one per token.
- *Progress* events — `TextDelta`, `ThinkingDelta` and `ToolEvent` — are queued as
  they are while fewer than `max_progress` of them wait. Beyond that, a new one is
  merged into the latest waiting one from the same source (text deltas: texts joined;
  tool output: lines joined, the oldest beyond `max_chars` dropped and counted in
  ``dropped_lines``), never across another event, so each source keeps its order. A
  tool event that cannot merge replaces the oldest waiting tool event (counted).
- Every other event (tool_started, tool_result, stream_end, error, …) is always
  queued: never merged, never dropped. A turn has only so many of those.

With a reader that keeps up nothing is ever merged: it sees exactly what was sent.
`statistics()` tells how many events were merged and dropped.

A subscriber's frames (`FrameQueue`): a delta frame merges into the one waiting last;
at most `max_frames` wait, and `max_chars` of them (`frame_size`), and one more that
cannot merge raises `trio.WouldBlock` (the session cuts that subscriber off: ``lagged``).
A frame bigger than `max_chars` alone still goes into an empty queue.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, cast

import attrs
import trio

from navi_trio.events import AgentEvent, TextDelta, ThinkingDelta, ToolEvent

T = TypeVar("T")
Frame = dict[str, Any]

# -- the rule ---------------------------------------------------------------------------

KINDS = frozenset({TextDelta.type, ThinkingDelta.type})
MERGE_MAX_CHARS = 64_000
_DELTA_EVENTS = (TextDelta, ThinkingDelta)
_Delta = TextDelta | ThinkingDelta

# Every delta of a long answer passes here at each merge point: the checks are written
# out (no tuples built, no generator) because this is the output path's hottest code.


def event_agent(event: AgentEvent) -> tuple[bool, str | None]:
    """Which agent an event comes from: the main one, or which sub-agent."""
    return event.is_subagent, event.agent_id


def frames_merge(old: Frame, new: Frame) -> bool:
    """Whether `new` may merge into `old` (the rule, module docstring), size aside."""
    kind = new.get("type")
    return (
        kind in KINDS
        and old.get("type") == kind
        and isinstance(old.get("text"), str)
        and isinstance(new.get("text"), str)
        and isinstance(old.get("seq"), int)  # a delta always has a seq
        and isinstance(new.get("seq"), int)
        and old.get("session_id") == new.get("session_id")
        and old.get("epoch") == new.get("epoch")
        and old.get("is_subagent") == new.get("is_subagent")
        and old.get("agent_id") == new.get("agent_id")
    )


def events_merge(old: AgentEvent, new: AgentEvent) -> bool:
    """Whether `new` may merge into `old` (the rule, module docstring)."""
    kind = type(new)
    return (
        type(old) is kind
        and kind in _DELTA_EVENTS
        and old.is_subagent == new.is_subagent
        and old.agent_id == new.agent_id
    )


def merged_frame(old: Frame, new: Frame, max_chars: int = MERGE_MAX_CHARS) -> Frame | None:
    """`new` with `old`'s text in front, when the rule lets them merge; else None."""
    if not frames_merge(old, new):
        return None
    text = old["text"] + new["text"]
    if len(text) > max_chars:
        return None
    return {**new, "text": text}


def merged_event(old: AgentEvent, new: AgentEvent) -> AgentEvent | None:
    """`old` with `new`'s text after its own, when the rule lets them merge; else None."""
    if not events_merge(old, new):
        return None
    delta, more = cast(_Delta, old), cast(_Delta, new)  # events_merge checked the kind
    return attrs.evolve(delta, text=delta.text + more.text)


# -- the channel ------------------------------------------------------------------------


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
        self.reader_waits = False  # the reader is parked in `wait`, nothing left to take
        self._idle: trio.Event | None = None  # set when the reader parks (`settled`)
        # The reader's synchronous hand (`MergingReceiver.take_inline`), or None.
        self.inline: Callable[[T], bool] | None = None

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
        if self.recv_closed and self._idle is not None:
            self._idle.set()

    async def settled(self) -> None:
        """Until the reader has taken every item sent so far and waits for more (so it is
        done with them), or has left."""
        try:
            while not self.recv_closed and (self.items or not self.reader_waits):
                self._idle = trio.Event()
                await self._idle.wait()
        finally:
            self._idle = None

    async def wait(self) -> None:
        if self._waiter.is_set():  # an unset one is as good as new, and costs nothing
            self._waiter = trio.Event()
        self.reader_waits = True
        if self._idle is not None:
            self._idle.set()
        try:
            await self._waiter.wait()
        finally:
            self.reader_waits = False


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
        # A reader parked on an empty queue would take this next, and nothing else: its
        # synchronous hand takes it now, with no task switch (when it can).
        inline = q.inline
        if inline is not None and q.reader_waits and not q.items and inline(value):
            return
        if q.put(value):
            q.wake()

    async def send(self, value: T) -> None:
        await trio.lowlevel.checkpoint()
        self.send_nowait(value)

    async def settled(self) -> None:
        """Until the reader is done with every value sent so far (`MergingQueue.settled`)."""
        await self._q.settled()

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

    def take_inline(self, hand: Callable[[T], bool] | None) -> None:
        """Let `hand` take a value in the sender's own call, instead of this reader
        after a task switch, while the reader waits on an empty queue (so the order is
        the same: it would have taken that value next). `hand` returns False to leave
        the value to the reader after all (queued as usual); it must not block, nor
        raise. None: every value goes through the queue again."""
        self._q.inline = hand

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
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            raise trio.EndOfChannel from None

    async def __anext__(self) -> T:
        # The receive itself, for ``async for`` (the session actor's loop): one
        # coroutine less an item than trio's ``__anext__`` around ``receive``.
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q
        waited = False
        # `receive_nowait` written out: a reader that keeps up finds the queue empty at
        # every item, and a `trio.WouldBlock` raised and caught each time costs more
        # than the rest of the receive.
        while True:
            if q.recv_closed:
                raise trio.ClosedResourceError("this channel was closed")
            if q.items:
                value = q.take()
                # A reader that waited has yielded already: another trip through the
                # scheduler for each item would cost every delta a task switch more.
                if not waited:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return value
            if q.send_closed:
                raise StopAsyncIteration
            await q.wait()
            waited = True

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


# -- a run's events -------------------------------------------------------------------

PROGRESS_TYPES = (TextDelta, ThinkingDelta, ToolEvent)
DEFAULT_MAX_PROGRESS = 256
DEFAULT_MAX_CHARS = 8000  # of merged tool output in one event


EventSender = MergingSender[AgentEvent]  # the run's end: `send_nowait` never blocks
EventReceiver = MergingReceiver[AgentEvent]  # the reader's end


class SendsNowait(Protocol):
    """What a run's emitter needs: a send that never blocks."""

    def send_nowait(self, value: AgentEvent) -> None: ...


def is_progress(event: AgentEvent) -> bool:
    return isinstance(event, PROGRESS_TYPES)


def _is_output(event: ToolEvent) -> bool:
    data = event.data
    return data.get("stream") == "output" and isinstance(data.get("text"), str)


def _merge_output(old: ToolEvent, new: ToolEvent, max_chars: int) -> ToolEvent:
    a, b = old.data, new.data
    lines = int(a.get("lines", 0)) + int(b.get("lines", 0))
    dropped = int(a.get("dropped_lines", 0)) + int(b.get("dropped_lines", 0))
    parts = [d["text"] for d in (a, b) if d.get("lines")]
    text = "\n".join(parts)
    if len(text) > max_chars:
        kept = text[-max_chars:]
        newline = kept.find("\n")
        kept = kept[newline + 1 :] if newline >= 0 else kept
        kept_lines = kept.count("\n") + 1
        dropped += lines - kept_lines
        text, lines = kept, kept_lines
    data = {**b, "text": text, "lines": lines, "dropped_lines": dropped}
    return attrs.evolve(new, data=data)


class EventQueue(MergingQueue[AgentEvent]):
    """A run's events: the policy of the module docstring."""

    def __init__(self, max_progress: int, max_chars: int) -> None:
        super().__init__()
        self.max_progress = max(max_progress, 1)
        self.max_chars = max_chars
        self.progress = 0

    def put(self, event: AgentEvent) -> bool:
        if self.items and self.merge_into_tail(event, merged_event):
            return False  # the reader already has one waiting
        if not isinstance(event, PROGRESS_TYPES):
            self.items.append(event)
        elif self.progress < self.max_progress:
            self.items.append(event)
            self.progress += 1
        elif self._merge(event):
            self.merged += 1
            return False  # nothing new to wake for: the reader already has one waiting
        elif isinstance(event, ToolEvent) and self._drop_oldest_tool_event():
            self.dropped += 1
            self.items.append(event)
            self.progress += 1
        else:
            # A text delta after another event of its source: it cannot merge without
            # reordering. Its text is bounded by the answer's own size cap.
            self.items.append(event)
            self.progress += 1
        return True

    def _merge(self, event: AgentEvent) -> bool:
        """Merge into the latest waiting event of the same source, if order allows."""
        for i in range(len(self.items) - 1, -1, -1):
            item = self.items[i]
            if not is_progress(item):
                return False  # never across another event
            if event_agent(item) != event_agent(event):
                continue
            merged = merged_event(item, event) or self._merged_output(item, event)
            if merged is not None:
                self.items[i] = merged
                return True
            if not isinstance(item, ToolEvent) or not isinstance(event, ToolEvent):
                return False  # the same source's stream changed kind: keep the order
            if item.call_id == event.call_id:
                return False  # the same call's other kind of progress: keep the order
        return False

    def _merged_output(self, old: AgentEvent, new: AgentEvent) -> AgentEvent | None:
        if (
            isinstance(old, ToolEvent)
            and isinstance(new, ToolEvent)
            and (old.call_id, old.name) == (new.call_id, new.name)
            and _is_output(old)
            and _is_output(new)
        ):
            return _merge_output(old, new, self.max_chars)
        return None

    def _drop_oldest_tool_event(self) -> bool:
        for i, item in enumerate(self.items):
            if isinstance(item, ToolEvent):
                del self.items[i]
                self.progress -= 1
                return True
        return False

    def take(self) -> AgentEvent:
        event = self.items.popleft()
        if isinstance(event, PROGRESS_TYPES):
            self.progress -= 1
        return event

    def clear(self) -> None:
        self.items.clear()
        self.progress = 0


def open_event_channel(
    max_progress: int = DEFAULT_MAX_PROGRESS, max_chars: int = DEFAULT_MAX_CHARS
) -> tuple[EventSender, EventReceiver]:
    """A bounded, never-blocking channel for one run's events (module docstring)."""
    return open_merging_channel(EventQueue(max_progress, max_chars))


def emitter(send: SendsNowait) -> Callable[[AgentEvent], None]:
    """A run's `emit`: sends without blocking; once the reader left (the run is being
    stopped) its events go nowhere."""

    def emit(event: AgentEvent) -> None:
        try:
            send.send_nowait(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    return emit


# -- a subscriber's frames --------------------------------------------------------------


def frame_size(value: Any) -> int:
    """A cheap estimate of a frame's size in characters (strings count, the rest a little)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        # A frame is a flat dict of strings and scalars nearly always: those are counted
        # here, with no call (and no generator) for each.
        size = 0
        for v in value.values():
            if type(v) is str:
                size += len(v) + 8
            elif v is None or type(v) is int or type(v) is bool:
                size += 16
            else:
                size += frame_size(v) + 8
        return size
    if isinstance(value, list | tuple):
        return sum(frame_size(v) + 2 for v in value)
    return 8


@attrs.define
class MergeCount:
    """Deltas merged into a frame that waited, over many subscribers' queues: a plain
    int a daemon's metrics read at each scrape (nothing is called per frame)."""

    n: int = 0


class FrameQueue(MergingQueue[Frame]):
    """One subscriber's frames: a delta merges into the one waiting last; at most
    `max_frames` wait, and `max_chars` of them; one more that cannot merge raises
    `trio.WouldBlock`. Each merge also counts in `total`."""

    def __init__(self, max_frames: int, max_chars: int, total: MergeCount | None = None) -> None:
        super().__init__()
        self.max_frames = max(max_frames, 1)
        self.max_chars = max_chars
        self.total = total if total is not None else MergeCount()
        self.sizes: collections.deque[int] = collections.deque()  # each item's frame_size
        self.chars = 0

    def put(self, frame: Frame) -> bool:
        if self.items:
            merged = merged_frame(self.items[-1], frame)
            if merged is not None:
                self.items[-1] = merged
                self.merged += 1
                self.total.n += 1
                grow = len(frame["text"])
                self.sizes[-1] += grow
                self.chars += grow
                return False  # the reader already has one waiting
        size = frame_size(frame)
        if self.items and (
            len(self.items) >= self.max_frames or self.chars + size > self.max_chars
        ):
            raise trio.WouldBlock
        self.items.append(frame)
        self.sizes.append(size)
        self.chars += size
        return True

    def take(self) -> Frame:
        self.chars -= self.sizes.popleft()
        return self.items.popleft()

    def clear(self) -> None:
        self.items.clear()
        self.sizes.clear()
        self.chars = 0


def open_frame_channel(
    max_frames: int, max_chars: int, total: MergeCount | None = None
) -> tuple[MergingSender[Frame], MergingReceiver[Frame]]:
    """One subscriber's queue, at most `max_frames` frames and `max_chars` waiting
    (`FrameQueue`); its merges also count in `total`."""
    return open_merging_channel(FrameQueue(max_frames, max_chars, total))
