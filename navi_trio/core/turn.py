"""One turn of the agent loop (agent-loop.md "Tool-calling loop", steps 1-10).

A `Turn` is the mutable state of one run; `TurnRunner` drives it. Everything that a
stop must clean up lives on the Turn (the partial answer of the call being streamed,
the tool calls that have no result yet), so the shielded clean-up in `agent.py` can
save it no matter where the cancel landed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from navi_trio.core import planning
from navi_trio.core.llm_call import Reply, chat_request, output_cap, stream_reply
from navi_trio.core.tool_executor import execute_batch, stopped_result, tool_message
from navi_trio.events import (
    AgentEvent,
    CompressionStarted,
    ContextCompressed,
    ModelInfo,
    PlanCreated,
    StreamEnd,
    TodoStep,
    TodoUpdated,
    WarningEvent,
)
from navi_trio.llm.base import ToolCall
from navi_trio.profiles import AgentProfile, NaviConfig
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.memory import load_memories
from navi_trio.tools.todo import fill_from_plan, load_todo

if TYPE_CHECKING:
    from navi_trio.core.agent import Agent
    from navi_trio.core.session import SessionState

Emit = Callable[[AgentEvent], None]

# Ollama cuts a prompt over num_ctx silently and still answers 200: when the model
# reports far fewer prompt tokens than we estimate we sent, the context was truncated.
# Only a prompt near the window can have been cut: below half of it, a low count is
# just a tokenizer that packs better than cl100k (or a server counting differently).
TRUNCATION_RATIO = 0.6
TRUNCATION_WINDOW_SHARE = 0.5


@attrs.define(eq=False)
class Turn:
    state: SessionState
    profile: AgentProfile
    config: NaviConfig
    user_text: str
    emit: Emit
    user_id: str = "local"
    persist: bool = True
    subagent: bool = False
    system_override: str | None = None
    exclude_tools: tuple[str, ...] = ()
    max_iterations: int | None = None
    agent_id: str | None = None
    parent_session_id: str | None = None
    first_message: bool = False
    # Live state that clean-up after a stop needs.
    reply: Reply | None = None
    pending_calls: list[ToolCall] = attrs.field(factory=list)
    results: dict[int, ToolResult] = attrs.field(factory=dict)
    ended: bool = False
    final_text: str = ""
    iterations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    completed_normally: bool = False
    # Loop mechanics.
    stall: int = 0
    seen_calls: set[str] = attrs.field(factory=set)
    replan: str | None = None
    switch_to: str | None = None

    @property
    def limit(self) -> int:
        return self.max_iterations or self.profile.max_iterations

    def tool_names(self) -> list[str]:
        p = self.profile
        names = p.get_subagent_tools() if self.subagent else p.get_agent_tools()
        return [n for n in names if n not in self.exclude_tools]

    def end(self, event: StreamEnd) -> None:
        self.ended = True
        self.final_text = event.text
        self.emit(event)


class TurnRunner:
    """Runs the loop of one turn with the agent's parts."""

    def __init__(self, agent: Agent, turn: Turn) -> None:
        self.agent = agent
        self.turn = turn
        self.settings = agent.settings
        self._todo: list[TodoStep] = []

    async def save(self) -> None:
        if self.turn.persist:
            await self.agent.cache.save(self.turn.state)

    def model(self) -> str:
        return self.turn.profile.model_or(self.settings.default_model)

    # -- the LLM, for planning and compression ------------------------------------

    async def complete(self, messages: list[dict[str, Any]], purpose: str) -> Reply:
        cap = output_cap(self.settings, self.turn.profile, purpose)
        request = chat_request(self.settings, messages, self.model(), max_tokens=cap)
        reply = await stream_reply(self.agent.backend, self.settings, request, Reply(), None)
        self._count(reply)
        return reply

    def _count(self, reply: Reply) -> None:
        if reply.done is not None:
            self.turn.prompt_tokens += reply.done.prompt_tokens
            self.turn.completion_tokens += reply.done.completion_tokens

    # -- compression --------------------------------------------------------------

    async def compress(self, reason: str, tokens: int, *, force: bool = False) -> bool:
        """Compress when over the threshold (or `force`) and would_compress() agrees."""
        t = self.turn
        compressor = self.agent.compressor(self.complete)
        if not force and not compressor.over_threshold(tokens):
            return False
        if not compressor.would_compress(t.state.context, profile=t.profile, shrink=force):
            return False
        t.emit(CompressionStarted(reason=reason, tokens_before=tokens))
        outcome = await compressor.compress(
            t.state.context, profile=t.profile, config=t.config, reason=reason, shrink=force
        )
        if t.persist:
            await self.agent.cache.replace_context(t.state, outcome.context)
        else:
            t.state.context = list(outcome.context)
        t.state.baseline.reset()
        t.state.needs_compression = False
        t.emit(
            ContextCompressed(
                reason=reason,
                tokens_before=outcome.tokens_before,
                tokens_after=outcome.tokens_after,
                messages_summarised=outcome.messages_summarised,
            )
        )
        return True

    # -- planning -----------------------------------------------------------------

    async def plan(self) -> None:
        t = self.turn
        cfg = t.config
        result = await planning.run_planning(
            t.user_text,
            profile=t.profile,
            complete=self.complete,
            prompts=self.agent.planning_prompts,
            tools=t.tool_names(),
            profiles=sorted(cfg.profiles),
            on_phase=t.emit,
            limits=planning.PlanLimits.of(self.settings, t.profile, self.agent.counter),
        )
        if not result.has_plan:
            return
        text = planning.plan_context_message(result)
        t.state.add({"role": "assistant", "content": text, "is_plan": True})
        await self.save()
        event: PlanCreated = planning.plan_event(result)
        t.emit(event)
        texts = planning.plan_step_texts(result)
        steps = await fill_from_plan(self.agent.store, self.todo_session(), texts)
        t.emit(TodoUpdated(steps=tuple(steps)))

    def todo_session(self) -> str:
        """Session-aware tools of a sub-agent work on the parent session's data."""
        return self.turn.parent_session_id or self.turn.state.id

    # -- the loop -----------------------------------------------------------------

    async def run(self) -> None:
        t = self.turn
        # Pre-turn compression, from the real context (not a stored count).
        await self.compress("pre_turn", self.agent.counter.estimate_messages(t.state.context))
        wants_plan = planning.should_plan(
            is_first_message=t.first_message, profile=t.profile, message=t.user_text
        )
        if wants_plan and (not t.subagent or t.profile.subagent_planning_enabled):
            await self.plan()
        self._todo = await load_todo(self.agent.store, self.todo_session())

        for iteration in range(t.limit):
            t.iterations = iteration + 1
            built = await self.build(iteration)
            self.agent.builder.check_context_size(built, num_ctx=self.settings.num_ctx)
            reply = await self.call_llm(built)
            calls = reply.tool_calls
            if not calls:
                await self.finish(reply)
                return
            await self.run_tools(reply)
            await self.after_tools(calls)
        await self.finish_max_iterations()

    async def build(self, iteration: int) -> list[dict[str, Any]]:
        """Steps 1-4: mid-turn compression, context with budget/anchor/warnings."""
        t = self.turn
        memories = await load_memories(self.agent.store, t.user_id)
        built = self._build(iteration, memories)
        if iteration > 0 or t.state.needs_compression:
            estimate = t.state.baseline.real_baseline_estimate(built, self.agent.counter)
            reason = "truncated_prompt" if t.state.needs_compression else "mid_turn"
            if await self.compress(reason, estimate, force=t.state.needs_compression):
                built = self._build(iteration, memories)
        # Once per call, after the last rebuild: a compression rebuilds the context,
        # and the warning and re-plan note must be in the one that is sent.
        if t.profile.anti_stall_enabled and t.stall >= t.profile.anti_stall_threshold:
            t.emit(WarningEvent(message=f"no progress for {t.stall} iterations", code="anti_stall"))
            t.stall = 0
        t.replan = None
        return built

    def _build(self, iteration: int, memories: list[str]) -> list[dict[str, Any]]:
        t = self.turn
        p = t.profile
        extra: list[dict[str, Any]] = []
        if p.iteration_budget_enabled:
            left = t.limit - iteration - 1
            extra.append(
                _note(
                    f"[Iteration {iteration + 1} of {t.limit}; {left} left after this one. "
                    + (
                        "This is the last one: answer now, without tools.]"
                        if left == 0
                        else "Plan to finish and answer before they run out.]"
                    )
                )
            )
        interval = p.goal_anchoring_interval
        if p.goal_anchoring_enabled and iteration > 0 and iteration % interval == 0:
            extra.append(
                _note(f"[Goal reminder] The user asked: {t.user_text}\nStay on this goal.")
            )
        if p.anti_stall_enabled and t.stall >= p.anti_stall_threshold:
            extra.append(
                _note(
                    f"[Warning] {t.stall} iterations without progress on the todo list. "
                    "You may be looping: change approach, mark the current step failed, "
                    "or answer with what you have."
                )
            )
        if t.replan:
            extra.append(_note(t.replan))
        return self.agent.builder.build(
            config=t.config,
            profile=p,
            context=t.state.context,
            memories=memories,
            extra=extra,
            system_override=t.system_override,
            subagent=t.subagent,
        )

    async def call_llm(self, built: list[dict[str, Any]]) -> Reply:
        """Steps 6-7: stream one answer; record the real baseline; check truthfulness."""
        t = self.turn
        tools = self.agent.executor.schemas(self.agent.registry.select(t.tool_names()))
        think, cap = t.profile.think_enabled, output_cap(self.settings, t.profile, "answer")
        request = chat_request(
            self.settings, built, self.model(), tools=tools, think=think, max_tokens=cap
        )
        t.reply = Reply()
        reply = await stream_reply(self.agent.backend, self.settings, request, t.reply, t.emit)
        self._count(reply)
        done = reply.done
        if done is not None:
            if done.model and done.model != t.state.last_model:
                t.state.last_model = done.model
                t.emit(ModelInfo(done.model))
            estimate = self.agent.counter.estimate_messages(built)
            if (
                done.prompt_tokens
                and estimate >= self.settings.num_ctx * TRUNCATION_WINDOW_SHARE
                and done.prompt_tokens < estimate * TRUNCATION_RATIO
            ):
                t.emit(
                    WarningEvent(
                        message=(
                            f"the model counted {done.prompt_tokens} prompt tokens but ~{estimate} "
                            "were sent: the server probably cut the prompt to fit its window "
                            "(num_ctx). Compressing before the next call."
                        ),
                        code="prompt_truncated",
                    )
                )
                t.state.needs_compression = True
            else:
                t.state.baseline.record_real_baseline(done.prompt_tokens, built)
            if done.done_reason == "length":
                t.emit(
                    WarningEvent(
                        message="the answer was cut off: the model reached its output limit",
                        code="length",
                    )
                )
        return reply

    async def finish(self, reply: Reply) -> None:
        """Step 8a: the final answer."""
        t = self.turn
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.thinking:
            message["thinking"] = reply.thinking_text
        t.state.add(message)
        t.reply = None
        await self.save()
        t.completed_normally = True
        t.end(self.stream_end(reply.content, reason="complete", reply=reply))

    async def finish_max_iterations(self) -> None:
        t = self.turn
        text = (
            f"I stopped after {t.limit} iterations (the limit for this profile) without a final "
            "answer. Ask me to continue, or narrow the task."
        )
        t.state.add({"role": "assistant", "content": text, "synthetic": True})
        await self.save()
        t.emit(WarningEvent(message=f"reached max_iterations={t.limit}", code="max_iterations"))
        t.end(self.stream_end(text, reason="max_iterations"))

    def stream_end(self, text: str, *, reason: str, reply: Reply | None = None) -> StreamEnd:
        t = self.turn
        return StreamEnd(
            text=text,
            stopped=reason == "stopped",
            reason=reason,
            iterations=t.iterations,
            prompt_tokens=t.prompt_tokens,
            completion_tokens=t.completion_tokens,
            done_reason=reply.done.done_reason if reply and reply.done else None,
        )

    async def run_tools(self, reply: Reply) -> None:
        """Step 8b: append the assistant call message, run the calls, append results."""
        t = self.turn
        calls = reply.tool_calls
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.content,
            "tool_calls": [c.to_message() for c in calls],
        }
        if reply.thinking:
            message["thinking"] = reply.thinking_text
        t.state.add(message)
        t.reply = None
        t.pending_calls = list(calls)
        t.results = {}
        await self.save()
        ctx = self.tool_context()
        parallel = t.profile.parallel_tool_calls
        if parallel is None:
            parallel = self.settings.parallel_tool_calls
        await execute_batch(
            self.agent.executor, calls, ctx, t.tool_names(), t.emit, t.results, parallel=parallel
        )
        self.pair_results()
        await self.save()

    def pair_results(self) -> None:
        """Append one tool message per pending call, in call order (stopped if missing)."""
        t = self.turn
        for i, call in enumerate(t.pending_calls):
            t.state.add(tool_message(call, t.results.get(i) or stopped_result()))
        t.pending_calls = []

    def tool_context(self) -> ToolContext:
        t = self.turn
        return self.agent.tool_context(t, session_id=self.todo_session())

    async def after_tools(self, calls: list[ToolCall]) -> None:
        """Step 9-10: anti-stall counters, newly failed steps, profile switch."""
        t = self.turn
        todo = await load_todo(self.agent.store, self.todo_session())
        signatures = [
            json.dumps(
                [call.name, call.arguments, t.results[i].content() if i in t.results else None],
                sort_keys=True,
                default=str,
            )
            for i, call in enumerate(calls)
        ]
        # Identical repeated calls (same tool, arguments and result) are no progress,
        # whatever they did to the todo list.
        repeated = all(sig in t.seen_calls for sig in signatures)
        t.seen_calls.update(signatures)
        before = self._todo
        self._todo = todo
        progressed = [(s.text, s.status) for s in todo] != [(s.text, s.status) for s in before]
        t.stall = 0 if progressed and not repeated else t.stall + 1
        if t.profile.adaptive_replan_enabled:
            was_failed = {s.text for s in before if s.status == "failed"}
            newly = [s for s in todo if s.status == "failed" and s.text not in was_failed]
            if newly:
                names = "; ".join(f"step {s.index} ({s.text})" for s in newly)
                t.replan = (
                    f"[Re-plan] {names} failed. Before going on, revise the remaining plan: "
                    "decide how to reach the goal another way, update the todo list "
                    "(replace or add steps), then continue."
                )
        if t.switch_to and t.switch_to != t.profile.id:
            await self.agent.switch_profile(t, t.switch_to)
        t.switch_to = None


def _note(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


async def shielded(fn: Callable[[], Awaitable[None]], seconds: float = 10.0) -> None:
    """Clean-up that must finish: shielded from the stop, bounded by its own deadline."""
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + seconds
        await fn()
