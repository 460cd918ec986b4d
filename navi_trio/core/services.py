"""What tools reach through ``ctx.services`` (tools never import the core)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from navi_trio.core.subagent import spawn_from_turn
from navi_trio.errors import ToolInputError

if TYPE_CHECKING:
    from navi_trio.core.agent import Agent
    from navi_trio.core.tasks import TaskSupervisor
    from navi_trio.core.turn import Turn
    from navi_trio.tools.procs import ProcessPool


class RunServices:
    """Per-run services: profile switching, processes, background tasks, sub-agents."""

    def __init__(
        self,
        agent: Agent,
        turn: Turn,
        processes: ProcessPool | None,
        tasks: TaskSupervisor | None,
    ) -> None:
        self.agent = agent
        self.turn = turn
        self.processes = processes
        self.tasks = tasks

    def switch_profile(self, profile_id: str) -> None:
        """Takes effect at step 10 of the loop (after this iteration's tools)."""
        if profile_id not in self.turn.config.profiles:
            known = ", ".join(sorted(self.turn.config.profiles))
            raise ToolInputError(f"unknown profile {profile_id!r}; profiles: {known}")
        self.turn.switch_to = profile_id

    async def spawn(self, **kwargs: Any) -> Any:
        """run_ephemeral for the spawn_agent tool, bound to this run."""
        return await spawn_from_turn(self.agent, self.turn, **kwargs)
