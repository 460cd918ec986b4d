"""One turn of the agent loop (agent-loop.md "Tool-calling loop", steps 1-10).

`TurnRunner` drives a `Turn` with the parts it is given as one frozen `LoopParts` (the
agent builds the parts once, the runner never sees the agent), and ends the turn in every
way it can end: `drive` runs the loop inside the run's cancel scope; complete, stopped,
failed (an LLM error), crashed (our bug) or context too large, it saves the partial
answer and pairs every tool call, shielded, and says so with one StreamEnd. An error
event's `code` is the error class's own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from functools import partial
from typing import Any

import trio

from navi_trio.core.turn import planning
from navi_trio.core.turn.compression import over_threshold
from navi_trio.core.turn.file_agents import agents_note, read_file_agents
from navi_trio.core.turn.hooks import TurnHooks
from navi_trio.core.turn.llm_call import StreamedReply, chat_request, output_cap, stream_reply
from navi_trio.core.turn.observe import LLMCallDone
from navi_trio.core.turn.policy import denied_outright
from navi_trio.core.turn.project_files import project_text, read_project
from navi_trio.core.turn.steering import take_injections
from navi_trio.core.turn.tool_executor import execute_batch, stopped_result, tool_message
from navi_trio.core.turn.turn_state import Emit, LoopParts, Turn
from navi_trio.errors import BudgetExhaustedError, ContextTooLargeError, LLMError, StoreError
from navi_trio.events import (
    AgentEvent,
    BudgetExhausted,
    CompressionStarted,
    ContextCompressed,
    ErrorEvent,
    ModelInfo,
    PlanCreated,
    StreamEnd,
    TextDelta,
    TodoStep,
    TodoUpdated,
    ToolResultEvent,
    ToolStarted,
    WarningEvent,
)
from navi_trio.llm.base import ChatRequest, ToolCall
from navi_trio.store.base import RunUsage
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.memory import MemoryTool, load_memories
from navi_trio.tools.spawn_agent import SpawnAgentTool
from navi_trio.tools.todo import fill_from_plan, load_todo

# Ollama cuts a prompt over num_ctx silently and still answers 200: when the model
# reports far fewer prompt tokens than we estimate we sent, the context was truncated.
# Only a prompt near the window can have been cut: below half of it, a low count is
# just a tokenizer that packs better than cl100k (or a server counting differently).
TRUNCATION_RATIO = 0.6
TRUNCATION_WINDOW_SHARE = 0.5
# Tool calls after which the turn reloads the user's memories (they may have changed).
MEMORY_WRITERS = frozenset({MemoryTool.name, SpawnAgentTool.name})

log = logging.getLogger(__name__)
ACCOUNT_DEADLINE_SEC = 10.0  # the accounts' write at a turn's end, at most


class TurnRunner:
    """Runs the loop of one turn, and ends it whatever happens (`drive`)."""

    def __init__(self, parts: LoopParts, turn: Turn) -> None:
        self.parts = parts
        self.turn = turn
        self._accounted: tuple[float, ...] = (0, 0, 0.0, 0.0)  # what `account` kept so far
        self.settings = parts.settings
        self._todo: list[TodoStep] = []
        # The user's memories, loaded once per turn (a store round trip): reloaded only
        # after a round that may have changed them (the memory tool, a sub-agent).
        self._memories: list[str] | None = None
        self._tool_context: ToolContext | None = None
        # The tool schemas sent with each call, their JSON and their tokens (they change
        # only when the profile or a rule does): part of the prompt a budget reserves for.
        self._schemas: tuple[list[dict[str, Any]], str, int] = ([], "", 0)
        self._agents_note: str | None = None  # the agents kept as files (file_agents.py)

    def _schema_tokens(self, tools: list[dict[str, Any]]) -> int:
        kept, text, tokens = self._schemas
        # The executor offers the very same dicts while nothing changed (never edited).
        same = len(kept) == len(tools) and all(a is b for a, b in zip(kept, tools, strict=True))
        if text and same:
            return tokens
        new = json.dumps(tools, ensure_ascii=False, sort_keys=True)
        if new != text:
            tokens = self.parts.counter.count_text(new)
        self._schemas = (list(tools), new, tokens)
        return tokens

    async def save(self, *, durable: bool = True) -> None:
        if self.turn.persist:
            await self.parts.cache.save(self.turn.state, durable=durable)

    async def save_calls(self) -> bool:
        """The call message, committed without an fsync; whether that renewed the run's lease."""
        if not self.turn.persist:
            return False
        state, cache, leases = self.turn.state, self.parts.cache, self.parts.leases
        if leases is None:
            await cache.save(state, durable=False)
            return False
        return await leases.renewing(
            state.id, lambda ttl: cache.save(state, durable=False, renew=ttl)
        )

    def model(self) -> str:
        return self.turn.profile.model_or(self.settings.default_model)

    async def complete(self, messages: list[dict[str, Any]], purpose: str) -> StreamedReply:
        cap = output_cap(self.settings, self.turn.profile, purpose)
        budget = self.turn.budget if not self.turn.ended else None  # the worker: free
        if budget is not None and budget.active:
            await self.parts.counter.preload()
            cap = await budget.before_llm(self.parts.counter.estimate_messages(messages), cap)
        request = chat_request(self.settings, messages, self.model(), max_tokens=cap)
        with budget.wall() if budget is not None else nullcontext():
            reply = await self._stream(request, StreamedReply(), None, None, purpose)
        self._count(reply)
        if budget is not None and budget.active:
            await budget.settle()
        return reply

    async def _stream(
        self,
        request: ChatRequest,
        reply: StreamedReply,
        emit: Emit | None,
        first: Callable[[], None] | None,
        purpose: str,
    ) -> StreamedReply:
        """`stream_reply`, timed for the observer (however it ends: a stop or a failure
        is a call too)."""
        started = trio.current_time()
        first_at: list[float] = []

        def first_chunk() -> None:
            first_at.append(trio.current_time())
            if first is not None:
                first()

        try:
            return await stream_reply(
                self.parts.backend, self.settings, request, reply, emit, first_chunk=first_chunk
            )
        finally:
            done = reply.done
            self.turn.llm_sec += trio.current_time() - started
            self.parts.observer.llm_call(
                LLMCallDone(
                    model=(done.model if done is not None else "") or request.model,
                    purpose=purpose,
                    seconds=trio.current_time() - started,
                    first_chunk_seconds=first_at[0] - started if first_at else None,
                    prompt_tokens=done.prompt_tokens if done is not None else 0,
                    completion_tokens=done.completion_tokens if done is not None else 0,
                    finish=done.done_reason if done is not None else None,
                    failed=done is None,
                    session_id=self.turn.todo_session(),
                    agent_id=self.turn.agent_id,
                )
            )

    def _count(self, reply: StreamedReply) -> None:
        if reply.done is not None:
            self.turn.count(reply.done.prompt_tokens, reply.done.completion_tokens)

    async def compress(self, reason: str, tokens: int, *, force: bool = False) -> bool:
        """Compress when over the threshold (or `force`) and would_compress() agrees."""
        t = self.turn
        if not force and not over_threshold(self.settings, tokens):
            return False
        compressor = self.parts.compressor(self.complete)
        if not compressor.would_compress(t.state.context, profile=t.profile, shrink=force):
            return False
        t.emit(CompressionStarted(reason=reason, tokens_before=tokens))
        hooks = await self.hooks()
        asked = await hooks.fire("pre_compact", self.tool_context(), reason=reason, tokens=tokens)
        outcome = await compressor.compress(
            t.state.context,
            profile=t.profile,
            config=t.config,
            reason=reason,
            shrink=force,
            keep=asked.context,
        )
        if t.persist:
            await self.parts.cache.replace_context(t.state, outcome.context)
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
        await hooks.fire(
            "post_compact",
            self.tool_context(),
            reason=reason,
            tokens_before=outcome.tokens_before,
            tokens_after=outcome.tokens_after,
        )
        return True

    async def plan(self) -> None:
        t = self.turn
        cfg = t.config
        result = await planning.run_planning(
            t.user_text,
            profile=t.profile,
            complete=self.complete,
            prompts=self.parts.config.planning_prompts,
            tools=t.tool_names(),
            profiles=sorted(cfg.profiles),
            on_phase=t.emit,
            limits=planning.PlanLimits.of(self.settings, t.profile, self.parts.counter),
        )
        if not result.has_plan:
            return
        text = planning.plan_context_message(result)
        t.state.add({"role": "assistant", "content": text, "is_plan": True})
        await self.save()
        event: PlanCreated = planning.plan_event(result)
        t.emit(event)
        texts = planning.plan_step_texts(result)
        steps = await fill_from_plan(self.parts.store, self.turn.todo_session(), texts)
        t.emit(TodoUpdated(steps=tuple(steps)))

    async def hooks(self) -> TurnHooks:
        """The run's hooks, loaded at its first event."""
        if self.turn.hooks is None:
            self.turn.hooks = await TurnHooks.load(self.tool_context(), self.turn.emit)
        return self.turn.hooks

    async def run(self) -> None:
        t = self.turn
        counter, context = self.parts.counter, t.state.context
        t.runtime_tools = await self.parts.registry.prepare(t.profile, t.emit)
        # The project's files first: the tool context the hooks see carries its skills.
        t.project = await read_project(self.parts, t)
        if SpawnAgentTool.name in t.tool_names():  # the model is told what it may spawn
            found = await read_file_agents(self.settings, t.config, t.roots, t.todo_session())
            self._agents_note = agents_note(found)
        if not await self.start_hooks():
            return
        # Pre-turn compression, from the real context (not a stored count). While the
        # encoding still loads, a bound under the threshold settles it without waiting.
        if counter.loaded or over_threshold(self.settings, counter.bound_messages(context)):
            await counter.preload()
            await self.compress("pre_turn", counter.estimate_messages(context))
        wants_plan = planning.should_plan(
            is_first_message=t.first_message, profile=t.profile, message=t.user_text
        )
        if wants_plan and (not t.subagent or t.profile.subagent_planning_enabled):
            await counter.preload()  # the phases' prompts are counted
            await self.plan()
        self._todo = await load_todo(self.parts.store, self.turn.todo_session())

        for iteration in range(t.limit):
            t.iterations = iteration + 1
            reply = await self.ask(iteration)
            calls = reply.tool_calls
            if not calls:
                await self.finish(reply)
                return
            await self.run_tools(reply)
            await self.after_tools(calls)
        await self.finish_max_iterations()

    async def start_hooks(self) -> bool:
        """session_start (a session's first message) and user_message: what they add
        goes into the context; False when a user_message hook blocked the message (the
        turn has ended, saying why)."""
        t = self.turn
        if t.subagent:
            return True
        hooks, ctx = await self.hooks(), self.tool_context()
        added = []
        if t.first_message:
            added.append((await hooks.fire("session_start", ctx)).context)
        if t.user_text:
            answer = await hooks.fire("user_message", ctx, message=t.user_text)
            if answer.decision in ("block", "deny"):
                text = f"A hook blocked this message: {answer.reason or 'no reason given'}"
                t.state.add({"role": "assistant", "content": text, "synthetic": True})
                await self.save()
                await self.end(self.stream_end(text, reason="blocked"))
                return False
            added.append(answer.context)
        text = "\n".join(a for a in added if a)
        if text:
            note = {"role": "system", "content": f"[Hook context]\n{text}", "keep": True}
            t.state.add(note, display=False)
            await self.save()
        return True

    async def ask(self, iteration: int) -> StreamedReply:
        """Steps 1-7 of one iteration: injections, the context, its size check, the answer. A
        steer before the model's first chunk drops that request and asks again with it."""
        t = self.turn
        while True:
            await take_injections(t, self.parts)
            replan, stall = t.replan, t.stall  # `build` spends them; a restart needs them
            built = await self.build(iteration)
            self.parts.builder.check_context_size(
                built, num_ctx=self.settings.num_ctx, views=t.views
            )
            if t.injections is None:
                return await self.call_llm(built)
            with t.injections.prefill() as wait:
                reply = await self.call_llm(built)
            if not wait.cancelled_caught:
                return reply
            t.replan, t.stall = replan, stall

    async def build(self, iteration: int) -> list[dict[str, Any]]:
        """Steps 1-4: mid-turn compression, context with budget/anchor/warnings."""
        t = self.turn
        if self._memories is None:
            self._memories = await load_memories(self.parts.store, t.user_id)
        memories = self._memories
        built = self._build(iteration, memories)
        if iteration > 0 or t.state.needs_compression:
            await self.parts.counter.preload()
            estimate = t.state.baseline.real_baseline_estimate(
                built, self.parts.counter, partial(self.parts.builder.estimate, built, t.views)
            )
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
        if self._agents_note:
            extra.append(_note(self._agents_note))
        return self.parts.builder.build(
            config=t.config,
            profile=p,
            context=t.state.context,
            memories=memories,
            extra=extra,
            system_override=t.system_override,
            subagent=t.subagent,
            views=t.views,
            project=project_text(t),
        )

    async def call_llm(self, built: list[dict[str, Any]]) -> StreamedReply:
        """Steps 6-7: stream one answer; record the real baseline; check truthfulness."""
        t = self.turn
        tools = self.parts.executor.schemas(
            self.parts.registry.select(t.tool_names()),
            hidden=lambda tool, action: denied_outright(t.profile, t.user_role, tool, action),
        )
        think, cap = t.profile.think_enabled, output_cap(self.settings, t.profile, "answer")
        if t.budget is not None and t.budget.active:
            await self.parts.counter.preload()
            prompt = self.parts.builder.estimate(built, t.views) + self._schema_tokens(tools)
            cap = await t.budget.before_llm(prompt, cap)
        request = chat_request(
            self.settings, built, self.model(), tools=tools, think=think, max_tokens=cap
        )
        t.reply = StreamedReply()
        first = t.injections.first_chunk if t.injections is not None else None
        # The encoding loads (once) on a thread while the model reads the prompt: not
        # before, where its load (holding the GIL at its end) would hold the request up.
        self.parts.counter.wanted()
        with t.budget.wall() if t.budget is not None else nullcontext():
            reply = await self._stream(request, t.reply, t.emit, first, "answer")
        self._count(reply)
        if t.budget is not None and t.budget.active:
            await t.budget.settle()  # what it did not use is free for other runs now
        # The rest of the turn counts (the real baseline, tool results, compression):
        # from here on the encoding is loaded, waited for on a thread if it was not.
        await self.parts.counter.preload()
        report = t.budget.report() if t.budget is not None else None
        if report is not None:
            t.emit(report)  # once a round: what each budget has spent
        done = reply.done
        if done is not None:
            if done.model and done.model != t.model:
                t.model = done.model
                t.emit(ModelInfo(done.model))
            estimate = self.parts.builder.estimate(built, t.views)
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

    async def finish(self, reply: StreamedReply) -> None:
        """Step 8a: the final answer."""
        t = self.turn
        t.state.add(_assistant(reply))
        t.reply = None
        await self.save()
        t.completed_normally = True
        await self.end(self.stream_end(reply.content, reason="complete", reply=reply))

    async def finish_max_iterations(self) -> None:
        t = self.turn
        text = (
            f"I stopped after {t.limit} iterations (the limit for this profile) without a final "
            "answer. Ask me to continue, or narrow the task."
        )
        t.state.add({"role": "assistant", "content": text, "synthetic": True})
        await self.save()
        t.emit(WarningEvent(message=f"reached max_iterations={t.limit}", code="max_iterations"))
        await self.end(self.stream_end(text, reason="max_iterations"))

    async def run_tools(self, reply: StreamedReply) -> None:
        """Step 8b: append the assistant call message, run the calls, append results.

        The call message is saved before the calls run, without an fsync (a crash keeps the
        call; the load pairs it); that save renews the lease, confirming the first call."""
        t = self.turn
        calls = reply.tool_calls
        t.state.add(_assistant(reply, tool_calls=[c.to_message() for c in calls]))
        t.reply = None
        t.pending_calls = list(calls)
        t.results = {}
        t.call_started = {}
        hooks = await self.hooks()  # (loaded once a run) before the save that confirms
        confirmed = await self.save_calls()
        ctx = self.tool_context()
        parallel = self.parts.builder.parallel_calls(t.profile)

        def publish(event: AgentEvent) -> None:
            if isinstance(event, ToolStarted):
                t.call_started[event.call_id] = trio.current_time()
            t.emit(event)

        budget = t.budget if t.budget is not None and t.budget.active else None
        started = trio.current_time()
        try:
            with budget.wall() if budget is not None else nullcontext():
                await execute_batch(
                    self.parts.executor,
                    calls,
                    ctx,
                    t.tool_names(),
                    publish,
                    t.results,
                    parallel=parallel,
                    before=budget.before_tool if budget is not None else None,
                    hooks=hooks,
                    confirmed=confirmed,
                )
        finally:
            t.tool_sec += trio.current_time() - started
        self.pair_results()
        if any(c.name in MEMORY_WRITERS for c in calls):
            self._memories = None
        await self.save()

    def tool_context(self) -> ToolContext:
        """The context of this turn's tool calls: made once, again after a profile switch."""
        if self._tool_context is None:
            self._tool_context = self.parts.tool_context(self.turn)
        return self._tool_context

    async def after_tools(self, calls: list[ToolCall]) -> None:
        """Step 9-10: anti-stall counters, newly failed steps, profile switch."""
        t = self.turn
        # Progress is tracked (a todo read per round) only for a profile that uses it.
        if t.profile.anti_stall_enabled or t.profile.adaptive_replan_enabled:
            await self._track_progress(calls)
        if t.switch_to and t.switch_to != t.profile.id:
            await self.switch_profile(t.switch_to)
        t.switch_to = None

    async def _track_progress(self, calls: list[ToolCall]) -> None:
        t = self.turn
        todo = await load_todo(self.parts.store, self.turn.todo_session())
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

    async def switch_profile(self, profile_id: str) -> None:
        """Step 10: the profile changed; reload it, its tools, and the config in force (the
        builder's cache serves a prompt only to the config it was built from)."""
        t = self.turn
        t.config = self.parts.config.current()
        t.profile = t.config.profile(profile_id)
        t.runtime_tools = await self.parts.registry.prepare(t.profile, t.emit)
        if SpawnAgentTool.name in t.tool_names():  # the model is told what it may spawn
            found = await read_file_agents(self.settings, t.config, t.roots, t.todo_session())
            self._agents_note = agents_note(found)
        t.views.invalidate()
        self._tool_context = None
        if t.profile.anti_stall_enabled or t.profile.adaptive_replan_enabled:
            # Untracked until now: progress counts from the todo list as it is.
            self._todo = await load_todo(self.parts.store, t.todo_session())
        if t.persist and not t.subagent:
            await self.parts.cache.set_profile(t.state, profile_id)

    # How the turn ends, whatever happens: `drive` and the endings it chooses.

    def stream_end(
        self, text: str, *, reason: str, reply: StreamedReply | None = None
    ) -> StreamEnd:
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

    def pair_results(self) -> None:
        """Append one tool message per pending call, in call order (stopped if missing)."""
        t = self.turn
        for i, call in enumerate(t.pending_calls):
            t.state.add(tool_message(call, t.results.get(i) or stopped_result()))
        t.pending_calls = []

    async def drive(self, scope: trio.CancelScope) -> None:
        """Run the turn inside the run's cancel `scope` and end it whatever happens.

        Stop cancels `scope`; a cancel from outside (the runtime shutting down) or our
        own bug ends the turn the same way, then goes on. Every ending is shielded: the
        history is left consistent (partial answer saved, every call paired).
        """
        try:
            await self._drive(scope)
        finally:
            await shielded(self.account)

    async def end(self, event: StreamEnd) -> None:
        """End the turn with `event`, its usage kept first: a client that acts on the
        stream_end finds the run over and its accounts written."""
        await shielded(self.account, ACCOUNT_DEADLINE_SEC)
        self.turn.end(event)

    async def account(self) -> None:
        """Keep what this run spent since it last did (a sub-agent's or a job's under the session
        that started them). A failed write is logged, never raised."""
        t = self.turn
        session = t.parent_session_id if t.subagent else t.state.id if t.persist else None
        now = (t.own_prompt_tokens, t.own_completion_tokens, t.llm_sec, t.tool_sec)
        spent = tuple(n - was for n, was in zip(now, self._accounted, strict=True))
        if session is None or not any(spent):
            return
        self._accounted = now
        kind = "turn" if not t.subagent else "subagent" if t.usage_to is not None else "job"
        usage = RunUsage(
            session_id=session,
            user_id=t.user_id,
            profile=t.profile.id,
            model=t.model or self.model(),
            kind=kind,
            tokens_in=int(spent[0]),
            tokens_out=int(spent[1]),
            llm_sec=spent[2],
            tool_sec=spent[3],
        )
        try:
            await self.parts.store.record_run_usage(usage)
        except StoreError as exc:
            log.warning("session %s: its run's usage was not kept: %s", session, exc)

    async def _drive(self, scope: trio.CancelScope) -> None:
        turn = self.turn
        try:
            with scope:
                try:
                    await self.run()
                except ContextTooLargeError as exc:
                    await self._too_large(exc)
                except BudgetExhaustedError as exc:
                    await shielded(partial(self._exhausted, exc))
                except LLMError as exc:
                    await shielded(partial(self._failed, exc))
                if turn.completed_normally and turn.persist:
                    await self._run_workers()
        except BaseException as exc:
            if not turn.ended:
                if _only_cancelled(exc):
                    await shielded(self._stopped)
                else:
                    await shielded(self._crashed)
            raise
        if not turn.ended:
            await shielded(self._stopped)
        await self.end_hooks()

    async def end_hooks(self, reason: str | None = None, text: str | None = None) -> None:
        """After the turn ended: ``stop`` when the user stopped it, then ``turn_end``
        (``subagent_end`` for a sub-agent), with how it ended (`reason`, else the stream
        end's) and its text."""
        turn = self.turn
        if turn.hooks is None and not (turn.config.hooks or turn.config.hook_files.read):
            return
        hooks, ctx = await self.hooks(), self.tool_context()
        reason = turn.end_reason if reason is None else reason
        if reason == "stopped":
            await hooks.fire("stop", ctx)
        event = "subagent_end" if turn.subagent else "turn_end"
        await hooks.fire(event, ctx, reason=reason, text=turn.final_text if text is None else text)

    async def _run_workers(self) -> None:
        """Workers run after StreamEnd: the compression worker.

        The turn has already ended, so a failure here is a warning, never a second
        StreamEnd; the context stays as it was and the next turn tries again.
        """
        turn = self.turn
        try:
            await self.parts.counter.preload()  # a turn that ended before any answer
            await self.compress("worker", self.parts.counter.estimate_messages(turn.state.context))
        except LLMError as exc:
            turn.emit(
                WarningEvent(
                    message=f"compressing the context after the answer failed: {exc}",
                    code="compression_failed",
                )
            )

    async def _save_partial(
        self, *, durable: bool = True, unfinished: ToolResult | None = None, **marks: Any
    ) -> str:
        """Keep what the call being streamed produced; pair every call without a result
        (with `unfinished`, else "stopped by the user")."""
        turn = self.turn
        reply = turn.reply
        text = reply.content if reply else ""
        if reply is not None and (reply.text or reply.thinking):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text,
                "partial": True,
                **marks,
            }
            if reply.thinking:
                message["thinking"] = reply.thinking_text
            turn.state.add(message)
        turn.reply = None
        for i, call in enumerate(turn.pending_calls):
            if i not in turn.results:
                result = unfinished or stopped_result()
                turn.results[i] = result
                started = turn.call_started.get(call.id)  # None: it never started
                took = 0 if started is None else int((trio.current_time() - started) * 1000)
                turn.emit(
                    ToolResultEvent(
                        call_id=call.id,
                        name=call.name,
                        ok=False,
                        error=result.error,
                        duration_ms=took,
                        stopped=True,
                    )
                )
        self.pair_results()
        await self.save(durable=durable)
        return text

    async def _crashed(self) -> None:
        await self._save_partial(error="internal error")

    async def _stopped(self) -> None:
        # Committed without an fsync, so StreamEnd does not wait for the disk: the
        # stopped turn survives a killed daemon at once, and power loss from the next
        # durable commit on (before that, at worst the history ends where this turn's
        # last durable save left it, and a dangling call is paired on load).
        text = await self._save_partial(durable=False, stopped=True)
        await self.end(self.stream_end(text, reason="stopped"))

    async def _exhausted(self, exc: BudgetExhaustedError) -> None:
        """A budget is spent: the turn ends as a stop does, saying which."""
        turn = self.turn
        turn.emit(
            BudgetExhausted(
                scope=exc.scope,
                kind=exc.kind,
                spent=exc.spent,
                limit=exc.limit,
                message=str(exc),
                held=exc.held,
            )
        )
        text = await self._save_partial(durable=False, stopped=True, budget=str(exc))
        await self.end(self.stream_end(text, reason="budget_exhausted"))

    async def _failed(self, exc: LLMError) -> None:
        self.turn.emit(ErrorEvent(message=str(exc), code=exc.code))
        # Calls under way only when a sub-agent's backend failed (tool_executor.py): the
        # call that met the error and its neighbours in a batch, all stopped by it.
        unfinished = ToolResult.fail(f"not finished: the turn ended on an LLM error: {exc}")
        text = await self._save_partial(error=str(exc), unfinished=unfinished)
        await self.end(self.stream_end(text, reason="error"))

    async def _too_large(self, exc: ContextTooLargeError) -> None:
        turn = self.turn
        text = (
            f"I can't go on with this conversation: it needs ~{exc.tokens} tokens but the "
            f"model's window allows {exc.limit}. Compact it with `navi compact --session "
            f"{turn.state.id}` (or /compact in a chat), or start a new session."
        )
        turn.emit(TextDelta(text))
        # Display only: adding it to the context would make the context larger still.
        turn.state.add({"role": "assistant", "content": text, "synthetic": True}, context=False)
        await shielded(self.save)
        await self.end(self.stream_end(text, reason="context_too_large"))


def _assistant(reply: StreamedReply, **extra: Any) -> dict[str, Any]:
    """The stored assistant message of a reply; one cut by the output limit says so."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, **extra}
    if reply.thinking:
        message["thinking"] = reply.thinking_text
    if reply.done is not None and reply.done.done_reason == "length":
        message["cut"] = "length"
    return message


def _note(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


async def shielded(fn: Callable[[], Awaitable[None]], seconds: float = 10.0) -> None:
    """Clean-up that must finish: shielded from the stop, bounded by its own deadline."""
    with trio.move_on_after(seconds, shield=True):
        await fn()
