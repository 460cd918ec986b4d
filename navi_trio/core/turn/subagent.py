"""run_ephemeral: a non-persistent sub-agent with a temporary in-memory context.

It runs the same loop as a session turn on a `SessionState` that is never saved, in a
child task: a copy of the caller's context (its ContextVars do not reach the parent)
inside the caller's cancel scope (the parent's Stop stops it). Its events are marked
``is_subagent``; a backend-level LLM error is kept as `backend_error` for a synchronous
caller to end its own turn with.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

import attrs
import trio

from navi_trio.core.turn import runvars
from navi_trio.core.turn.budgets import Budget
from navi_trio.core.turn.context import SEPARATOR
from navi_trio.core.turn.session_state import SessionState
from navi_trio.core.turn.turn import TurnRunner
from navi_trio.core.turn.turn_state import LoopParts, Turn
from navi_trio.errors import BudgetExhaustedError, ContextTooLargeError, LLMError
from navi_trio.events import AgentEvent, ErrorEvent, SubagentFinished, SubagentStarted
from navi_trio.profiles import AgentProfile
from navi_trio.store.base import SessionRow
from navi_trio.tools.roots import RunRoots
from navi_trio.tools.services import SpawnRequest, SubagentOutcome

Publish = Callable[[AgentEvent], None]

CONTEXT_TRANSFER_ACK = "Understood. I have the context from the parent conversation."


def _no_publish(_: AgentEvent) -> None:
    return None


async def run_ephemeral(
    parts: LoopParts,
    request: SpawnRequest,
    *,
    parent_session_id: str | None = None,
    publish: Publish = _no_publish,
    user_id: str = "local",
    mode: str = "workspace",
    user_role: str = "user",
    usage_to: Callable[[int, int], None] | None = None,
    budget: Budget | None = None,
    roots: RunRoots | None = None,
    profile: AgentProfile | None = None,
) -> SubagentOutcome:
    """Run `request` as a sub-agent of `parent_session_id` (None: of no session). `profile`:
    its own when it is none of the config's (an agent file, narrowed to its spawner's)."""
    agent_id = f"subagent_{secrets.token_hex(4)}"
    user_message = request.task
    cfg = parts.config.current()
    parent_profile_id: str | None = None
    if parent_session_id is not None:
        # The parent session from the DB: its current profile is the default one.
        row = await parts.store.get_session(parent_session_id)
        if row is not None:
            parent_profile_id = row.profile_id
    system: str | None = None
    if profile is None:
        profile = cfg.profile(request.profile_id or parent_profile_id)
    else:  # composed here: a cached prompt of its id could be an older file's
        system = SEPARATOR.join(
            p.strip() for p in (cfg.persona, profile.system_prompt) if p.strip()
        )
    if request.custom_system_prompt:
        system = request.custom_system_prompt
    elif request.inherit_system_prompt:
        parent = cfg.profile(parent_profile_id)
        system = parts.builder.system_prompt(cfg, parent)
    if request.briefing:
        base = system or parts.builder.system_prompt(cfg, profile, subagent=True)
        system = f"{base}\n\n## Briefing\n{request.briefing}"

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
    if request.context_transfer:
        state.add(
            {
                "role": "user",
                "content": f"Context from the parent conversation:\n{request.context_transfer}",
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
        mode=mode,
        user_role=user_role,
        persist=False,
        subagent=True,
        system_override=system,
        exclude_tools=tuple(request.exclude_tools),
        max_iterations=request.max_iterations,
        agent_id=agent_id,
        parent_session_id=parent_session_id,
        first_message=True,
        usage_to=usage_to,
        budget=budget,
        roots=roots,
    )
    runner = TurnRunner(parts, turn)
    publish(
        SubagentStarted(
            profile_id=profile.id, task=user_message, is_subagent=True, agent_id=agent_id
        )
    )
    ended: list[SubagentOutcome] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run_child, runner, request.timeout_seconds, publish, ended.append)
    return ended[0]


async def _run_child(
    runner: TurnRunner,
    timeout_seconds: float,
    publish: Publish,
    done: Callable[[SubagentOutcome], None],
) -> None:
    """The sub-agent's own task: run the loop, say how it ended (also when stopped)."""
    turn = runner.turn
    agent_id = turn.agent_id or ""
    text = ""
    failure: str | None = "it was stopped"
    backend_error: LLMError | None = None
    try:
        with runvars.bound(
            session_id=turn.parent_session_id or agent_id,
            model=runner.model(),
        ):
            with trio.move_on_after(timeout_seconds) as timeout:
                try:
                    await runner.run()
                    text = turn.final_text
                    failure = (
                        None
                        if turn.completed_normally
                        else (
                            f"it reached its iteration limit ({turn.limit}) without a final answer"
                        )
                    )
                except ContextTooLargeError as exc:
                    failure = f"its context outgrew the model's window: {exc}"
                except BudgetExhaustedError as exc:
                    failure = f"its budget ran out: {exc}"
                except LLMError as exc:
                    failure = f"its LLM call failed: {exc}"
                    if exc.backend_level:
                        backend_error = exc
                if failure is not None and not turn.ended:
                    turn.emit(ErrorEvent(message=failure, code="subagent_error"))
                    text = f"[the sub-agent failed: {failure}]"
            if timeout.cancelled_caught:
                partial = turn.reply.content if turn.reply else ""
                failure = f"it timed out after {timeout_seconds:g} s"
                text = (partial + "\n" if partial else "") + f"[the sub-agent {failure}]"
        reason = "complete" if failure is None else (turn.end_reason or "error")
        await runner.end_hooks(reason, text)
    finally:
        if turn.budget is not None:  # what it spent, into the store's counters
            with trio.move_on_after(10, shield=True):
                await turn.budget.close()
        # Also when the parent's Stop cancels it: a client's sub-agent card closes.
        completed = failure is None
        if not completed and not text:
            text = "[the sub-agent was stopped]"
        publish(
            SubagentFinished(
                completed=completed,
                text=text[:2000],
                tokens=turn.prompt_tokens + turn.completion_tokens,
                is_subagent=True,
                agent_id=agent_id,
            )
        )
        with trio.move_on_after(10, shield=True):
            await runner.account()  # into the accounts, under its parent session
    done(
        SubagentOutcome(
            text=text,
            completed=completed,
            agent_id=agent_id,
            prompt_tokens=turn.prompt_tokens,
            completion_tokens=turn.completion_tokens,
            failure=failure,
            backend_error=backend_error,
        )
    )
