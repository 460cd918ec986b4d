"""The bounded event path from a run to its reader.

A run's events are sent synchronously (a tool's progress callback must never block),
so the channel cannot push back on the sender; an unbounded channel turned a slow
reader plus a chatty tool into gigabytes. `open_event_channel` gives a channel that
never blocks the sender and never grows without bound:

- A text (thinking) delta sent while the last waiting event is a text (thinking)
  delta of the same source is merged into it (the one rule, `core/deltas.py`): the
  texts joined, one event to hand on instead of one per token, at every hop after
  this one.
- *Progress* events — `TextDelta`, `ThinkingDelta` and `ToolEvent` — are queued as
  they are while fewer than `max_progress` of them wait. Beyond that, a new one is
  merged into the latest waiting one from the same source (text deltas: texts joined;
  tool output: lines joined, the oldest beyond `max_chars` dropped and counted in
  ``dropped_lines``), never across another event, so each source keeps its order. A
  tool event that cannot merge replaces the oldest waiting tool event (counted).
- Every other event (tool_started, tool_result, stream_end, error, …) is always
  queued: never merged, never dropped. A turn has only so many of those.

With a reader that keeps up nothing is ever merged: it sees exactly what was sent.
`EventReceiver.statistics()` tells how many events were merged and dropped. The
channel itself (queue, waiter, the two ends) is `core/channel.py`'s, shared with each
subscriber's frame queue; this module is the policy only.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from navi_trio.core.channel import (
    ChannelStats,
    MergingQueue,
    MergingReceiver,
    MergingSender,
    open_merging_channel,
)
from navi_trio.core.deltas import event_agent, merged_event
from navi_trio.events import AgentEvent, TextDelta, ThinkingDelta, ToolEvent

PROGRESS_TYPES = (TextDelta, ThinkingDelta, ToolEvent)
DEFAULT_MAX_PROGRESS = 256
DEFAULT_MAX_CHARS = 8000  # of merged tool output in one event


EventSender = MergingSender[AgentEvent]  # the run's end: `send_nowait` never blocks
EventReceiver = MergingReceiver[AgentEvent]  # the reader's end
EventStats = ChannelStats


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
        if self.merge_into_tail(event, merged_event):
            return False  # the reader already has one waiting
        if not is_progress(event):
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
        if is_progress(event):
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
