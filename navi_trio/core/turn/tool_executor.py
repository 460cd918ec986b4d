"""Running the model's tool calls: inline, in a parallel batch, or detached.

`ToolExecutor.execute_one` is the one place a tool call turns into a `ToolResult`: bad
arguments, an unknown tool or a tool that raises become a failed result the model can
read. Only a backend-level LLM error (a sub-agent's) passes, and ends the turn. A call
with ``"background": true`` is detached to the TaskSupervisor here, so it works the
same for sub-agents. Before a call runs the policy decides (an ask waits for its
approval), a checkpoint is taken when the round may write, and the run's lease is
confirmed: a daemon replaced while it was paused runs no call more.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

import attrs
import trio

from navi_trio.caches import remember
from navi_trio.core.jobs import Job, TaskSupervisor
from navi_trio.core.turn.approvals import ApprovalBroker
from navi_trio.core.turn.checkpointing import RoundCheckpoints
from navi_trio.core.turn.hooks import TurnHooks
from navi_trio.core.turn.policy import CallFacts, Verdict, decide, summary, with_network
from navi_trio.errors import BudgetExhaustedError, LeaseLostError, LLMError, TaskRejectedError
from navi_trio.events import AgentEvent, ToolEvent, ToolResultEvent, ToolStarted
from navi_trio.llm.base import ToolCall
from navi_trio.settings import Settings
from navi_trio.tools.args import schema_problem
from navi_trio.tools.base import Tool, ToolContext, ToolRegistry, ToolResult, tool_schema

STOPPED_TEXT = "stopped by the user"
MAX_SCHEMAS = 1024  # kept schemas (`ToolExecutor.schemas`); past it they are made anew
NO_HOOKS = TurnHooks()
BACKGROUND_HINT = (
    "The call is running in the background — continue with other work. Collect the result "
    "with the tasks tool (check / wait) or from the completion note on your next turn."
)

BACKGROUND_PARAM = {
    "type": "boolean",
    "description": (
        "true: run detached and get a task_id at once; keep working and collect the "
        "result with the tasks tool (manual:tasks)"
    ),
}

Publish = Callable[[AgentEvent], None]


def _nothing(_: object) -> None:
    return None


def stopped_result() -> ToolResult:
    return ToolResult.fail(STOPPED_TEXT)


def tool_message(call: ToolCall, result: ToolResult) -> dict[str, Any]:
    """The role=tool message that pairs an assistant tool call with its result."""
    return {
        "role": "tool",
        "tool_call_id": call.id,
        "name": call.name,
        "content": result.content(),
        "ok": result.ok,
    }


@attrs.define(eq=False)
class ToolExecutor:
    registry: ToolRegistry
    settings: Settings
    supervisor: TaskSupervisor | None
    approvals: ApprovalBroker | None = None
    checkpoints: RoundCheckpoints | None = None
    confirm: Callable[[], Awaitable[None]] | None = None  # the run's lease, before each call

    # The schemas made so far (`schemas`), by what makes one: kept so that every round
    # of a turn offers the very same dicts, whose JSON the backend encodes once.
    _made: dict[tuple[Any, ...], tuple[dict[str, Any], dict[str, Any]]] = attrs.field(
        factory=dict, init=False
    )

    def schemas(
        self, tools: Sequence[Tool], hidden: Callable[[str, str], bool] = lambda t, a: False
    ) -> list[dict[str, Any]]:
        """Function schemas for the model; backgroundable tools offer ``background``; an
        action `hidden(tool, action)` says is denied outright is not offered (nor a tool
        left with no action). `hidden` is asked every time (a grant may go); the same
        tool with the same actions kept gets the same dict as before (never edit one)."""
        out = []
        for tool in tools:
            params = tool.parameters
            action = params.get("properties", {}).get("action")
            offered = action.get("enum") if isinstance(action, dict) else None
            kept: list[Any] | None = None
            shown: tuple[int, ...] | None = None  # which of the actions are offered
            if isinstance(offered, list):
                shown = tuple(i for i, a in enumerate(offered) if not hidden(tool.name, str(a)))
                if not shown:
                    continue
                kept = [offered[i] for i in shown]
            background = self._backgroundable(tool)
            # The parameters by identity (kept alive in the entry): a tool's schema is
            # replaced, never edited, when it changes (an MCP server's, a client's).
            key = (tool.name, tool.description, id(params), shown, background)
            made = self._made.get(key)
            if made is None or made[0] is not params:
                made = (params, self._schema(tool, kept, background))
                remember(self._made, key, made, MAX_SCHEMAS)
            out.append(made[1])
        return out

    def _schema(self, tool: Tool, kept: list[Any] | None, background: bool) -> dict[str, Any]:
        schema = tool_schema(tool)
        params = schema["function"]["parameters"]
        if kept is not None:
            action = params["properties"]["action"]
            if kept != action["enum"]:
                properties = {**params["properties"], "action": {**action, "enum": kept}}
                schema["function"]["parameters"] = {**params, "properties": properties}
        if background:
            params = schema["function"]["parameters"]
            schema["function"]["parameters"] = {
                **params,
                "properties": {**params.get("properties", {}), "background": BACKGROUND_PARAM},
            }
        return schema

    def _backgroundable(self, tool: Tool) -> bool:
        # An MCP server's tools are when its entry says `background: true`.
        return tool.name in self.settings.backgroundable_tools or bool(
            getattr(tool, "backgroundable", False)
        )

    def _wants_background(self, call: ToolCall, tool: Tool) -> bool:
        if call.arguments.get("background") is not True:
            return False
        if not self._backgroundable(tool):
            return False
        # Only terminal "run" is detached: "open" keeps its own meaning of background (a
        # persistent process), and read/write/kill/list answer at once anyway.
        return call.name != "terminal" or call.arguments.get("action") == "run"

    async def execute_one(
        self,
        call: ToolCall,
        ctx: ToolContext,
        allowed: Sequence[str],
        publish: Publish,
        hooks: TurnHooks = NO_HOOKS,
    ) -> ToolResult:
        """Run one call (ToolStarted is emitted by the caller) and emit its ToolResult."""
        started = time.monotonic()
        result = await self._execute(call, ctx, allowed, publish, hooks)
        publish(
            ToolResultEvent(
                call_id=call.id,
                name=call.name,
                ok=result.ok,
                output=result.output,
                error=result.error,
                duration_ms=int((time.monotonic() - started) * 1000),
            )
        )
        return result

    async def _execute(
        self,
        call: ToolCall,
        ctx: ToolContext,
        allowed: Sequence[str],
        publish: Publish,
        hooks: TurnHooks,
    ) -> ToolResult:
        if call.parse_error is not None:
            return ToolResult.fail(
                f"the arguments of {call.name} were not valid JSON ({call.parse_error}); "
                "the answer may have been cut off. Call the tool again with complete arguments."
            )
        tool = self.registry.get(call.name) if call.name in allowed else None
        if tool is None:
            return ToolResult.fail(
                f"unknown tool {call.name!r}; available tools: {', '.join(allowed) or 'none'}"
            )

        def emit(data: dict[str, Any]) -> None:
            publish(ToolEvent(call_id=call.id, name=call.name, data=data))

        call_ctx = attrs.evolve(ctx, call_id=call.id, emit=emit)
        args = dict(call.arguments)
        # The flag is the executor's, never the tool's (terminal open, which keeps its
        # own meaning of background, is persistent either way).
        args.pop("background", None)
        # A tool may refuse a call it can never run (ssh_exec: an unknown host) before
        # anyone is asked to approve it.
        precheck = getattr(tool, "precheck", None)
        early: ToolResult | None = precheck(args, call_ctx) if precheck else None
        if early is not None:
            return early
        hooked = await pre_tool(hooks, tool, args, call_ctx)
        if isinstance(hooked, ToolResult):
            return hooked
        args, hook_allowed = hooked
        # The policy sees the arguments as a hook left them.
        facts = CallFacts.of(call.name, args, ctx.roots(), ctx.cwd)
        verdict = decide(ctx.profile, ctx.user_role, ctx.mode, facts)
        if hook_allowed and verdict.decision == "ask":
            verdict = attrs.evolve(verdict, decision="allow", rule="a pre_tool hook allowed it")
        refused = await self._gate(call, args, call_ctx, facts, verdict, publish, hooks)
        if refused is not None:
            return refused
        if verdict.network:
            call_ctx = attrs.evolve(call_ctx, sandbox=with_network(call_ctx.sandbox))
        if self.confirm is not None and verdict.decision == "ask":
            await self.confirm()  # again: the approval may have waited long
        if self._wants_background(call, tool):
            return await self._detach(call, tool, args, call_ctx, allowed, hooks)
        async with self._calling(call, ctx, allowed):
            result = await run_tool(tool, args, call_ctx)
        await hooks.fire("post_tool", call_ctx, tool=tool.name, arguments=args, result=result)
        return result

    def _calling(
        self, call: ToolCall, ctx: ToolContext, allowed: Sequence[str]
    ) -> AbstractAsyncContextManager[None]:
        if self.checkpoints is None:
            return nullcontext()
        return self.checkpoints.calling(call, ctx, self.registry, allowed)

    async def _gate(
        self,
        call: ToolCall,
        args: dict[str, Any],
        ctx: ToolContext,
        facts: CallFacts,
        verdict: Verdict,
        publish: Publish,
        hooks: TurnHooks,
    ) -> ToolResult | None:
        """None when the policy lets the call run; else its failed result. Before an
        ask reaches a person, a permission_request hook may decide it."""
        if verdict.decision == "allow":
            return None
        decided = None
        if verdict.decision == "ask":
            decided = await hooks.fire(
                "permission_request", ctx, tool=call.name, arguments=args, rule=verdict.rule
            )
        if decided is not None and decided.decision == "allow":
            return None
        if verdict.decision == "deny":
            why = f"the tool policy denies it ({verdict.rule})"
        elif decided is not None and decided.decision in ("deny", "block"):
            why = f"a permission_request hook denied it: {decided.reason or 'no reason given'}"
        elif self.approvals is None:
            why = f"it needs approval ({verdict.rule}) and nobody can approve it here"
        else:
            outcome = await self.approvals.resolve(
                session_id=ctx.session_id,
                user_id=ctx.user_id,
                call_id=call.id,
                profile=ctx.profile,
                mode=ctx.mode,
                facts=facts,
                verdict=verdict,
                summary=summary(call.name, args),
                publish=publish,
                headless=ctx.headless,
            )
            if outcome.approved:
                return None
            why = outcome.why
        return ToolResult.fail(
            f"The call was not run: {why}. Go on without it, or tell the user what you "
            "need and why."
        )

    async def _detach(
        self,
        call: ToolCall,
        tool: Tool,
        args: dict[str, Any],
        ctx: ToolContext,
        allowed: Sequence[str],
        hooks: TurnHooks,
    ) -> ToolResult:
        if self.supervisor is None:
            return ToolResult.fail("Cannot run in background: background tasks are not available")
        if not ctx.can_detach:
            return ToolResult.fail(
                "Cannot run in background: this sub-agent belongs to no session that could "
                "receive the result. Run the call again without background."
            )

        # What the job keeps: never the foreground run's channel (it may be long gone
        # when the job speaks) nor the run itself (its history, its token totals) —
        # only the services that outlive the run, and its own copies of the run's held
        # folders (the run closes its own when it ends), closed when the job ends.
        held = await trio.to_thread.run_sync(ctx.held.dup) if ctx.held is not None else None
        kept = attrs.evolve(
            ctx,
            emit=_nothing,
            publish=_nothing,
            services=ctx.services.detached(held) if ctx.services is not None else None,
            held=held,
        )
        call_id = ctx.call_id

        async def runner(job: Job) -> ToolResult:
            def emit(data: dict[str, Any]) -> None:
                job.emit(ToolEvent(call_id=call_id, name=tool.name, data=data))

            try:
                async with self._calling(call, kept, allowed):
                    result = await run_tool(
                        tool, args, attrs.evolve(kept, emit=emit, publish=job.emit)
                    )
                await hooks.fire(
                    "task_done",
                    attrs.evolve(kept, publish=job.emit),
                    tool=tool.name,
                    arguments=args,
                    result=result,
                    task_id=job.task_id,
                )
            finally:
                if held is not None:
                    held.close()
            if result.data and isinstance(result.data.get("tokens"), int):
                job.tokens = result.data["tokens"]
            return result

        try:
            job = await self.supervisor.start(
                ctx.session_id,
                tool.name,
                args,
                runner,
                is_spawn=tool.name == "spawn_agent",
                user_id=ctx.user_id,
            )
        except BaseException as exc:
            if held is not None:
                held.close()  # no job took them
            if not isinstance(exc, TaskRejectedError):
                raise
            return ToolResult.fail(
                f"Cannot run in background: {exc}. Run the call again without "
                "background to do it inline."
            )
        payload = {
            "task_id": job.task_id,
            "tool": tool.name,
            "status": "running",
            "args_summary": job.args_summary,
            "hint": BACKGROUND_HINT,
        }
        return ToolResult.success(json.dumps(payload, ensure_ascii=False), **payload)


async def pre_tool(
    hooks: TurnHooks, tool: Tool, args: dict[str, Any], ctx: ToolContext
) -> ToolResult | tuple[dict[str, Any], bool]:
    """The pre_tool hooks' word on a call: its failed result when they deny it (or
    change its arguments into ones its schema refuses), else the arguments to run it
    with and whether a hook allowed it (an ask then runs without asking)."""
    answer = await hooks.fire("pre_tool", ctx, tool=tool.name, arguments=args)
    if answer.decision in ("deny", "block"):
        return ToolResult.fail(
            f"The call was not run: a pre_tool hook denied it: "
            f"{answer.reason or 'no reason given'}. Go on without it, or do it another way."
        )
    if answer.decision == "modify" and answer.arguments is not None:
        problem = schema_problem(tool.parameters, answer.arguments)
        if problem is not None:
            return ToolResult.fail(
                f"The call was not run: a pre_tool hook changed its arguments into ones "
                f"{tool.name} does not take ({problem})."
            )
        return answer.arguments, False
    return args, answer.decision == "allow"


async def run_tool(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Run a tool; an exception becomes the call's own failed result (Cancelled passes,
    and so does a backend-level LLM error: the backend failed, not the tool)."""
    try:
        result = await tool.execute(args, ctx)
    except LeaseLostError:
        raise  # the run was taken over: it ends, nothing more runs
    except Exception as exc:  # a tool's bug must not end the run
        if isinstance(exc, LLMError) and exc.backend_level:
            raise
        return ToolResult.fail(f"the tool {tool.name} raised {type(exc).__name__}: {exc}")
    if not isinstance(result, ToolResult):
        return ToolResult.fail(
            f"the tool {tool.name} returned {type(result).__name__}, not a result"
        )
    return result


async def execute_batch(
    executor: ToolExecutor,
    calls: Sequence[ToolCall],
    ctx: ToolContext,
    allowed: Sequence[str],
    publish: Publish,
    results: dict[int, ToolResult],
    *,
    parallel: bool,
    before: Callable[[str], Awaitable[None]] | None = None,
    hooks: TurnHooks = NO_HOOKS,
    confirmed: bool = False,
) -> None:
    """Run `calls`, filling the caller's `results` by index as each finishes.

    The caller owns `results`, so a stop mid-batch leaves it knowing which calls finished.
    `before` takes each call from the budget; a refused call and those after it do not run,
    and the error is raised once the started ones finished. With `parallel`, every
    ToolStarted goes out first, in call order, and the calls run in one nursery; a
    backend-level LLM error stops the others and is raised. `confirmed`: the write just
    before renewed the lease, so the first call needs no confirmation of its own."""
    waited = False
    if executor.checkpoints is not None:
        waited = await executor.checkpoints.before_round(
            calls, ctx, executor.registry, allowed, publish
        )
    confirm = executor.confirm
    confirmed = confirmed and not waited
    if parallel and len(calls) > 1:
        if confirm is not None and not confirmed:
            await confirm()  # once for the batch: its calls start together
        for call in calls:
            publish(ToolStarted(call_id=call.id, name=call.name, arguments=dict(call.arguments)))
        taken = len(calls)
        refused: BudgetExhaustedError | None = None
        if before is not None:
            for i, call in enumerate(calls):
                try:
                    await before(call.name)
                except BudgetExhaustedError as exc:
                    taken, refused = i, exc
                    break
        if refused is not None:
            _refuse(calls, taken, refused, results, publish)

        failed: dict[int, LLMError] = {}

        async def one(i: int, call: ToolCall) -> None:
            try:
                results[i] = await executor.execute_one(call, ctx, allowed, publish, hooks)
            except LLMError as exc:  # backend-level (run_tool): the turn ends with it
                failed[i] = exc
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for i, call in enumerate(calls[:taken]):
                nursery.start_soon(one, i, call)
        if failed:
            raise failed[min(failed)]
        if refused is not None:
            raise refused
        return
    for i, call in enumerate(calls):
        if confirm is not None and not (confirmed and i == 0):
            await confirm()
        publish(ToolStarted(call_id=call.id, name=call.name, arguments=dict(call.arguments)))
        if before is not None:
            try:
                await before(call.name)
            except BudgetExhaustedError as exc:
                _refuse(calls, i, exc, results, publish)
                raise
        results[i] = await executor.execute_one(call, ctx, allowed, publish, hooks)


def _refuse(
    calls: Sequence[ToolCall],
    start: int,
    exc: BudgetExhaustedError,
    results: dict[int, ToolResult],
    publish: Publish,
) -> None:
    """Calls `start` on were not run: each gets a result naming the budget spent."""
    for i in range(start, len(calls)):
        result = ToolResult.fail(f"not run: {exc}")  # which budget, how much of it is used
        results[i] = result
        publish(
            ToolResultEvent(
                call_id=calls[i].id,
                name=calls[i].name,
                ok=False,
                error=result.error,
                duration_ms=0,
            )
        )
