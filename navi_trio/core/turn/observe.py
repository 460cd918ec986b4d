"""What a daemon's metrics (and traces) learn of the runs.

An `Observer` hears of each LLM call when it ends (`LLMCallDone`, which no event
carries) and of each event a session publishes. It is called on the run's path, so it
must be cheap and must not raise. An observer that traces is also `Propagates`.
`trace_carrier` checks a W3C trace context that comes from outside (a client's frame,
a queued row read back) before a turn continues it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from navi_trio.events import AgentEvent, TextDelta, ThinkingDelta

DELTAS = frozenset({TextDelta, ThinkingDelta})  # the events an observer may opt out of

# W3C Trace Context, level 1: version 00 only (a later version is not ours to read).
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
TRACESTATE_MAX_CHARS = 512  # what the standard lets a vendor cut at
TRACESTATE_MAX_MEMBERS = 32
_TRACESTATE_MEMBER = re.compile(
    r"(?:[a-z0-9][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)


@attrs.frozen
class LLMCallDone:
    """One LLM call, ended (answered, failed or stopped)."""

    model: str
    purpose: str  # answer | plan | compress | … (what the call was for)
    seconds: float
    first_chunk_seconds: float | None  # None: no chunk came
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish: str | None = None  # the model's done reason; None when it never finished
    failed: bool = False
    session_id: str = ""  # the session whose run made the call (its parent's, in a sub-agent)
    agent_id: str | None = None  # the sub-agent that made it; None: the turn itself


class Observer(Protocol):
    # Whether `event` is called for text and thinking deltas too (one per token): an
    # observer that ignores them says False, and a streamed answer costs it nothing.
    deltas: bool

    def llm_call(self, done: LLMCallDone) -> None: ...
    def event(self, session_id: str, event: AgentEvent) -> None: ...
    def stopped(self, seconds: float) -> None:
        """A stop asked of a running turn took effect after `seconds`."""
        ...


@runtime_checkable
class Propagates(Protocol):
    """An observer that traces: a tool call that asks another daemon carries its W3C trace
    context, and a message that came with one continues that trace."""

    def trace_context(
        self, session_id: str, call_id: str, tool: str, agent_id: str | None
    ) -> dict[str, str]:
        """The context of the call's span (`tool`'s, of sub-agent `agent_id` or of the
        turn itself); empty when its turn is not running."""
        ...

    def continue_trace(self, session_id: str, carrier: Mapping[str, str]) -> None:
        """The session's next turn hangs under the remote span `carrier` names."""
        ...


def trace_context(
    observer: Observer, session_id: str, agent_id: str | None, call_id: str, tool: str
) -> dict[str, str]:
    """The trace context to send with a call to another daemon; empty when not tracing."""
    if isinstance(observer, Propagates):
        return observer.trace_context(session_id, call_id, tool, agent_id)
    return {}


def continue_trace(observer: Observer, session_id: str, carrier: Mapping[str, str]) -> None:
    """A message's remote trace context, for its turn's span (nothing when not tracing)."""
    if isinstance(observer, Propagates):
        observer.continue_trace(session_id, carrier)


class NoObserver:
    """Observes nothing: a run of no daemon, or a daemon without metrics."""

    deltas = False

    def llm_call(self, done: LLMCallDone) -> None:
        pass

    def event(self, session_id: str, event: AgentEvent) -> None:
        pass

    def stopped(self, seconds: float) -> None:
        pass


class Observers:
    """Several observers as one (a daemon's metrics and its traces): each sees every call,
    in order. The one place that fans the core's calls out."""

    def __init__(self, *observers: Observer) -> None:
        self.observers = observers
        self.deltas = any(o.deltas for o in observers)

    def llm_call(self, done: LLMCallDone) -> None:
        for o in self.observers:
            o.llm_call(done)

    def event(self, session_id: str, event: AgentEvent) -> None:
        delta = type(event) in DELTAS
        for o in self.observers:
            if o.deltas or not delta:
                o.event(session_id, event)

    def stopped(self, seconds: float) -> None:
        for o in self.observers:
            o.stopped(seconds)

    def trace_context(
        self, session_id: str, call_id: str, tool: str, agent_id: str | None
    ) -> dict[str, str]:
        for o in self.observers:
            found = trace_context(o, session_id, agent_id, call_id, tool)
            if found:
                return found
        return {}

    def continue_trace(self, session_id: str, carrier: Mapping[str, str]) -> None:
        for o in self.observers:
            continue_trace(o, session_id, carrier)


def trace_carrier(traceparent: Any, tracestate: Any) -> dict[str, str] | None:
    """A message's trace context as a W3C carrier, or None when it has none or a bad one.

    `traceparent` must be a version-00 header (55 characters, lower-case hex, ids not
    all zero); `tracestate`, kept only beside a good one, at most 512 characters of at
    most 32 well-formed members, else left out. Nothing here raises: a bad value is
    dropped and the message goes on without it."""
    if not isinstance(traceparent, str) or not _TRACEPARENT.fullmatch(traceparent):
        return None
    carrier = {"traceparent": traceparent}
    if isinstance(tracestate, str) and 0 < len(tracestate) <= TRACESTATE_MAX_CHARS:
        members = [m.strip(" \t") for m in tracestate.split(",")]
        members = [m for m in members if m]
        if 0 < len(members) <= TRACESTATE_MAX_MEMBERS and all(
            _TRACESTATE_MEMBER.fullmatch(m) for m in members
        ):
            carrier["tracestate"] = ",".join(members)
    return carrier
