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

from typing import Any, cast

import attrs

from navi_trio.events import AgentEvent, TextDelta, ThinkingDelta

Frame = dict[str, Any]

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
