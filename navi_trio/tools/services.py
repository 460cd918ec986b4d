"""What a tool may ask of the core: the `ToolServices` Protocol.

Tools never import the core; they see only this, as ``ToolContext.services`` (None
where there is no core, e.g. a tool tested alone). ``spawn`` in a running turn raises
the sub-agent's backend-level LLM error, which ends that turn; a background job's
returns it as a failed outcome. ``detached(roots)`` is what a background job keeps:
only what outlives the run that started it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import attrs

from navi_trio.errors import LLMError
from navi_trio.events import AgentEvent
from navi_trio.tools.procs import ProcessInfo, ReadResult
from navi_trio.tools.result import ToolResult
from navi_trio.tools.roots import Root, RunRoots

Publish = Callable[[AgentEvent], None]

SUBAGENT_MAX_ITERATIONS = 40


class ProcessService(Protocol):
    async def open(self, session_id: str, command: str, cwd: Path | Root) -> str: ...

    async def read(
        self, session_id: str, handle_id: str, max_chars: int, wait: float = 0.0
    ) -> ReadResult: ...

    async def write(
        self, session_id: str, handle_id: str, text: str, eof: bool = False
    ) -> None: ...

    async def kill(self, session_id: str, handle_id: str) -> ReadResult: ...

    def list(self, session_id: str) -> list[ProcessInfo]: ...


class TaskJobView(Protocol):
    """What the tasks tool reads of a background job (core's task_supervisor.Job)."""

    @property
    def task_id(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def args_summary(self) -> str: ...
    @property
    def is_spawn(self) -> bool: ...
    @property
    def status(self) -> str: ...
    @property
    def result(self) -> ToolResult | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def ring(self) -> Sequence[AgentEvent]: ...
    @property
    def dropped(self) -> int: ...
    @property
    def started_at(self) -> float: ...
    @property
    def finished_at(self) -> float | None: ...
    @property
    def tokens(self) -> int: ...


class TaskService(Protocol):
    """What the tasks tool calls on the supervisor (core's task_supervisor)."""

    def list_jobs(self, session_id: str) -> Sequence[TaskJobView]: ...
    def get(self, session_id: str, task_id: str) -> TaskJobView | None: ...
    async def wait(self, session_id: str, task_id: str, timeout: float) -> bool: ...  # noqa: ASYNC109
    def cancel(self, session_id: str, task_id: str) -> bool: ...


@attrs.frozen(kw_only=True)
class SpawnRequest:
    """spawn_agent's checked arguments (the profile defaults to the session's)."""

    task: str
    profile_id: str | None = None
    # The spec's default, whatever the profile's own limit; also the most a model may ask.
    max_iterations: int = SUBAGENT_MAX_ITERATIONS
    exclude_tools: tuple[str, ...] = ()
    briefing: str | None = None
    custom_system_prompt: str | None = None
    inherit_system_prompt: bool = False
    context_transfer: str | None = None
    timeout_seconds: float = 300.0


@attrs.frozen(kw_only=True)
class SubagentOutcome:
    """How a sub-agent ended. `failure` says why it did not complete, in words;
    `backend_error` is the backend-level LLM error that ended it, if one did."""

    text: str
    completed: bool
    agent_id: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failure: str | None = None
    backend_error: LLMError | None = None

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ToolServices(Protocol):
    @property
    def processes(self) -> ProcessService | None: ...

    @property
    def tasks(self) -> TaskService | None: ...

    def switch_profile(self, profile_id: str) -> None: ...

    async def spawn(self, request: SpawnRequest, publish: Publish) -> SubagentOutcome: ...

    def detached(self, roots: RunRoots | None) -> ToolServices: ...


def unavailable(what: str) -> ToolResult:
    return ToolResult.fail(f"{what} is not available here")
