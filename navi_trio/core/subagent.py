"""run_ephemeral: a non-persistent sub-agent with a temporary in-memory context.

The sub-agent runs the same loop as a session turn (`TurnRunner`) on an in-memory
`SessionState` that is never saved. Its events go to `publish`, marked
``is_subagent=True`` and ``agent_id`` — the parent's stream for a synchronous
spawn_agent call, the job's ring for a background one.

ContextVars: the sub-agent binds its own values with `runvars.bound`, which restores
the parent's on every exit path (success, failure, timeout, stop). It runs inside the
parent's cancel scope, so the parent's Stop stops it too; its own timeout is a
`move_on_after` scope.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from navi_trio.core import runvars
from navi_trio.core.session import SessionState
from navi_trio.core.turn import Turn, TurnRunner
from navi_trio.errors import ContextTooLargeError, LLMError
from navi_trio.events import AgentEvent, ErrorEvent, SubagentFinished, SubagentStarted
from navi_trio.store.base import SessionRow

if TYPE_CHECKING:
    from navi_trio.core.agent import Agent

Publish = Callable[[AgentEvent], None]

CONTEXT_TRANSFER_ACK = "Understood. I have the context from the parent conversation."


@attrs.frozen
class SubagentOutcome:
    text: str
    completed: bool
    tokens: int
    agent_id: str


def _no_publish(_: AgentEvent) -> None:
    return None


async def run_ephemeral(
    agent: Agent,
    user_message: str,
    profile_id: str | None,
    *,
    max_iterations: int = 40,
    exclude_tools: tuple[str, ...] | list[str] = (),
    briefing: str | None = None,
    custom_system_prompt: str | None = None,
    inherit_system_prompt: bool = False,
    context_transfer: str | None = None,
    parent_session_id: str | None = None,
    timeout_seconds: float = 300.0,
    publish: Publish = _no_publish,
    user_id: str = "local",
) -> SubagentOutcome:
    agent_id = f"subagent_{secrets.token_hex(4)}"
    cfg = agent.config()
    parent_profile_id: str | None = None
    if parent_session_id is not None:
        # The parent session from the DB: its current profile is the default one.
        row = await agent.store.get_session(parent_session_id)
        if row is not None:
            parent_profile_id = row.profile_id
    profile = cfg.profile(profile_id or parent_profile_id)

    system: str | None = None
    if custom_system_prompt:
        system = custom_system_prompt
    elif inherit_system_prompt:
        parent = cfg.profile(parent_profile_id)
        system = agent.builder.system_prompt(cfg, parent)
    if briefing:
        base = system or agent.builder.system_prompt(cfg, profile, subagent=True)
        system = f"{base}\n\n## Briefing\n{briefing}"

    def forward(event: AgentEvent) -> None:
        if event.is_subagent:
            publish(event)  # a grandchild's event keeps its own agent id
        else:
            publish(attrs.evolve(event, is_subagent=True, agent_id=agent_id))

    now = time.time()
    state = SessionState(
        row=SessionRow(
            id=agent_id,
            profile_id=profile.id,
            title="",
            user_id=user_id,
            created_at=now,
            updated_at=now,
            meta={},
        ),
        messages=[],
        context=[],
        saved_messages=0,
        saved_context=0,
    )
    if context_transfer:
        state.add(
            {
                "role": "user",
                "content": f"Context from the parent conversation:\n{context_transfer}",
            }
        )
        state.add({"role": "assistant", "content": CONTEXT_TRANSFER_ACK})
    state.add({"role": "user", "content": user_message})
    turn = Turn(
        state=state,
        profile=profile,
        config=cfg,
        user_text=user_message,
        emit=forward,
        user_id=user_id,
        persist=False,
        subagent=True,
        system_override=system,
        exclude_tools=tuple(exclude_tools),
        max_iterations=max_iterations,
        agent_id=agent_id,
        parent_session_id=parent_session_id,
        first_message=True,
    )
    runner = TurnRunner(agent, turn)
    publish(
        SubagentStarted(
            profile_id=profile.id, task=user_message, is_subagent=True, agent_id=agent_id
        )
    )
    text = ""
    completed = False
    try:
        with runvars.bound(
            session_id=parent_session_id or agent_id,
            model=profile.model_or(agent.settings.default_model),
        ):
            with trio.move_on_after(timeout_seconds) as timeout:
                try:
                    await runner.run()
                    text = turn.final_text
                except (LLMError, ContextTooLargeError) as exc:
                    forward(ErrorEvent(message=str(exc), code="subagent_error"))
                    text = f"[the sub-agent failed: {exc}]"
            if timeout.cancelled_caught:
                partial = turn.reply.content if turn.reply else ""
                text = (partial + "\n" if partial else "") + (
                    f"[the sub-agent timed out after {timeout_seconds:g} s]"
                )
        completed = turn.completed_normally and not timeout.cancelled_caught
    finally:
        # Also when the parent's Stop cancels it: a client's sub-agent card closes.
        if not completed and not text:
            text = "[the sub-agent was stopped]"
        tokens = turn.prompt_tokens + turn.completion_tokens
        publish(
            SubagentFinished(
                completed=completed,
                text=text[:2000],
                tokens=tokens,
                is_subagent=True,
                agent_id=agent_id,
            )
        )
    return SubagentOutcome(text=text, completed=completed, tokens=tokens, agent_id=agent_id)


async def spawn_from_turn(
    agent: Agent, parent: Turn, *, publish: Publish | None = None, task: str, **kwargs: Any
) -> tuple[str, bool, int, str]:
    """spawn_agent's service: run_ephemeral with the parent run's session and profile."""
    profile_id = kwargs.pop("profile_id", None) or parent.profile.id
    session_id = parent.parent_session_id or (None if not parent.persist else parent.state.id)
    outcome = await run_ephemeral(
        agent,
        task,
        profile_id,
        parent_session_id=session_id,
        publish=publish or parent.emit,
        user_id=parent.user_id,
        **kwargs,
    )
    return outcome.text, outcome.completed, outcome.tokens, outcome.agent_id
