"""The one rule for "may two deltas merge", for events and for frames alike.

Text (and thinking) deltas that wait for a slow reader are merged: the texts joined,
one item to hand on instead of one per token. Two deltas merge when they are of the
same kind (text with text, thinking with thinking) and from the same source: the same
agent (``is_subagent``, ``agent_id``) and, for frames, the same session and epoch. A
merged frame carries the later seq: a frame with seq N still means "everything up to
N", so replay and ``lagged`` work as before. Nothing else merges, and a delta never
merges across an item of its own source's that came between (its order is kept).

The merge points, the only three on the output path: a run's event channel and each
subscriber's frame queue (`core/channel.py`), and the session's replay buffer
(`core/broadcast.py`). The connection's writer does not merge: what its pumps hand it
comes out of a subscriber's queue, where deltas already merged while the pump waited.
A merged frame stops growing at `MERGE_MAX_CHARS` of text (one WebSocket message, one
replay entry); an event has no such cap, since the answer's own size cap
(``answer_max_chars``) bounds it.
"""

from __future__ import annotations

from typing import Any

import attrs

from navi_trio.events import AgentEvent, TextDelta, ThinkingDelta

Frame = dict[str, Any]

KINDS = frozenset({TextDelta.type, ThinkingDelta.type})
# What two delta frames must share to merge: their session (and its epoch) and agent.
SOURCE = ("session_id", "epoch", "is_subagent", "agent_id")
MERGE_MAX_CHARS = 64_000


def frame_source(frame: Frame) -> tuple[Any, ...] | None:
    """A delta frame's kind and source; None for a frame that never merges."""
    kind = frame.get("type")
    if kind not in KINDS or not isinstance(frame.get("text"), str):
        return None
    if not isinstance(frame.get("seq"), int):
        return None  # a delta always has a seq; one without is not ours to merge
    return (kind, *(frame.get(k) for k in SOURCE))


def event_agent(event: AgentEvent) -> tuple[bool, str | None]:
    """Which agent an event comes from: the main one, or which sub-agent."""
    return event.is_subagent, event.agent_id


def event_source(event: AgentEvent) -> tuple[Any, ...] | None:
    """A delta event's kind and source; None for an event that never merges."""
    if not isinstance(event, TextDelta | ThinkingDelta):
        return None
    return (type(event).type, *event_agent(event))


def merged_frame(old: Frame, new: Frame, max_chars: int = MERGE_MAX_CHARS) -> Frame | None:
    """`new` with `old`'s text in front, when the rule lets them merge; else None."""
    source = frame_source(new)
    if source is None or frame_source(old) != source:
        return None
    text = old["text"] + new["text"]
    if len(text) > max_chars:
        return None
    return {**new, "text": text}


def merged_event(old: AgentEvent, new: AgentEvent) -> AgentEvent | None:
    """`old` with `new`'s text after its own, when the rule lets them merge; else None."""
    source = event_source(new)
    if source is None or event_source(old) != source:
        return None
    assert isinstance(old, TextDelta | ThinkingDelta) and isinstance(new, TextDelta | ThinkingDelta)
    return attrs.evolve(old, text=old.text + new.text)
