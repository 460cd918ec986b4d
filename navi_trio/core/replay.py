"""A session's replay buffer: the frames a reconnecting client may ask for again.

Bounded twice, by frames and by characters, so neither a long answer streamed one token
per frame nor one huge tool output can grow it without end. Consecutive text (or
thinking) deltas of the same agent and session are merged into one frame as they
arrive: a long answer is a handful of frames, not one per token. A merged frame keeps
where each of its deltas ends, so a client that saw part of it gets only the rest —
never a duplicate.

`since(last_seq)` answers what a subscriber missed, or None when part of it has already
left the buffer: then the client must reload the history (a ``resync``), never see a
silent gap.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import attrs

Frame = dict[str, Any]

MERGEABLE = frozenset({"text_delta", "thinking_delta"})
# What two deltas must share to merge: their session (and its epoch) and their agent.
SAME_SOURCE = ("session_id", "epoch", "is_subagent", "agent_id")
REPLAY_MAX_FRAMES = 2000
REPLAY_MAX_CHARS = 4_000_000
MERGE_MAX_CHARS = 64_000
_FRAME_OVERHEAD = 64


def frame_size(value: Any) -> int:
    """A cheap estimate of a frame's size in characters (strings count, the rest a little)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(frame_size(v) + 8 for v in value.values())
    if isinstance(value, list | tuple):
        return sum(frame_size(v) + 2 for v in value)
    return 8


@attrs.define
class _Entry:
    frame: Frame
    first_seq: int
    size: int
    # For a merged delta: (seq, end offset in "text") of each delta merged into it.
    cuts: list[tuple[int, int]] | None = None

    @property
    def seq(self) -> int:
        return int(self.frame["seq"])

    def after(self, last_seq: int) -> Frame:
        """The part of this frame a client that saw `last_seq` has not seen."""
        if self.first_seq > last_seq or self.cuts is None:
            return self.frame
        start = next(end for seq, end in self.cuts if seq == last_seq)
        return {**self.frame, "text": self.frame["text"][start:]}


def _mergeable(entry: _Entry, frame: Frame) -> bool:
    old = entry.frame
    return (
        frame["type"] in MERGEABLE
        and old["type"] == frame["type"]
        and all(old.get(k) == frame.get(k) for k in SAME_SOURCE)
        and isinstance(frame.get("text"), str)
        and len(old["text"]) + len(frame["text"]) <= MERGE_MAX_CHARS
    )


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
        if last is not None and _mergeable(last, frame):
            text = last.frame["text"] + frame["text"]
            if last.cuts is None:
                last.cuts = [(last.seq, len(last.frame["text"]))]
            last.cuts.append((seq, len(text)))
            last.frame = {**last.frame, "text": text, "seq": seq}
            self.chars += len(frame["text"])
            last.size += len(frame["text"])
            self.merged += 1
        else:
            size = frame_size(frame) + _FRAME_OVERHEAD
            self._entries.append(_Entry(frame=frame, first_seq=seq, size=size))
            self.chars += size
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
