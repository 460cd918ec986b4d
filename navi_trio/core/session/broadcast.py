"""A session's broadcast: its frames, from its actor to every subscriber.

This is the seam for events that cross daemons (DESIGN.md "Beyond one process"). The
session actor knows only the `SessionBroadcast` protocol; `LocalBroadcast` is the
in-process implementation. A later one publishes through PostgreSQL (``LISTEN`` /
``NOTIFY``, a pointer row when a frame is large) so that a client on any daemon follows
any session with the same rules:

``publish(event) -> frame``
    The event as the session's next frame: the next seq, this life's epoch, kept for
    replay, and offered to every subscriber without waiting for any of them.
``publish_out_of_band(event)``
    A frame with no seq (``task_update``): offered to the subscribers of the moment,
    never kept for replay (a client re-syncs through the tasks list).
``subscribe(last_seq=None, epoch=None) -> Subscription``
    Frames after `last_seq` from the replay, then live ones. With no `last_seq`, live
    frames only. When the frames after `last_seq` are no longer all kept, or `epoch` is
    another life's (the daemon restarted: seqs start again), the first frame is
    ``resync`` (reload the history; live frames go on from its seq). Never a silent gap.
``resync()``
    The history changed under the replay (a rewind rewrote it): the replay is dropped
    (a subscriber back from an older seq gets ``resync``) and every subscriber of the
    moment gets ``resync`` now.
``replay(last_seq) -> frames | None``
    What a subscriber that saw `last_seq` missed, or None when part of it is gone.
``seq``, ``epoch``, ``subscribed``, ``close()``
    The last seq published, this life's name, whether anybody listens, and the end
    (every subscription closes after the frames already in it).

A subscriber too slow for its queue (bounded in frames and in characters) is cut off:
its queue is closed after the frames already in it, and `Subscription.lagged` says from
which seq it missed frames,
so its owner can tell the client (``lagged``) and subscribe again from the last seq it
delivered (`Follower` does that, for every reader that follows a session). Nobody
ever waits for it. While it is behind, its waiting deltas merge
(the one rule, in a `core/turn/channel.py` merging channel), so a long answer alone
never cuts it off.

The replay (`ReplayBuffer`) is bounded twice, by frames and by characters, so neither a
long answer streamed one token per frame nor one huge tool output can grow it without
end. Consecutive deltas of one source merge into one entry as they arrive (the one rule,
`core/turn/channel.py`): a long answer is a handful of frames, not one per token. A merged
entry keeps where each of its deltas ends, so a client that saw part of it gets only
the rest — never a duplicate.

The core may not import the wire protocol: the frames are built by the two functions
the runtime passes in (api/protocol.py `event_frame` and `resync_frame`).
"""

from __future__ import annotations

import collections
import logging
import secrets
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs
import trio

from navi_trio.core.turn import MERGE_MAX_CHARS as MERGE_MAX_CHARS
from navi_trio.core.turn import MergeCount, MergingSender, frames_merge, open_frame_channel
from navi_trio.core.turn import frame_size as frame_size
from navi_trio.events import AgentEvent

log = logging.getLogger(__name__)

Frame = dict[str, Any]
# An event as a wire frame: (event, session_id, seq or None, epoch) -> frame.
Encode = Callable[[AgentEvent, str, "int | None", "str | None"], Frame]
# The frame that says "reload the history": (session_id, seq, epoch) -> frame.
Resync = Callable[[str, int, str], Frame]
SUBSCRIBER_BUFFER = 1000
# What one subscriber may have waiting, in characters (`frame_size`), besides its replay:
# a client that does not read is cut off (lagged) before it holds more.
SUBSCRIBER_MAX_CHARS = 2_000_000


def new_epoch() -> str:
    """Names one life of the daemon: seqs of another epoch mean nothing here."""
    return secrets.token_hex(4)


# -- the replay buffer ------------------------------------------------------------------

REPLAY_MAX_FRAMES = 2000
REPLAY_MAX_CHARS = 4_000_000
_FRAME_OVERHEAD = 64


@attrs.define
class _Entry:
    """One replay entry: a frame, or consecutive deltas merged (the one rule).

    A merged entry keeps its deltas' texts and its newest frame, and makes the merged
    frame only when read (a replay is rare; a delta merged in costs no new frame and no
    copy of the text so far)."""

    last: Frame  # the newest frame in it: every field of the merged frame but its text
    first_seq: int
    size: int
    # For a merged delta: (seq, end offset in "text") of each delta merged into it.
    cuts: list[tuple[int, int]] | None = None
    texts: list[str] | None = None  # for a merged delta: its deltas' texts, in order

    @property
    def frame(self) -> Frame:
        texts = self.texts
        if texts is None:
            return self.last
        if len(texts) > 1:
            texts[:] = ["".join(texts)]
        return {**self.last, "text": texts[0]}

    @property
    def seq(self) -> int:
        return int(self.last["seq"])

    def after(self, last_seq: int) -> Frame:
        """The part of this frame a client that saw `last_seq` has not seen."""
        frame = self.frame
        if self.first_seq > last_seq or self.cuts is None:
            return frame
        start = next(end for seq, end in self.cuts if seq == last_seq)
        return {**frame, "text": frame["text"][start:]}


class ReplayBuffer:
    def __init__(
        self,
        *,
        max_frames: int = REPLAY_MAX_FRAMES,
        max_chars: int = REPLAY_MAX_CHARS,
    ) -> None:
        self.max_frames = max_frames
        self.max_chars = max_chars
        self._entries: collections.deque[_Entry] = collections.deque()
        self.chars = 0
        self.merged = 0  # deltas folded into an earlier frame (for tests and benchmarks)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Frame]:
        return (entry.frame for entry in self._entries)

    @property
    def first_seq(self) -> int | None:
        """The oldest seq still held (None when empty)."""
        return self._entries[0].first_seq if self._entries else None

    def append(self, frame: Frame) -> None:
        """Add the frame with the next seq (seqs arrive strictly increasing by one)."""
        seq = int(frame["seq"])
        last = self._entries[-1] if self._entries else None
        # The rule asked of the entry's newest frame: its fields are the merged frame's,
        # and the merged text's length is the last cut's end.
        if last is not None and frames_merge(last.last, frame):
            text = frame["text"]
            cuts, texts = last.cuts, last.texts
            end = (cuts[-1][1] if cuts else len(last.last["text"])) + len(text)
            if end <= MERGE_MAX_CHARS:
                if cuts is None or texts is None:
                    first = last.last["text"]
                    last.cuts = cuts = [(last.seq, len(first))]
                    last.texts = texts = [first]
                cuts.append((seq, end))
                texts.append(text)
                last.last = frame
                self.chars += len(text)
                last.size += len(text)
                self.merged += 1
                if self.chars > self.max_chars:  # (a merge adds no entry)
                    self._trim()
                return
        size = frame_size(frame) + _FRAME_OVERHEAD
        self._entries.append(_Entry(last=frame, first_seq=seq, size=size))
        self.chars += size
        self._trim()

    def _trim(self) -> None:
        while len(self._entries) > self.max_frames or (
            self.chars > self.max_chars and len(self._entries) > 1
        ):
            self.chars -= self._entries.popleft().size

    def since(self, last_seq: int, current_seq: int) -> list[Frame] | None:
        """Frames after `last_seq`, or None when some of them are gone (resync)."""
        if last_seq == current_seq:
            return []
        if last_seq > current_seq:
            return None  # a seq we never sent: another daemon's, or a client's mistake
        first = self.first_seq
        if first is None or last_seq < first - 1:
            return None
        return [entry.after(last_seq) for entry in self._entries if entry.seq > last_seq]


# -- subscribers --------------------------------------------------------------------------


class Subscription:
    """A subscriber's end: frames arrive on `frames`; `close()` unsubscribes.

    `lagged` is set when the subscriber fell behind and was cut off: ``(missed_from,
    missed_to)``, the seqs of the first and last frame it did not get at that moment.
    """

    def __init__(
        self,
        leave: Callable[[Subscription], None],
        max_frames: int,
        max_chars: int,
        merges: MergeCount | None = None,
    ) -> None:
        self._leave = leave
        self.send, self.frames = open_frame_channel(max_frames, max_chars, merges)
        self.lagged: tuple[int, int] | None = None

    def close(self) -> None:
        self._leave(self)
        self.send.close()
        self.frames.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@attrs.frozen
class Lagged:
    """A `Follower` was cut off and subscribed again: the seqs it missed at that moment."""

    missed_from: int
    missed_to: int


class Follower:
    """One reader following one session across cut-offs: ``async for item in follower``.

    The items are the session's frames, and a `Lagged` wherever the subscription was cut
    off for falling behind: the follower has then subscribed again, from the last seq it
    handed out (none yet: from just before the first one missed), so the frames after
    it follow with no gap and no repeat (or a ``resync`` when the replay no longer holds
    them). It ends when the session ends the subscription without a cut-off (the actor
    retired or the runtime is stopping); after `close()` it raises
    `trio.ClosedResourceError`, as a closed channel does. The daemon's subscription
    pumps and `navi run`'s in-process follower both read a session this way.

    `hand`, when given, takes a frame in the publisher's own call while the reader
    waits with nothing queued (`MergingReceiver.take_inline`): what the reader would
    have done with it next, without a task switch; it returns False to leave the frame
    to the reader. It never sees a `Lagged`.
    """

    def __init__(
        self,
        subscribe: Callable[[int | None, str | None], Subscription],
        epoch: Callable[[], str],
        last_seq: int | None = None,
        last_epoch: str | None = None,
        hand: Callable[[Frame], bool] | None = None,
    ) -> None:
        self._subscribe = subscribe
        self._epoch = epoch
        self._hand = hand
        self.last_seq = last_seq
        self.subscription = self._attach(subscribe(last_seq, last_epoch))

    def _attach(self, sub: Subscription) -> Subscription:
        # A subscription of another kind (a plain channel) has no hand to give.
        take_inline = getattr(sub.frames, "take_inline", None)
        if self._hand is not None and take_inline is not None:
            take_inline(self._take)
        return sub

    def _take(self, frame: Frame) -> bool:
        assert self._hand is not None
        if not self._hand(frame):
            return False
        seq = frame.get("seq")  # `_seen`, written out: this runs for every delta
        if isinstance(seq, int):
            self.last_seq = seq
        return True

    def _seen(self, frame: Frame) -> None:
        seq = frame.get("seq")
        if isinstance(seq, int):
            self.last_seq = seq

    def __aiter__(self) -> Follower:
        return self

    async def __anext__(self) -> Frame | Lagged:
        sub = self.subscription
        try:
            frame = await sub.frames.receive()
        except trio.EndOfChannel:
            if sub.lagged is None:
                raise StopAsyncIteration from None
            missed_from, missed_to = sub.lagged
            last = missed_from - 1 if self.last_seq is None else self.last_seq
            self.subscription = self._attach(self._subscribe(last, self._epoch()))
            return Lagged(missed_from, missed_to)
        self._seen(frame)
        return frame

    def close(self) -> None:
        self.subscription.close()

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SessionBroadcast(Protocol):
    """What a session actor publishes through (module docstring): the scale-out seam."""

    @property
    def seq(self) -> int: ...
    @property
    def epoch(self) -> str: ...
    @property
    def subscribed(self) -> bool: ...

    def publish(self, event: AgentEvent) -> Frame: ...
    def publish_out_of_band(self, event: AgentEvent) -> None: ...
    def subscribe(self, last_seq: int | None = None, epoch: str | None = None) -> Subscription: ...
    def replay(self, last_seq: int) -> list[Frame] | None: ...
    def resync(self) -> None: ...
    def close(self) -> None: ...


class LocalBroadcast:
    """The in-process `SessionBroadcast`: a replay buffer and this process's subscribers.

    `on_change` is called when a subscriber comes or goes (the actor's idle countdown
    depends on it). `merges` counts the deltas merged in its subscribers' queues (the
    registry gives every session's broadcast the same one: the daemon's metric)."""

    def __init__(
        self,
        session_id: str,
        on_change: Callable[[], None] = lambda: None,
        *,
        encode: Encode,
        resync: Resync,
        first_seq: int = 0,
        epoch: str | None = None,
        merges: MergeCount | None = None,
    ) -> None:
        self.session_id = session_id
        self.merges = merges if merges is not None else MergeCount()
        self._encode = encode
        self._resync = resync
        self._on_change = on_change
        self._seq = first_seq
        self._epoch = epoch or new_epoch()
        self.buffer = ReplayBuffer()
        self._subscribers: dict[MergingSender[Frame], Subscription] = {}

    @property
    def seq(self) -> int:
        return self._seq

    @property
    def epoch(self) -> str:
        return self._epoch

    @property
    def subscribed(self) -> bool:
        return bool(self._subscribers)

    def publish(self, event: AgentEvent) -> Frame:
        self._seq += 1
        frame = self._encode(event, self.session_id, self._seq, self._epoch)
        self.buffer.append(frame)
        self._fan_out(frame)
        return frame

    def publish_out_of_band(self, event: AgentEvent) -> None:
        self._fan_out(self._encode(event, self.session_id, None, self._epoch))

    def replay(self, last_seq: int) -> list[Frame] | None:
        return self.buffer.since(last_seq, self._seq)

    def resync(self) -> None:
        self.buffer = ReplayBuffer()
        self._fan_out(self._resync(self.session_id, self._seq, self._epoch))

    def subscribe(self, last_seq: int | None = None, epoch: str | None = None) -> Subscription:
        backlog: list[Frame] = []
        if last_seq is not None:
            missed = None if epoch not in (None, self._epoch) else self.replay(last_seq)
            if missed is None:
                backlog = [self._resync(self.session_id, self._seq, self._epoch)]
            else:
                backlog = missed
        # Room for the whole backlog on top of the usual margin: a replay must never
        # cut off the subscriber it is for.
        chars = SUBSCRIBER_MAX_CHARS + sum(frame_size(f) for f in backlog)
        sub = Subscription(self._leave, SUBSCRIBER_BUFFER + len(backlog), chars, self.merges)
        self._subscribers[sub.send] = sub
        for frame in backlog:
            self._offer(sub.send, frame)
        self._on_change()
        return sub

    def close(self) -> None:
        for send in list(self._subscribers):
            send.close()

    def _leave(self, sub: Subscription) -> None:
        self._subscribers.pop(sub.send, None)
        self._on_change()

    def _fan_out(self, frame: Frame) -> None:
        for send in list(self._subscribers):
            try:  # `_offer`, written out: this runs for every delta
                send.send_nowait(frame)
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError) as exc:
                self._refused(send, frame, exc)

    def _offer(self, send: MergingSender[Frame], frame: Frame) -> None:
        try:
            send.send_nowait(frame)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            self._refused(send, frame, exc)

    def _refused(self, send: MergingSender[Frame], frame: Frame, exc: Exception) -> None:
        """`send` refused `frame`: a full queue is cut off (lagged), a closed one forgotten."""
        if isinstance(exc, trio.WouldBlock):
            sub = self._subscribers.pop(send, None)
            seq = frame["seq"] if isinstance(frame.get("seq"), int) else self._seq
            if sub is not None:
                sub.lagged = (seq, max(seq, self._seq))
            log.warning(
                "session %s: a subscriber fell behind at seq %s; cut off", self.session_id, seq
            )
            send.close()
        else:
            self._subscribers.pop(send, None)
        self._on_change()
