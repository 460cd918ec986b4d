"""What a daemon's metrics (and, later, its traces and accounts) learn of the runs.

The core tells an `Observer` two things: each LLM call when it ends (`LLMCallDone`: the
model, how long, the time to its first chunk, the tokens), which no event carries, and
each event a session publishes (tool results, a run's end, approvals), which the session
actor hands over as it publishes them. The observer must be cheap and must not raise:
it is called on the run's path. `NoObserver` is the default; the api layer's metrics
implement it (api/metrics.py), and the core never imports them.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from navi_trio.events import AgentEvent, TextDelta, ThinkingDelta

DELTAS = frozenset({TextDelta, ThinkingDelta})  # the events an observer may opt out of


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


class Observer(Protocol):
    # Whether `event` is called for text and thinking deltas too (one per token): an
    # observer that ignores them says False, and a streamed answer costs it nothing.
    deltas: bool

    def llm_call(self, done: LLMCallDone) -> None: ...
    def event(self, session_id: str, event: AgentEvent) -> None: ...
    def stopped(self, seconds: float) -> None:
        """A stop asked of a running turn took effect after `seconds`."""
        ...


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
