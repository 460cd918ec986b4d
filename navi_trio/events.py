"""AgentEvent classes: every step of a run, as frozen attrs values.

Each event serialises (through the one cattrs converter below) to a JSON-ready dict
with a ``type`` tag — the same dict goes on the wire, into `navi run --events`, and
into replay buffers. The session actor adds ``session_id`` and ``seq`` when it fans
an event out; they are not part of the event itself.

Every event carries two keyword-only fields for sub-agent forwarding: ``is_subagent``
and ``agent_id`` (the sub-agent's id). A parent marks a forwarded event with
``attrs.evolve(ev, is_subagent=True, agent_id=...)``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import attrs
import cattrs


@attrs.frozen
class AgentEvent:
    type: ClassVar[str] = ""
    is_subagent: bool = attrs.field(default=False, kw_only=True)
    agent_id: str | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class TextDelta(AgentEvent):
    text: str


@attrs.frozen
class ThinkingDelta(AgentEvent):
    text: str


@attrs.frozen
class ThinkingEnd(AgentEvent):
    pass


@attrs.frozen
class ModelInfo(AgentEvent):
    """The model that answers: at a run's first answer, and again when it changes mid-run
    (so a client that joined the session later still learns it)."""

    model: str


@attrs.frozen
class ModelWorking(AgentEvent):
    """The model works on a step that streams nothing (the embedded model choosing a tool
    or writing its arguments, or waiting for the model): a client shows it is working."""

    step: str
    tokens: int = 0


@attrs.frozen
class PlanStep:
    index: int
    description: str
    executor: str = "SELF"  # "TOOL", "AGENT" or "SELF"
    target: str | None = None  # tool name or profile id


@attrs.frozen
class PlanPhase(AgentEvent):
    """A planning phase started (analysis, review, plan) — for progress display."""

    phase: str
    status: str = "started"  # started | done | skipped | failed
    detail: str = ""


@attrs.frozen
class PlanCreated(AgentEvent):
    text: str
    steps: tuple[PlanStep, ...] = ()
    milestones: tuple[str, ...] = ()
    complexity: str = ""


@attrs.frozen
class ToolStarted(AgentEvent):
    call_id: str
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ToolEvent(AgentEvent):
    """Live progress from a running tool (output lines, sub-step notes)."""

    call_id: str
    name: str
    data: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ToolResultEvent(AgentEvent):
    """A tool call's result on the event stream (the tool's own value is tools' ToolResult)."""

    call_id: str
    name: str
    ok: bool
    output: str = ""
    error: str | None = None
    duration_ms: int = 0
    stopped: bool = False  # the run was stopped before the call finished


@attrs.frozen
class CompressionStarted(AgentEvent):
    reason: str  # pre_turn | mid_turn | forced | worker | truncated_prompt
    tokens_before: int = 0


@attrs.frozen
class ContextCompressed(AgentEvent):
    reason: str
    tokens_before: int
    tokens_after: int
    messages_summarised: int = 0


@attrs.frozen
class StreamEnd(AgentEvent):
    text: str = ""
    stopped: bool = False
    # complete | stopped | max_iterations | error | context_too_large | budget_exhausted
    # | blocked (a user_message hook refused the message)
    reason: str = "complete"
    iterations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    done_reason: str | None = None


@attrs.frozen
class ErrorEvent(AgentEvent):
    message: str
    code: str = "error"


@attrs.frozen
class WarningEvent(AgentEvent):
    message: str
    code: str = "warning"


@attrs.frozen
class MessageQueued(AgentEvent):
    text: str
    position: int
    dropped_total: int = 0


@attrs.frozen
class Steered(AgentEvent):
    """A message sent with ``on_busy: steer`` joined the running turn here."""

    text: str


@attrs.frozen
class BudgetLine:
    """One active budget: its scope (turn, session, user_day, subagent), kind (tokens,
    wall_sec, tool_calls, subagents), what was spent and the limit."""

    scope: str
    kind: str
    spent: float
    limit: float


@attrs.frozen
class BudgetReport(AgentEvent):
    """Every round of a run that has budgets: each one's spent and limit (core/turn/budgets.py)."""

    budgets: tuple[BudgetLine, ...] = ()


@attrs.frozen
class BudgetExhausted(AgentEvent):
    """The run ends: this budget is spent (its stream_end has reason budget_exhausted)."""

    scope: str
    kind: str
    spent: float
    limit: float
    message: str = ""
    held: float = 0.0  # reserved by calls under way, besides what was spent


@attrs.frozen
class Woken(AgentEvent):
    """A turn started by background results (wake_on_task_done): `text` is their note."""

    text: str


@attrs.frozen
class TaskUpdate(AgentEvent):
    task_id: str
    tool: str
    status: str  # running | completed | failed | cancelled
    args_summary: str = ""
    error: str | None = None
    result_excerpt: str = ""
    subagent_tokens: int = 0


@attrs.frozen
class TodoStep:
    index: int
    text: str
    status: str = "pending"  # pending | in_progress | done | failed
    validation: str | None = None


@attrs.frozen
class TodoUpdated(AgentEvent):
    steps: tuple[TodoStep, ...] = ()


@attrs.frozen
class SubagentStarted(AgentEvent):
    profile_id: str
    task: str


@attrs.frozen
class SubagentFinished(AgentEvent):
    completed: bool
    text: str = ""
    tokens: int = 0


@attrs.frozen
class PathArg:
    path: str
    inside: bool  # resolved against the command's folder: inside the run's folders


@attrs.frozen
class CommandPart:
    """One simple command of a terminal line, as the policy decided it."""

    text: str
    program: str
    args: tuple[str, ...] = ()
    paths: tuple[PathArg, ...] = ()
    decision: str = "ask"  # allow | ask | deny
    rule: str = ""  # what decided it
    grant: str = ""  # asked: what "allow for the session" grants for it, in words


@attrs.frozen
class ApprovalRequest(AgentEvent):
    """A tool call waits for its session owner's `approve` / `deny` (docs/pages/tools.md)."""

    call_id: str
    tool: str
    summary: str  # the arguments, readable
    rule: str  # which rule asked
    mode: str = "workspace"
    timeout_sec: int = 0  # whole seconds, rounded up
    # A terminal line: its simple commands, each with its decision; `grant` says in
    # words what an approval "for the session" grants.
    parts: tuple[CommandPart, ...] = ()
    grant: str = ""


@attrs.frozen
class ApprovalDecided(AgentEvent):
    """How an approval ended: by the owner, for lack of an answer, or by the headless rule."""

    call_id: str
    approved: bool
    scope: str = "once"  # once | session | always
    by: str = "owner"  # owner | timeout | headless | grant


@attrs.frozen
class CheckpointCreated(AgentEvent):
    """The writable folders were snapshotted before a round's writing calls (quiet: a
    client may hide it). `reused`: the last checkpoint already held this state."""

    checkpoint_id: str
    label: str = ""
    files: int = 0
    changed: int = 0  # files that differed from the previous snapshot
    bytes: int = 0  # what the checkpoint holds
    new_bytes: int = 0  # what taking it stored
    duration_ms: int = 0
    reused: bool = False


@attrs.frozen
class Rewound(AgentEvent):
    """The session was rewound (or a rewind undone): clients reload the history.

    `to`: the user message rewound to (before it); `branch`: the branch brought back
    instead; `undo`: the branch that undoes this one; `files`: what the restore changed
    (restored, created, deleted, modes, dirs_created, dirs_deleted, bytes)."""

    restore: str  # chat | files | both
    to: str = ""
    branch: str = ""
    undo: str = ""
    messages_removed: int = 0
    messages_restored: int = 0
    files: dict[str, Any] = attrs.field(factory=dict)
    failed: tuple[str, ...] = ()  # paths the restore could not write


@attrs.frozen
class Forked(AgentEvent):
    """A new session was made from this one (its history up to `at`)."""

    new_session_id: str
    at: str = ""
    messages: int = 0
    folder: str | None = None  # the copy of the working folder, when one was made
    left_out: tuple[str, ...] = ()  # folders not copied: the asker may not use them now


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


EVENT_CLASSES: tuple[type[AgentEvent], ...] = (
    TextDelta,
    ThinkingDelta,
    ThinkingEnd,
    ModelInfo,
    ModelWorking,
    PlanPhase,
    PlanCreated,
    ToolStarted,
    ToolEvent,
    ToolResultEvent,
    CompressionStarted,
    ContextCompressed,
    StreamEnd,
    ErrorEvent,
    WarningEvent,
    MessageQueued,
    Steered,
    Woken,
    BudgetReport,
    BudgetExhausted,
    TaskUpdate,
    TodoUpdated,
    SubagentStarted,
    SubagentFinished,
    ApprovalRequest,
    ApprovalDecided,
    CheckpointCreated,
    Rewound,
    Forked,
)

_TAGS: dict[str, type[AgentEvent]] = {}
for _cls in EVENT_CLASSES:
    _tag = {
        "ErrorEvent": "error",
        "WarningEvent": "warning",
        "PlanCreated": "plan",
        "ToolResultEvent": "tool_result",
        "BudgetReport": "budget",
    }.get(_cls.__name__, _snake(_cls.__name__))
    _cls.type = _tag
    _TAGS[_tag] = _cls

converter = cattrs.Converter(forbid_extra_keys=True)


def event_to_dict(event: AgentEvent) -> dict[str, Any]:
    """The JSON-ready dict for an event, with its ``type`` tag first."""
    body: dict[str, Any] = converter.unstructure(event)
    return {"type": type(event).type, **body}


def event_from_dict(data: dict[str, Any]) -> AgentEvent:
    """Inverse of `event_to_dict`. Extra wire keys ``session_id``/``seq`` are ignored."""
    body = {k: v for k, v in data.items() if k not in ("type", "session_id", "seq")}
    try:
        cls = _TAGS[data["type"]]
    except KeyError:
        raise ValueError(f"unknown event type {data.get('type')!r}") from None
    return converter.structure(body, cls)


def event_types() -> dict[str, type[AgentEvent]]:
    return dict(_TAGS)
