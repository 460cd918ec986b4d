"""The `tasks` tool against a real TaskSupervisor (in-memory KV, autojump clock)."""

from __future__ import annotations

import json
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from kvfake_tasks import MemoryKV

from navi_trio.core.jobs import Job, TaskSupervisor
from navi_trio.events import TextDelta, ToolEvent, ToolStarted
from navi_trio.profiles import AgentProfile, NaviConfig
from navi_trio.settings import Settings
from navi_trio.tools.base import ToolContext, ToolResult, tool_schema
from navi_trio.tools.services import TaskService
from navi_trio.tools.tasks import TasksTool

TOOL = TasksTool()


def make_ctx(session_id: str, services: Any, settings: Settings | None = None) -> ToolContext:
    profile = AgentProfile(id="default")
    return ToolContext(
        session_id=session_id,
        session_dir=Path("/nonexistent") / session_id,
        kv=MemoryKV(),
        settings=settings or Settings(),
        profile=profile,
        config=NaviConfig(default_profile="default", profiles={"default": profile}),
        services=services,
    )


@asynccontextmanager
async def supervisor() -> AsyncIterator[TaskSupervisor]:
    sup = TaskSupervisor(Settings(), MemoryKV(), lambda sid, ev: None)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        yield sup
        nursery.cancel_scope.cancel()


def services(sup: TaskSupervisor) -> Any:
    service: TaskService = sup  # mypy checks that the supervisor fits the tool's Protocol
    return types.SimpleNamespace(tasks=service)


async def call(ctx: ToolContext, **args: Any) -> ToolResult:
    return await TOOL.execute(args, ctx)


def sleeper(seconds: float, output: str = "done") -> Any:
    async def runner(job: Job) -> ToolResult:
        await trio.sleep(seconds)
        return ToolResult.success(output)

    return runner


async def test_schema_and_description_point_to_the_manual() -> None:
    schema = tool_schema(TOOL)
    assert schema["function"]["name"] == "tasks"
    assert schema["function"]["parameters"]["properties"]["action"]["enum"] == [
        "list",
        "check",
        "wait",
        "cancel",
    ]
    assert "Manual: read `manual:tasks` with the filesystem tool." in TOOL.description
    json.dumps(schema)
    manual = Settings().manuals_dir / "tasks.md"
    assert manual.is_file() and "background" in manual.read_text()


async def test_list_shows_this_sessions_jobs_with_status_and_age(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        ctx = make_ctx("s1", services(sup))
        result = await call(ctx, action="list")
        assert result.ok and result.output == "No background tasks in this session."
        fast = sup.submit("s1", "terminal", {"command": "ls"}, sleeper(5))
        slow = sup.submit("s1", "code_exec", {"code": "x"}, sleeper(500))
        hidden = sup.submit("s2", "terminal", {}, sleeper(5))
        await trio.sleep(65)
        result = await call(ctx, action="list")
        assert result.ok
        lines = result.output.splitlines()
        assert lines[0] == "2 background task(s) in this session:"
        assert lines[1].startswith(f"- {fast.task_id} (terminal) completed, took 5s, ended 60s ago")
        assert '{"command": "ls"}' in lines[1]
        assert lines[2].startswith(f"- {slow.task_id} (code_exec) running, running for 65s")
        assert hidden.task_id not in result.output


async def test_check_shows_status_result_events_and_sub_agent_tokens(autojump_clock: Any) -> None:
    step = trio.Event()

    async def sub_agent(job: Job) -> ToolResult:
        job.emit(ToolStarted(call_id="c1", name="filesystem", arguments={"action": "read"}))
        for word in ("Looking ", "at ", "the ", "callers"):
            job.emit(TextDelta(text=word))
        job.emit(ToolEvent(call_id="c1", name="filesystem", data={"line": "found 3"}))
        job.tokens = 1234
        await step.wait()
        job.tokens = 2048
        return ToolResult.success("R" * 3000 + "THE END")

    async with supervisor() as sup:
        ctx = make_ctx("s1", services(sup))
        job = sup.submit("s1", "spawn_agent", {"task": "find callers"}, sub_agent, is_spawn=True)
        await trio.testing.wait_all_tasks_blocked()
        live = await call(ctx, action="check", task_id=job.task_id)
        assert live.ok
        assert live.output.startswith(f"task {job.task_id} (spawn_agent): running")
        assert "sub-agent tokens: 1234" in live.output
        assert "recent events (last 3 of 3):" in live.output
        assert '- tool_started {"call_id": "c1", "name": "filesystem"' in live.output
        assert "- text: Looking at the callers" in live.output
        assert '"line": "found 3"' in live.output
        step.set()
        await job.done.wait()
        final = await call(ctx, action="check", task_id=job.task_id)
        assert final.output.startswith(f"task {job.task_id} (spawn_agent): completed")
        assert "sub-agent tokens: 2048" in final.output
        result_text = final.output.split("result:\n", 1)[1].split("\nrecent events", 1)[0]
        assert len(result_text) <= 2000 + 40  # capped (plus the cut marker)
        assert result_text.endswith("THE END")


async def test_check_of_a_failed_job_shows_the_error(autojump_clock: Any) -> None:
    async def boom(job: Job) -> ToolResult:
        raise RuntimeError("no such host")

    async with supervisor() as sup:
        ctx = make_ctx("s1", services(sup))
        job = sup.submit("s1", "ssh_exec", {}, boom)
        await job.done.wait()
        result = await call(ctx, action="check", task_id=job.task_id)
        assert "failed" in result.output.splitlines()[0]
        assert "error: RuntimeError: no such host" in result.output
        assert "sub-agent tokens" not in result.output


async def test_wait_returns_the_result_when_the_job_ends(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        ctx = make_ctx("s1", services(sup))
        job = sup.submit("s1", "terminal", {}, sleeper(20, "PASS 42/42"))
        result = await call(ctx, action="wait", task_id=job.task_id)
        assert result.ok and "completed" in result.output and "PASS 42/42" in result.output
        assert trio.current_time() == pytest.approx(20)


async def test_wait_timeout_is_a_normal_failed_result(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        ctx = make_ctx("s1", services(sup))
        job = sup.submit("s1", "terminal", {}, sleeper(10_000))
        result = await call(ctx, action="wait", task_id=job.task_id)  # default 30 s
        assert not result.ok and result.error is not None
        assert result.error.startswith(f"wait_timeout: task {job.task_id} is still running")
        assert "continue with other work" in result.error
        assert trio.current_time() == pytest.approx(30)
        start = trio.current_time()
        result = await call(ctx, action="wait", task_id=job.task_id, timeout=999)
        assert not result.ok and trio.current_time() - start == pytest.approx(120)
        assert "after 120 s" in (result.error or "")


async def test_cancel_stops_a_running_job(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        ctx = make_ctx("s1", services(sup))
        job = sup.submit("s1", "terminal", {}, sleeper(10_000))
        result = await call(ctx, action="cancel", task_id=job.task_id)
        assert result.ok and result.output == f"task {job.task_id} (terminal) cancelled."
        assert job.status == "cancelled"
        again = await call(ctx, action="cancel", task_id=job.task_id)
        assert not again.ok and "already finished (cancelled)" in (again.error or "")


async def test_another_sessions_task_is_invisible_and_untouchable(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        owner = make_ctx("s1", services(sup))
        intruder = make_ctx("s2", services(sup))
        job = sup.submit("s1", "terminal", {}, sleeper(100, "secret"))
        for action in ("check", "wait", "cancel"):
            result = await call(intruder, action=action, task_id=job.task_id)
            assert not result.ok
            assert result.error is not None
            assert result.error.startswith(f"no task {job.task_id} in this session")
        unknown = await call(owner, action="check", task_id="bt-00000000")
        assert unknown.error is not None and unknown.error.startswith(
            "no task bt-00000000 in this session"
        )
        listing = await call(intruder, action="list")
        assert job.task_id not in listing.output
        assert job.status == "running"
        assert trio.current_time() < 1  # wait returned at once
        done = await call(owner, action="wait", task_id=job.task_id, timeout=120)
        assert done.ok and "secret" in done.output


async def test_bad_arguments_get_clear_errors(autojump_clock: Any) -> None:
    async with supervisor() as sup:
        ctx = make_ctx("s1", services(sup))
        bad_action = await call(ctx, action="kill")
        assert not bad_action.ok and "argument 'action' must be one of" in (bad_action.error or "")
        missing = await call(ctx, action="check")
        assert "argument 'task_id' is required" in (missing.error or "")
        job = sup.submit("s1", "terminal", {}, sleeper(5))
        for timeout in ("soon", -1, True):
            result = await call(ctx, action="wait", task_id=job.task_id, timeout=timeout)
            assert not result.ok and "'timeout'" in (result.error or "")


async def test_without_a_supervisor_the_tool_says_so() -> None:
    for svc in (None, types.SimpleNamespace(tasks=None)):
        result = await call(make_ctx("s1", svc), action="list")
        assert not result.ok and result.error == "background tasks are not available here"
