"""A turn's mutable state (`Turn`) and what its runner works with (`LoopParts`, frozen).

All a stop must clean up (the partial answer, calls without a result) lives on the
Turn, so the shielded clean-up finds it wherever the cancel landed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs

from navi_trio.core.turn.budgets import Budget
from navi_trio.core.turn.compression import Complete, Compressor
from navi_trio.core.turn.context import ContextBuilder, ContextViews
from navi_trio.core.turn.hooks import TurnHooks
from navi_trio.core.turn.injections import Injections
from navi_trio.core.turn.lease import SessionLeases
from navi_trio.core.turn.live_config import LiveConfig
from navi_trio.core.turn.llm_call import StreamedReply
from navi_trio.core.turn.observe import NoObserver, Observer
from navi_trio.core.turn.session_state import SessionCache, SessionState
from navi_trio.core.turn.tokens import TokenCounter
from navi_trio.core.turn.tool_executor import ToolExecutor
from navi_trio.events import AgentEvent, StreamEnd
from navi_trio.llm.base import LLMBackend, ToolCall
from navi_trio.profiles import AgentProfile, NaviConfig
from navi_trio.project import ProjectView, Reader
from navi_trio.settings import Settings
from navi_trio.store.methods import SessionStore
from navi_trio.tools.base import ToolContext, ToolRegistry, ToolResult
from navi_trio.tools.private import OwnData, PrivatePaths, own_data
from navi_trio.tools.roots import RunRoots

Emit = Callable[[AgentEvent], None]


@attrs.define(eq=False)
class Turn:
    state: SessionState
    profile: AgentProfile
    config: NaviConfig
    user_text: str
    emit: Emit
    user_id: str = "local"
    mode: str = "workspace"  # the tool policy's mode for this run
    user_role: str = "user"
    persist: bool = True
    subagent: bool = False
    system_override: str | None = None
    exclude_tools: tuple[str, ...] = ()
    runtime_tools: tuple[str, ...] = ()
    max_iterations: int | None = None
    agent_id: str | None = None
    parent_session_id: str | None = None
    first_message: bool = False
    # Live state that clean-up after a stop needs.
    reply: StreamedReply | None = None
    pending_calls: list[ToolCall] = attrs.field(factory=list)
    results: dict[int, ToolResult] = attrs.field(factory=dict)
    # call id -> trio.current_time() at its ToolStarted: a stopped call's real duration.
    call_started: dict[str, float] = attrs.field(factory=dict)
    model: str | None = None  # the model this run's answers came from (ModelInfo)
    ended: bool = False
    final_text: str = ""
    iterations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The accounts (`TurnRunner._account`): this run's own calls only (not a sub-agent's,
    # which keeps its own), and its time waiting for the model and for its tools.
    own_prompt_tokens: int = 0
    own_completion_tokens: int = 0
    llm_sec: float = 0.0
    tool_sec: float = 0.0
    completed_normally: bool = False
    # Loop mechanics.
    stall: int = 0
    seen_calls: set[str] = attrs.field(factory=set)
    replan: str | None = None
    switch_to: str | None = None
    views: ContextViews = attrs.field(factory=ContextViews)
    # A synchronous sub-agent's usage also counts in its parent turn's totals.
    usage_to: Callable[[int, int], None] | None = None
    injections: Injections | None = None
    budget: Budget | None = None  # None: no budget applies
    # Approvals by the headless rule whoever is attached (a scheduled run).
    headless: bool = False
    # The folders its tools work in, held open (a sub-agent: its parent's); None: each
    # tool call opens its own.
    roots: RunRoots | None = None
    project: ProjectView | None = None  # instruction files and skills read at the start
    # The run's hooks, loaded at its first event; how it ended.
    hooks: TurnHooks | None = None
    end_reason: str = ""
    # What `private_paths` read from the disk for the run's session folder: once a run.
    own_data: tuple[Path, OwnData] | None = None

    @property
    def limit(self) -> int:
        return self.max_iterations or self.profile.max_iterations

    def tool_names(self) -> list[str]:
        p = self.profile
        names = p.get_subagent_tools() if self.subagent else p.get_agent_tools()
        return [n for n in (*names, *self.runtime_tools) if n not in self.exclude_tools]

    def todo_session(self) -> str:
        """Session-aware tools of a sub-agent work on the parent session's data."""
        return self.parent_session_id or self.state.id

    def private_paths(self, settings: Settings, config: NaviConfig | None = None) -> PrivatePaths:
        """What this run's tools may not see (`tools/private.py`), its session folder
        excepted, and with `config` the SSH keys it names. The disk is read at the first
        call of the run (the project's files, then the tools' context take the same
        reading, as the tools keep their context for the whole run); the config's part
        is added at each call."""
        session_dir = settings.session_dir(self.todo_session())
        if self.own_data is None or self.own_data[0] != session_dir:
            self.own_data = (session_dir, own_data(settings, session_dir))
        return self.own_data[1].paths(config)

    def count(self, prompt_tokens: int, completion_tokens: int) -> None:
        """One LLM call's usage: this run's totals (and its parent's), and its budget."""
        if self.budget is not None:
            self.budget.charge_tokens(prompt_tokens + completion_tokens)
        self.own_prompt_tokens += prompt_tokens
        self.own_completion_tokens += completion_tokens
        self.count_child(prompt_tokens, completion_tokens)

    def count_child(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Usage in the totals only: a sub-agent's, whose budget already counted it
        against this run's meters (its budget's chain holds them)."""
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        if self.usage_to is not None:
            self.usage_to(prompt_tokens, completion_tokens)

    def end(self, event: StreamEnd) -> None:
        self.ended = True
        self.final_text = event.text
        self.end_reason = event.reason or ""
        self.emit(event)


@attrs.frozen(kw_only=True)
class LoopParts:
    """What a turn's runner works with, handed over as one object. `tool_context` comes from
    the agent, so a tool can start a sub-agent on this loop without the loop knowing."""

    settings: Settings
    store: SessionStore
    cache: SessionCache
    backend: LLMBackend
    registry: ToolRegistry
    executor: ToolExecutor
    builder: ContextBuilder
    counter: TokenCounter
    config: LiveConfig
    tool_context: Callable[[Turn], ToolContext]
    observer: Observer = attrs.field(factory=NoObserver)
    # The project files read so far, by stamp: a turn reads again only what changed.
    project_files: Reader = attrs.field(factory=Reader)
    # The runtime's leases: the save before a round's calls renews the run's lease.
    leases: SessionLeases | None = None

    def compressor(self, complete: Complete) -> Compressor:
        return Compressor(self.settings, self.counter, complete, self.config.prompts_dir)
