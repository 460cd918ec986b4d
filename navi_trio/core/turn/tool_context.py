"""The core's side of `ToolServices`: what a tool may ask of a run.

`RunServices` is bound to one running turn; a background job gets `detached()`
(`JobServices`), which keeps only what outlives the run, never the turn itself.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import attrs

from navi_trio.core.turn import runvars
from navi_trio.core.turn.budgets import Budget
from navi_trio.core.turn.file_agents import read_file_agents
from navi_trio.core.turn.observe import trace_context
from navi_trio.core.turn.policy import sandbox_for
from navi_trio.core.turn.subagent import run_ephemeral
from navi_trio.core.turn.turn_state import LoopParts, Turn
from navi_trio.errors import ToolInputError
from navi_trio.events import WarningEvent
from navi_trio.profiles import AgentProfile, NaviConfig
from navi_trio.project import narrowed
from navi_trio.tools.base import ToolContext
from navi_trio.tools.roots import RunRoots
from navi_trio.tools.services import (
    ProcessService,
    Publish,
    SpawnRequest,
    SubagentOutcome,
    TaskService,
    ToolServices,
)


@attrs.frozen(kw_only=True)
class Spawner:
    """Who starts a sub-agent: its defaults and the session its tools work on."""

    parts: LoopParts
    profile_id: str
    session_id: str | None  # None: a sub-agent of an ephemeral run has no session
    user_id: str
    # A sub-agent runs in its parent's mode, never a more powerful one.
    mode: str = "workspace"
    user_role: str = "user"
    # The spawning run's budget: a sub-agent's spending counts against it too.
    budget: Budget | None = None
    # The folders the sub-agent's tools work in: its spawner's, held by whoever owns
    # them (the run, or a background job's own copies).
    roots: RunRoots | None = None

    async def spawn(
        self,
        request: SpawnRequest,
        publish: Publish,
        usage_to: Callable[[int, int], None] | None = None,
        *,
        background: bool = False,
    ) -> SubagentOutcome:
        cfg = self.parts.config.current()
        wanted = request.profile_id or self.profile_id
        file_profile = None
        if wanted not in cfg.profiles:  # an agent kept as a file, or nothing known
            file_profile, left_out = await self._file_agent(wanted, cfg)
            if left_out:
                publish(
                    WarningEvent(
                        message=f"agent {wanted!r} runs without {', '.join(left_out)}: not "
                        f"among the tools profile {self.profile_id!r} gives sub-agents",
                        code="agent_tools_left_out",
                    )
                )
        # A file's agent is the spawner's own profile narrowed: the role may use that.
        refused = cfg.refuse_profile(self.user_role, self.profile_id if file_profile else wanted)
        if refused is not None:
            raise ToolInputError(refused)
        profile = file_profile or cfg.profile(wanted)
        budget = None
        if self.budget is not None:
            budget = self.budget.child(profile.budgets.subagent, background=background)
        return await run_ephemeral(
            self.parts,
            attrs.evolve(request, profile_id=wanted),
            profile=file_profile,
            parent_session_id=self.session_id,
            publish=publish,
            user_id=self.user_id,
            mode=self.mode,
            user_role=self.user_role,
            usage_to=usage_to,
            budget=budget,
            roots=self.roots,
        )

    async def _file_agent(self, name: str, cfg: NaviConfig) -> tuple[AgentProfile, tuple[str, ...]]:
        """The profile of the agent file `name` in the run's cwd (the spawner's, narrowed) and the
        tools it asks for that were left out; else a ToolInputError naming the known ones."""
        found = await read_file_agents(self.parts.settings, cfg, self.roots, self.session_id)
        agent = found.agents.get(name)
        if agent is None:
            known = ", ".join([*sorted(cfg.profiles), *sorted(found.agents)])
            skipped = "".join(f"\n- {p}" for p in found.problems)
            raise ToolInputError(
                f"unknown profile_id {name!r}; profiles: {known}"
                + (f"\nagent files not used:{skipped}" if skipped else "")
            )
        return narrowed(agent, cfg.profile(self.profile_id))


@attrs.frozen
class JobServices:
    """A background job's services: it may spawn, nothing else of a run."""

    spawner: Spawner

    @property
    def processes(self) -> ProcessService | None:
        return None

    @property
    def tasks(self) -> TaskService | None:
        return None

    def switch_profile(self, profile_id: str) -> None:
        raise ToolInputError("switching profiles is not available in a background task")

    async def spawn(self, request: SpawnRequest, publish: Publish) -> SubagentOutcome:
        return await self.spawner.spawn(request, publish, background=True)

    def detached(self, roots: RunRoots | None) -> ToolServices:
        return JobServices(attrs.evolve(self.spawner, roots=roots))


@attrs.define(eq=False)
class RunServices:
    """The services of one running turn."""

    _parts: LoopParts
    _turn: Turn
    processes: ProcessService | None
    tasks: TaskService | None

    def switch_profile(self, profile_id: str) -> None:
        """Takes effect at step 10 of the loop (after this iteration's tools)."""
        profiles = self._turn.config.profiles
        if profile_id not in profiles:
            known = ", ".join(sorted(profiles))
            raise ToolInputError(f"unknown profile {profile_id!r}; profiles: {known}")
        refused = self._turn.config.refuse_profile(self._turn.user_role, profile_id)
        if refused is not None:
            raise ToolInputError(refused)
        self._turn.switch_to = profile_id

    async def spawn(self, request: SpawnRequest, publish: Publish) -> SubagentOutcome:
        """A synchronous sub-agent: its tokens count in this turn's totals, and its
        backend-level LLM error is raised: it ends this turn as the turn's own would."""
        outcome = await self._spawner().spawn(request, publish, usage_to=self._turn.count_child)
        if outcome.backend_error is not None:
            raise outcome.backend_error
        return outcome

    def detached(self, roots: RunRoots | None) -> ToolServices:
        return JobServices(attrs.evolve(self._spawner(), roots=roots))

    def _spawner(self) -> Spawner:
        t = self._turn
        return Spawner(
            parts=self._parts,
            profile_id=t.profile.id,
            session_id=t.parent_session_id or (t.state.id if t.persist else None),
            user_id=t.user_id,
            mode=t.mode,
            user_role=t.user_role,
            budget=t.budget,
            roots=t.roots,
        )


def make_tool_context(
    parts: LoopParts,
    turn: Turn,
    *,
    processes: ProcessService | None,
    tasks: TaskService | None,
) -> ToolContext:
    """The context a turn's tool calls run with (`LoopParts.tool_context`)."""
    session_id = turn.todo_session()
    session_dir = parts.settings.session_dir(session_id)
    cwd = runvars.current_working_directory.get()
    held = turn.roots
    if held is not None and held.cwd is not None:
        cwd = held.cwd.path  # the folder the run holds: what the sandbox binds
    return ToolContext(
        session_id=session_id,
        session_dir=session_dir,
        kv=parts.store,
        settings=parts.settings,
        profile=turn.profile,
        config=turn.config,
        cwd=cwd,
        user_id=turn.user_id,
        publish=turn.emit,
        services=RunServices(parts, turn, processes, tasks),
        trace_context=partial(trace_context, parts.observer, session_id, turn.agent_id),
        is_subagent=turn.subagent,
        can_detach=turn.persist or turn.parent_session_id is not None,
        mode=turn.mode,
        user_role=turn.user_role,
        headless=turn.headless,
        held=held,
        skills=None if turn.project is None else turn.project.skills,
        sandbox=sandbox_for(
            turn.mode,
            session_dir,
            cwd,
            turn.private_paths(parts.settings, turn.config),
            tmp_max_bytes=parts.settings.sandbox_tmp_max_bytes,
        ),
    )
