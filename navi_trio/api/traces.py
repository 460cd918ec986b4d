"""A daemon's OpenTelemetry traces: one trace per turn, built from the core's observer calls.

`TraceObserver` makes spans of what the core tells its `Observer`, with explicit start
and end times, kept open per session (and call id, agent id): the turn's span is opened
by the session's first event or LLM call and closed by its run's end, the others are its
children (a background job is linked to the turn that started it, not a child: it
outlives it). Nothing here awaits or does I/O: the SDK exports from a thread of its own.
A message that came with a peer's W3C trace context (`continue_trace`) opens its turn's
span as a child of that remote span, so one trace holds both daemons' spans.

Message content is recorded only when asked (`NAVI_OTEL_CONTENT=1`), cut to
`CONTENT_BYTES`; tool arguments, tokens and keys never. The SDK is imported here only,
and this module only when tracing is configured.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from contextvars import ContextVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from navi_trio.core.turn import LLMCallDone
from navi_trio.events import (
    AgentEvent,
    ApprovalDecided,
    ApprovalRequest,
    CompressionStarted,
    ContextCompressed,
    PlanPhase,
    StreamEnd,
    SubagentFinished,
    SubagentStarted,
    TaskUpdate,
    ToolResultEvent,
    ToolStarted,
)

CONTENT_BYTES = 4096
# Open spans kept per session, at most: a run that never ends (a crash mid-turn) cannot
# grow them without bound; past it, the oldest open child is ended where it stands.
OPEN_MAX = 256
ENDED_MAX = 4096  # ended tool calls remembered per turn (see `trace_context`)


# The running turn's span, in the tasks of that turn (set where its first call is observed,
# inherited by the tasks it starts): what log lines carry (`WithTraceIds`).
CURRENT: ContextVar[tuple[str, str] | None] = ContextVar("navi_trace_ids", default=None)
W3C = TraceContextTextMapPropagator()


class WithTraceIds(logging.Formatter):
    """A handler's formatter, with the running turn's trace and span ids added to each line
    logged inside a turn: JSON lines get `trace_id` and `span_id` keys, plain ones end
    with `trace_id=… span_id=…`. Lines outside a turn are as before."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        line = self.inner.format(record)
        ids = CURRENT.get()
        if ids is None:
            return line
        trace_id, span_id = ids
        if line.startswith("{"):
            try:
                fields = json.loads(line)
            except ValueError:
                fields = None
            if isinstance(fields, dict):
                return json.dumps({**fields, "trace_id": trace_id, "span_id": span_id})
        return f"{line} trace_id={trace_id} span_id={span_id}"


def _bounded(text: str) -> str:
    raw = text.encode()[:CONTENT_BYTES]
    return raw.decode(errors="ignore")


class _Turn:
    """One session's running turn: its span and its open children, by key."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.open: dict[tuple[str, str], Span] = {}
        self.ended: set[str] = set()  # tool calls whose result came (at most ENDED_MAX)


class TraceObserver:
    """The core's observer, as spans (see the module's docstring)."""

    def __init__(self, tracer: Tracer, *, content: bool = False) -> None:
        self.tracer = tracer
        self.content = content
        self._turns: dict[str, _Turn] = {}
        self._jobs: dict[str, Span] = {}  # background jobs, by task id
        # Remote parents of sessions' next turns (a peer's ask), by session id.
        self._remote: dict[str, Context] = {}

    # -- spans -------------------------------------------------------------------------

    def _turn(self, session_id: str, now: int) -> _Turn:
        turn = self._turns.get(session_id)
        if turn is None:
            span = self.tracer.start_span(
                "navi.turn",
                context=self._remote.pop(session_id, None) or Context(),
                kind=SpanKind.SERVER,
                start_time=now,
                attributes={"navi.session_id": session_id},
            )
            turn = self._turns[session_id] = _Turn(span)
            ctx = span.get_span_context()
            CURRENT.set((f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"))
        return turn

    def _parent(self, turn: _Turn, agent_id: str | None) -> Context:
        span = turn.open.get(("agent", agent_id)) if agent_id else None
        return trace.set_span_in_context(span or turn.span)

    def _open(
        self,
        turn: _Turn,
        key: tuple[str, str],
        name: str,
        parent: Context,
        now: int,
        attributes: Mapping[str, str | int | float | bool],
    ) -> None:
        if len(turn.open) >= OPEN_MAX:
            oldest = next(iter(turn.open))
            turn.open.pop(oldest).end(end_time=now)
        old = turn.open.pop(key, None)
        if old is not None:
            old.end(end_time=now)
        turn.open[key] = self.tracer.start_span(
            name, context=parent, start_time=now, attributes=attributes
        )

    def _open_tool(self, turn: _Turn, call_id: str, name: str, parent: Context, now: int) -> None:
        self._open(
            turn,
            ("tool", call_id),
            f"execute_tool {name}",
            parent,
            now,
            {"gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id},
        )

    def _close(self, turn: _Turn, key: tuple[str, str], now: int) -> Span | None:
        span = turn.open.pop(key, None)
        if span is not None:
            span.end(end_time=now)
        return span

    # -- the core's Observer -----------------------------------------------------------

    def trace_context(
        self, session_id: str, call_id: str, tool: str, agent_id: str | None
    ) -> dict[str, str]:
        """The W3C context of the call's span. Asked from the call itself, which may come
        before the session hands its ToolStarted over: then the span opens here."""
        turn = self._turns.get(session_id)
        if turn is None or call_id in turn.ended:
            return {}  # a background call, its span ended: the peer's run is a trace of its own
        span = turn.open.get(("tool", call_id))
        if span is None:
            self._open_tool(turn, call_id, tool, self._parent(turn, agent_id), time.time_ns())
            span = turn.open[("tool", call_id)]
        carrier: dict[str, str] = {}
        W3C.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def continue_trace(self, session_id: str, carrier: Mapping[str, str]) -> None:
        if len(self._remote) >= OPEN_MAX:
            self._remote.pop(next(iter(self._remote)))
        self._remote[session_id] = W3C.extract(carrier)

    def llm_call(self, done: LLMCallDone) -> None:
        now = time.time_ns()
        start = now - int(done.seconds * 1e9)
        turn = self._turn(done.session_id, start)
        attributes: dict[str, str | int | float | bool] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": done.model or "unknown",
            "gen_ai.usage.input_tokens": done.prompt_tokens,
            "gen_ai.usage.output_tokens": done.completion_tokens,
            "navi.llm.purpose": done.purpose,
        }
        if done.finish is not None:
            attributes["gen_ai.response.finish_reasons"] = done.finish
        if done.first_chunk_seconds is not None:
            attributes["navi.llm.time_to_first_chunk"] = done.first_chunk_seconds
        span = self.tracer.start_span(
            f"chat {done.model or 'unknown'}",
            context=self._parent(turn, done.agent_id),
            kind=SpanKind.CLIENT,
            start_time=start,
            attributes=attributes,
        )
        if done.failed:
            span.set_status(Status(StatusCode.ERROR, "no answer"))
        span.end(end_time=now)

    deltas = True  # a turn's span opens at its first event, whichever it is

    def event(self, session_id: str, event: AgentEvent) -> None:
        kind = type(event)
        if kind is TaskUpdate:
            assert isinstance(event, TaskUpdate)
            self._job(session_id, event)
            return
        now = time.time_ns()
        turn = self._turn(session_id, now)
        parent = self._parent(turn, event.agent_id)
        if kind is ToolStarted:
            assert isinstance(event, ToolStarted)
            if ("tool", event.call_id) not in turn.open:  # (unless the call opened it)
                self._open_tool(turn, event.call_id, event.name, parent, now)
        elif kind is ToolResultEvent:
            assert isinstance(event, ToolResultEvent)
            self._tool_result(turn, event, parent, now)
        elif kind is PlanPhase:
            assert isinstance(event, PlanPhase)
            key = ("plan", event.phase)
            if event.status == "started":
                self._open(turn, key, f"navi.plan {event.phase}", parent, now, {})
            else:
                span = turn.open.get(key)
                if span is not None:
                    span.set_attribute("navi.plan.status", event.status)
                self._close(turn, key, now)
        elif kind is CompressionStarted:
            assert isinstance(event, CompressionStarted)
            attributes = {"navi.compression.reason": event.reason}
            self._open(turn, ("compress", ""), "navi.compress", parent, now, attributes)
        elif kind is ContextCompressed:
            assert isinstance(event, ContextCompressed)
            span = turn.open.get(("compress", ""))
            if span is not None:
                span.set_attribute("navi.compression.tokens_before", event.tokens_before)
                span.set_attribute("navi.compression.tokens_after", event.tokens_after)
            self._close(turn, ("compress", ""), now)
        elif kind is SubagentStarted:
            assert isinstance(event, SubagentStarted)
            self._open(
                turn,
                ("agent", event.agent_id or ""),
                f"invoke_agent {event.profile_id}",
                trace.set_span_in_context(turn.span),
                now,
                {"gen_ai.agent.name": event.profile_id, "gen_ai.agent.id": event.agent_id or ""},
            )
        elif kind is SubagentFinished:
            assert isinstance(event, SubagentFinished)
            span = turn.open.get(("agent", event.agent_id or ""))
            if span is not None:
                span.set_attribute("navi.agent.completed", event.completed)
            self._close(turn, ("agent", event.agent_id or ""), now)
        elif kind is ApprovalRequest:
            assert isinstance(event, ApprovalRequest)
            tool = turn.open.get(("tool", event.call_id))
            self._open(
                turn,
                ("approval", event.call_id),
                "navi.approval",
                trace.set_span_in_context(tool) if tool is not None else parent,
                now,
                {"gen_ai.tool.name": event.tool, "navi.approval.rule": event.rule},
            )
        elif kind is ApprovalDecided:
            assert isinstance(event, ApprovalDecided)
            span = turn.open.get(("approval", event.call_id))
            if span is not None:
                span.set_attribute("navi.approval.approved", event.approved)
            self._close(turn, ("approval", event.call_id), now)
        elif kind is StreamEnd and not event.is_subagent:
            assert isinstance(event, StreamEnd)
            self._end_turn(session_id, turn, event, now)

    def stopped(self, seconds: float) -> None:
        pass  # the turn's span says it was stopped (its end reason)

    # -- the parts -----------------------------------------------------------------------

    def _tool_result(self, turn: _Turn, event: ToolResultEvent, parent: Context, now: int) -> None:
        span = turn.open.pop(("tool", event.call_id), None)
        if len(turn.ended) < ENDED_MAX:
            turn.ended.add(event.call_id)
        if span is None:  # no start was published: its duration says when it began
            span = self.tracer.start_span(
                f"execute_tool {event.name}",
                context=parent,
                start_time=now - event.duration_ms * 1_000_000,
                attributes={"gen_ai.tool.name": event.name, "gen_ai.tool.call.id": event.call_id},
            )
        status = "stopped" if event.stopped else "ok" if event.ok else "failed"
        span.set_attribute("navi.tool.status", status)
        span.set_attribute("navi.tool.duration_ms", event.duration_ms)
        if not event.ok and not event.stopped:
            span.set_status(Status(StatusCode.ERROR))
        if self.content and event.output:
            span.set_attribute("navi.tool.output", _bounded(event.output))
        span.end(end_time=now)

    def _end_turn(self, session_id: str, turn: _Turn, event: StreamEnd, now: int) -> None:
        for span in turn.open.values():
            span.end(end_time=now)
        turn.open.clear()
        span = turn.span
        span.set_attribute("navi.turn.reason", event.reason)
        span.set_attribute("navi.turn.iterations", event.iterations)
        span.set_attribute("gen_ai.usage.input_tokens", event.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", event.completion_tokens)
        if event.reason == "error":
            span.set_status(Status(StatusCode.ERROR))
        if self.content and event.text:
            span.set_attribute("navi.turn.answer", _bounded(event.text))
        span.end(end_time=now)
        del self._turns[session_id]
        CURRENT.set(None)

    def _job(self, session_id: str, event: TaskUpdate) -> None:
        """A background job: a span of its own, linked to the turn that started it."""
        now = time.time_ns()
        span = self._jobs.get(event.task_id)
        if span is None:
            turn = self._turns.get(session_id)
            links = [Link(turn.span.get_span_context())] if turn is not None else []
            if len(self._jobs) >= OPEN_MAX:
                self._jobs.pop(next(iter(self._jobs))).end(end_time=now)
            span = self._jobs[event.task_id] = self.tracer.start_span(
                f"navi.job {event.tool}",
                context=Context(),
                links=links,
                start_time=now,
                attributes={
                    "navi.job.id": event.task_id,
                    "gen_ai.tool.name": event.tool,
                    "navi.session_id": session_id,
                    "navi.tool.background": True,
                },
            )
        if event.status != "running":
            span.set_attribute("navi.job.status", event.status)
            if event.status == "failed":
                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=now)
            del self._jobs[event.task_id]
