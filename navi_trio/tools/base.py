"""The Tool protocol, the context a tool runs with, and the registry.

A tool never imports the agent: whatever it needs (the store's kv table, the session
folder, a way to report progress, the services the core offers such as spawning a
sub-agent or the task supervisor) arrives in its `ToolContext`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, ParamSpec, Protocol

import attrs

from navi_trio.errors import ToolInputError
from navi_trio.events import AgentEvent
from navi_trio.profiles import AgentProfile, NaviConfig
from navi_trio.settings import Settings
from navi_trio.tools.result import ToolResult as ToolResult
from navi_trio.tools.result import cap_text as cap_text
from navi_trio.tools.roots import RunRoots
from navi_trio.tools.runas import session_owner
from navi_trio.tools.sandbox import SandboxSpec
from navi_trio.tools.services import ToolServices


class KVStore(Protocol):
    """The part of the store tools use: JSON values under (scope, key)."""

    async def kv_get(self, scope: str, key: str) -> Any | None: ...
    async def kv_set(self, scope: str, key: str, value: Any) -> None: ...
    async def kv_delete(self, scope: str, key: str) -> None: ...
    async def kv_list(self, scope: str, prefix: str = "") -> list[tuple[str, Any]]: ...


def _no_emit(_: dict[str, Any]) -> None:
    return None


def _no_publish(_: AgentEvent) -> None:
    return None


def _no_trace(_call_id: str, _tool: str) -> dict[str, str]:
    return {}


@attrs.frozen(kw_only=True)
class ToolContext:
    session_id: str
    session_dir: Path  # the session's own folder; file tools are confined to it (and cwd)
    kv: KVStore
    settings: Settings
    profile: AgentProfile
    config: NaviConfig
    cwd: Path | None = None
    user_id: str = "local"
    call_id: str = ""
    # Live progress of this call (becomes a ToolEvent); must not block.
    emit: Callable[[dict[str, Any]], None] = _no_emit
    # Any other event (TodoUpdated, forwarded sub-agent events); must not block.
    publish: Callable[[AgentEvent], None] = _no_publish
    # What the core offers (processes, tasks, switch_profile, spawn); see tools/services.py.
    services: ToolServices | None = None
    # The W3C trace context (traceparent, tracestate) of a call's span, by its call id
    # and tool name, for a call that reaches another daemon (the peer tool); empty when
    # the daemon does not trace.
    trace_context: Callable[[str, str], dict[str, str]] = _no_trace
    is_subagent: bool = False
    # False for a sub-agent with no parent session: a background job's note would have
    # no session to reach, so the executor refuses to detach.
    can_detach: bool = True
    # The run's policy mode (read-only / workspace / full) and the sender's role; where
    # terminal and code_exec run: None = unsandboxed (`full` mode), else bwrap
    # (tools/sandbox.py).
    mode: str = "workspace"
    user_role: str = "user"
    sandbox: SandboxSpec | None = None
    # A run nobody waits on (a scheduled one): a call that would ask goes by the
    # profile's headless rule even with a client attached.
    headless: bool = False
    # The run's roots, held open since its start (tools/roots.py): the session folder
    # and the cwd. None only for a tool driven alone: each call then opens its own.
    held: RunRoots | None = None
    # The skills the run found at its start, for the `skill` tool: a `Skills` of
    # navi_trio/project/, the layer above this one, which the tools do not import.
    skills: object | None = None

    def roots(self) -> tuple[Path, ...]:
        """Folders file tools may touch: the session folder, then the run's cwd."""
        return (self.session_dir,) if self.cwd is None else (self.session_dir, self.cwd)

    def call_roots(self) -> RunRoots:
        """This call's own copy of the roots (the caller closes it): of the run's held
        ones, or opened now when there are none. Blocking: run it in a worker thread."""
        if self.held is not None:
            return self.held.dup()
        return RunRoots.open(self.session_dir, self.cwd, session_owner(self.settings.tool_user))


class Tool(Protocol):
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object (see tools/args.py)

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


P = ParamSpec("P")


def input_errors_fail(
    execute: Callable[P, Coroutine[Any, Any, ToolResult]],
) -> Callable[P, Coroutine[Any, Any, ToolResult]]:
    """`execute` whose ToolInputError (a bad argument, or a refusal such as no sandbox)
    becomes the call's failed result with that text."""

    @functools.wraps(execute)
    async def run(*args: P.args, **kwargs: P.kwargs) -> ToolResult:
        try:
            return await execute(*args, **kwargs)
        except ToolInputError as exc:
            return ToolResult.fail(str(exc))

    return run


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI/Ollama function schema for a tool."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


class ToolSource(Protocol):
    """Tools known only at run time (an MCP server's)."""

    async def prepare(
        self, profile: AgentProfile, publish: Callable[[AgentEvent], None]
    ) -> list[str]: ...

    def get(self, name: str) -> Tool | None: ...


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._sources: list[ToolSource] = []
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        self._tools[tool.name] = tool

    def add_source(self, source: ToolSource) -> None:
        self._sources.append(source)

    async def prepare(
        self, profile: AgentProfile, publish: Callable[[AgentEvent], None]
    ) -> tuple[str, ...]:
        """The run-time tools `profile` gets (its MCP servers' tools), started if need be."""
        names: list[str] = []
        for source in self._sources:
            names += await source.prepare(profile, publish)
        return tuple(names)

    def get(self, name: str) -> Tool | None:
        tool = self._tools.get(name)
        for source in self._sources:
            if tool is not None:
                break
            tool = source.get(name)
        return tool

    def names(self) -> list[str]:
        return sorted(self._tools)

    def select(self, names: Iterable[str], exclude: Iterable[str] = ()) -> list[Tool]:
        """The registered tools named in `names`, in that order, minus `exclude`."""
        skip = set(exclude)
        tools = [self.get(n) for n in names if n not in skip]
        return [t for t in tools if t is not None]
