"""TaskSupervisor: job lifecycle, caps, rate window, TTL sweep, wait, cancel, delivery,
and what survives a daemon restart.

Caps / rate window / TTL / wait tests run on the autojump clock with the in-memory KV
(tests/kvfake_tasks.py). The restart test on a real SQLite file runs on the real clock
(the store works on a thread) with an absolute timeout.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from kvfake_tasks import MemoryKV

from navi_trio.core.jobs import NOTES_SCOPE, RUNNING_SCOPE, Job, TaskSupervisor
from navi_trio.core.jobs.task_notes import drain_notes, pending_notes
from navi_trio.errors import TaskRejectedError
from navi_trio.events import AgentEvent, TaskUpdate, TextDelta
from navi_trio.settings import Settings
from navi_trio.tools.base import KVStore, ToolResult

Published = list[tuple[str, TaskUpdate]]


@asynccontextmanager
async def running_supervisor(
    settings: Settings | None = None, kv: KVStore | None = None
) -> AsyncIterator[tuple[TaskSupervisor, Published, KVStore]]:
    store: KVStore = kv if kv is not None else MemoryKV()
    published: Published = []
    sup = TaskSupervisor(settings or Settings(), store, lambda sid, ev: published.append((sid, ev)))
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        yield sup, published, store
        nursery.cancel_scope.cancel()


def after(seconds: float, output: str = "done") -> Callable[[Job], Awaitable[ToolResult]]:
    async def runner(job: Job) -> ToolResult:
        await trio.sleep(seconds)
        return ToolResult.success(output)

    return runner


def until(event: trio.Event, output: str = "done") -> Callable[[Job], Awaitable[ToolResult]]:
    async def runner(job: Job) -> ToolResult:
        await event.wait()
        return ToolResult.success(output)

    return runner


def finals(published: Published, task_id: str) -> list[TaskUpdate]:
    return [ev for _, ev in published if ev.task_id == task_id and ev.status != "running"]


async def test_a_job_runs_to_completion_and_is_delivered(autojump_clock: Any) -> None:
    async with running_supervisor() as (sup, published, kv):
        job = sup.submit(
            "s1",
            "terminal",
            {"action": "run", "command": "make test", "background": True},
            after(5, "PASS 42/42"),
        )
        assert re.fullmatch(r"bt-[0-9a-f]{8}", job.task_id)
        assert job.status == "running"
        assert job.args_summary == '{"action": "run", "command": "make test"}'
        await trio.testing.wait_all_tasks_blocked()
        assert published == [
            (
                "s1",
                TaskUpdate(
                    task_id=job.task_id,
                    tool="terminal",
                    status="running",
                    args_summary=job.args_summary,
                ),
            )
        ]
        assert await kv.kv_get(RUNNING_SCOPE, f"s1:{job.task_id}") is not None
        assert await sup.wait("s1", job.task_id, 60)
        # `done` is set only after the note is written and the marker deleted.
        notes = await pending_notes(kv, "s1")
        assert [(n["task_id"], n["status"], n["summary"]) for n in notes] == [
            (job.task_id, "completed", "PASS 42/42")
        ]
        assert await kv.kv_get(RUNNING_SCOPE, f"s1:{job.task_id}") is None
        assert job.status == "completed" and job.result == ToolResult.success("PASS 42/42")
        assert job.finished_at is not None and job.finished_at - job.started_at == pytest.approx(5)
        [final] = finals(published, job.task_id)
        assert final.status == "completed" and final.error is None
        assert final.result_excerpt == "PASS 42/42"
        assert published[-1][0] == "s1"


async def test_running_is_told_once_the_marker_is_written(autojump_clock: Any) -> None:
    # Another daemon lists a session's jobs from their markers: a client told "running"
    # may ask it at once, so the marker must be there first.
    kv = MemoryKV()
    marked_when_told: list[bool] = []

    def publish(sid: str, ev: TaskUpdate) -> None:
        if ev.status == "running":
            marked_when_told.append((RUNNING_SCOPE, f"{sid}:{ev.task_id}") in kv.data)

    sup = TaskSupervisor(Settings(), kv, publish)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        job = sup.submit("s1", "terminal", {"action": "run", "command": "x"}, after(5))
        assert await sup.wait("s1", job.task_id, 60)
        nursery.cancel_scope.cancel()
    assert marked_when_told == [True]


async def test_a_waiter_sees_the_note_already_written(autojump_clock: Any) -> None:
    async with running_supervisor() as (sup, _, kv):
        job = sup.submit("s1", "code_exec", {}, after(1, "42"))
        await job.done.wait()
        assert [n["task_id"] for n in await pending_notes(kv, "s1")] == [job.task_id]


async def test_runner_exception_fails_only_that_job(autojump_clock: Any) -> None:
    async def boom(job: Job) -> ToolResult:
        await trio.sleep(1)
        raise ValueError("disk on fire")

    async with running_supervisor() as (sup, published, kv):
        other = sup.submit("s1", "terminal", {}, after(3, "fine"))
        bad = sup.submit("s1", "terminal", {}, boom)
        await bad.done.wait()
        assert (bad.status, bad.error) == ("failed", "ValueError: disk on fire")
        assert finals(published, bad.task_id)[0].error == "ValueError: disk on fire"
        await other.done.wait()
        assert other.status == "completed"
        # The supervisor still takes work.
        again = sup.submit("s1", "terminal", {}, after(1))
        await again.done.wait()
        assert again.status == "completed"
        notes = {n["task_id"]: n for n in await pending_notes(kv, "s1")}
        assert notes[bad.task_id]["status"] == "failed"
        assert "ValueError: disk on fire" in notes[bad.task_id]["summary"]


async def test_a_failed_tool_result_fails_the_job(autojump_clock: Any) -> None:
    async def exit2(job: Job) -> ToolResult:
        return ToolResult.fail("exit code 2", output="make: *** Error 2")

    async with running_supervisor() as (sup, published, _):
        job = sup.submit("s1", "terminal", {}, exit2)
        await job.done.wait()
        assert (job.status, job.error) == ("failed", "exit code 2")
        [final] = finals(published, job.task_id)
        assert (final.status, final.error) == ("failed", "exit code 2")
        assert final.result_excerpt == "make: *** Error 2"


async def test_cancel_stops_only_that_job_and_reports_cancelled(autojump_clock: Any) -> None:
    async with running_supervisor() as (sup, published, kv):
        victim = sup.submit("s1", "terminal", {}, after(1000))
        bystander = sup.submit("s1", "terminal", {}, after(10))
        await trio.sleep(1)
        assert not sup.cancel("s2", victim.task_id)  # another session's job
        assert not sup.cancel("s1", "bt-00000000")  # unknown
        assert sup.cancel("s1", victim.task_id)
        await victim.done.wait()
        assert victim.status == "cancelled"
        assert trio.current_time() < 2
        assert not sup.cancel("s1", victim.task_id)  # already finished
        assert finals(published, victim.task_id)[0].status == "cancelled"
        note = {n["task_id"]: n for n in await pending_notes(kv, "s1")}[victim.task_id]
        assert note["status"] == "cancelled"
        assert await kv.kv_get(RUNNING_SCOPE, f"s1:{victim.task_id}") is None
        await bystander.done.wait()
        assert bystander.status == "completed"


async def test_stopping_the_submitting_run_does_not_touch_the_job(autojump_clock: Any) -> None:
    async with running_supervisor() as (sup, _, _kv):
        with trio.CancelScope() as run_scope:  # stands for a session's run
            job = sup.submit("s1", "terminal", {}, after(10, "survived"))
            run_scope.cancel()  # the user pressed Stop
            await trio.sleep(1)
        assert run_scope.cancelled_caught
        await job.done.wait()
        assert (job.status, job.result) == ("completed", ToolResult.success("survived"))


async def test_per_session_cap_refuses_with_the_reason(autojump_clock: Any) -> None:
    release = trio.Event()
    async with running_supervisor() as (sup, published, _):
        for _ in range(5):
            sup.submit("s1", "terminal", {}, until(release))
        n_published = len(published)
        with pytest.raises(TaskRejectedError) as err:
            sup.submit("s1", "terminal", {}, until(release))
        assert str(err.value) == (
            "this session already runs 5 background tasks (tasks_max_per_session)"
        )
        assert len(published) == n_published  # nothing published for a refusal
        assert sup.running_count("s1") == 5
        sup.submit("s2", "terminal", {}, until(release))  # other sessions are not affected
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert sup.running_count() == 0
        sup.submit("s1", "terminal", {}, after(1))  # room again once jobs finished


async def test_global_cap_refuses_across_sessions(autojump_clock: Any) -> None:
    release = trio.Event()
    async with running_supervisor() as (sup, _, _kv):
        for session in ("a", "b", "c", "d"):
            for _ in range(5):
                sup.submit(session, "terminal", {}, until(release))
        assert sup.running_count() == 20
        with pytest.raises(TaskRejectedError, match=r"tasks_max_global"):
            sup.submit("e", "terminal", {}, until(release))
        release.set()


async def test_background_sub_agent_cap(autojump_clock: Any) -> None:
    release = trio.Event()
    async with running_supervisor() as (sup, _, _kv):
        sup.submit("s1", "spawn_agent", {}, until(release), is_spawn=True)
        sup.submit("s1", "spawn_agent", {}, until(release), is_spawn=True)
        with pytest.raises(TaskRejectedError) as err:
            sup.submit("s1", "spawn_agent", {}, until(release), is_spawn=True)
        assert str(err.value) == (
            "this session already runs 2 background sub-agents (tasks_max_spawn)"
        )
        sup.submit("s1", "terminal", {}, until(release))  # other tools still allowed
        sup.submit("s2", "spawn_agent", {}, until(release), is_spawn=True)
        release.set()


async def test_rate_limit_window(autojump_clock: Any) -> None:
    async with running_supervisor() as (sup, _, _kv):
        for _ in range(10):
            job = sup.submit("s1", "terminal", {}, after(0))
            await job.done.wait()
        assert sup.running_count("s1") == 0  # only the rate limit is left to refuse
        with pytest.raises(TaskRejectedError, match=r"tasks_rate_limit") as err:
            sup.submit("s1", "terminal", {}, after(0))
        assert "10 background tasks in the last 300 s" in str(err.value)
        sup.submit("s2", "terminal", {}, after(0))  # per session
        await trio.sleep(299)
        with pytest.raises(TaskRejectedError, match=r"tasks_rate_limit"):
            sup.submit("s1", "terminal", {}, after(0))
        await trio.sleep(1.5)
        sup.submit("s1", "terminal", {}, after(0))


async def test_refused_submits_do_not_count_towards_the_rate(autojump_clock: Any) -> None:
    release = trio.Event()
    async with running_supervisor(Settings(tasks_max_per_session=1)) as (sup, _, _kv):
        sup.submit("s1", "terminal", {}, until(release))
        for _ in range(20):
            with pytest.raises(TaskRejectedError, match="tasks_max_per_session"):
                sup.submit("s1", "terminal", {}, until(release))
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        job = sup.submit("s1", "terminal", {}, after(0))  # the 2nd accepted of 10 allowed
        await job.done.wait()


async def test_finished_jobs_expire_after_the_ttl(autojump_clock: Any) -> None:
    async with running_supervisor() as (sup, _, _kv):
        job = sup.submit("s1", "terminal", {}, after(10))
        slow = sup.submit("s1", "terminal", {}, after(5000))
        await job.done.wait()
        await trio.sleep(3599)
        assert sup.get("s1", job.task_id) is job
        await trio.sleep(2)
        assert sup.get("s1", job.task_id) is None
        assert [j.task_id for j in sup.list_jobs("s1")] == [slow.task_id]  # running stays


async def test_at_most_keep_finished_jobs_per_session(autojump_clock: Any) -> None:
    settings = Settings(tasks_rate_limit=1000, tasks_keep_finished=50)
    async with running_supervisor(settings) as (sup, _, _kv):
        ids = []
        for _ in range(60):
            job = sup.submit("s1", "terminal", {}, after(1))
            ids.append(job.task_id)
            await job.done.wait()
        other = sup.submit("s2", "terminal", {}, after(1))
        await other.done.wait()
        assert [j.task_id for j in sup.list_jobs("s1")] == ids[-50:]
        assert sup.get("s2", other.task_id) is other


async def test_wait_times_out_at_the_cap(autojump_clock: Any) -> None:
    async with running_supervisor() as (sup, _, _kv):
        job = sup.submit("s1", "terminal", {}, after(10_000))
        start = trio.current_time()
        assert not await sup.wait("s1", job.task_id, 10_000)
        assert trio.current_time() - start == pytest.approx(120)
        start = trio.current_time()
        assert not await sup.wait("s1", job.task_id, 7)
        assert trio.current_time() - start == pytest.approx(7)
        quick = sup.submit("s1", "terminal", {}, after(3))
        assert await sup.wait("s1", quick.task_id, 100)
        assert trio.current_time() - start == pytest.approx(10)
        with pytest.raises(LookupError, match="no task"):
            await sup.wait("s2", job.task_id, 1)


async def test_get_and_list_are_session_scoped(autojump_clock: Any) -> None:
    async with running_supervisor() as (sup, _, _kv):
        mine = sup.submit("s1", "terminal", {}, after(5))
        theirs = sup.submit("s2", "terminal", {}, after(5))
        assert sup.get("s1", mine.task_id) is mine
        assert sup.get("s1", theirs.task_id) is None
        assert sup.list_jobs("s1") == [mine]
        assert sup.list_jobs("s3") == []


async def test_ring_drops_oldest_and_counts(autojump_clock: Any) -> None:
    async def chatty(job: Job) -> ToolResult:
        for i in range(260):
            job.emit(TextDelta(text=str(i)))
        job.tokens = 777
        return ToolResult.success("ok")

    async with running_supervisor() as (sup, published, _kv):
        plain = sup.submit("s1", "terminal", {}, chatty)
        spawn = sup.submit("s1", "spawn_agent", {}, chatty, is_spawn=True)
        await plain.done.wait()
        await spawn.done.wait()
        assert (len(plain.ring), plain.dropped) == (50, 210)
        assert [e.text for e in plain.ring if isinstance(e, TextDelta)][0] == "210"
        assert (len(spawn.ring), spawn.dropped) == (200, 60)
        assert finals(published, spawn.task_id)[0].subagent_tokens == 777


async def test_args_summary_is_capped(autojump_clock: Any) -> None:
    async with running_supervisor() as (sup, _, _kv):
        job = sup.submit("s1", "terminal", {"command": "x" * 1000}, after(0))
        assert 150 <= len(job.args_summary) <= 200
        assert job.args_summary.startswith('{"command": "xxx')


async def test_submit_before_start_is_refused() -> None:
    sup = TaskSupervisor(Settings(), MemoryKV(), lambda sid, ev: None)
    with pytest.raises(TaskRejectedError, match="not running"):
        sup.submit("s1", "terminal", {}, after(0))


async def test_a_broken_publish_or_store_does_not_kill_the_supervisor(autojump_clock: Any) -> None:
    kv = MemoryKV()
    kv.fail_scopes = {RUNNING_SCOPE, NOTES_SCOPE}
    calls: list[str] = []

    def bad_publish(session_id: str, event: AgentEvent) -> None:
        calls.append(session_id)
        raise RuntimeError("client gone")

    sup = TaskSupervisor(Settings(), kv, bad_publish)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        job = sup.submit("s1", "terminal", {}, after(1, "ok"))
        await job.done.wait()
        assert job.status == "completed" and calls == ["s1", "s1"]
        job2 = sup.submit("s1", "terminal", {}, after(1))
        await job2.done.wait()
        nursery.cancel_scope.cancel()


async def test_shutdown_mid_job_is_reported_as_lost_by_the_next_start(autojump_clock: Any) -> None:
    kv = MemoryKV()
    async with running_supervisor(kv=kv) as (sup, _, _kv):
        job = sup.submit("s1", "terminal", {"command": "make bench"}, after(10_000))
        finished = sup.submit("s1", "terminal", {}, after(1, "early result"))
        await finished.done.wait()
        await trio.sleep(5)
        assert kv.keys(RUNNING_SCOPE) == [f"s1:{job.task_id}"]
    # The old supervisor was cancelled: the job died with it, its waiter was woken.
    assert job.done.is_set() and job.status == "cancelled"
    assert kv.keys(RUNNING_SCOPE) == [f"s1:{job.task_id}"]
    async with running_supervisor(kv=kv):
        assert kv.keys(RUNNING_SCOPE) == []
        text = await drain_notes(kv, Settings(), "s1")
    assert text is not None
    assert f"- {finished.task_id} (terminal) completed: early result" in text
    assert (
        f"- {job.task_id} (terminal) failed: lost: the daemon stopped while it was running" in text
    )
    assert "make bench" in text


async def test_notes_and_lost_jobs_survive_a_restart_on_sqlite(tmp_path: Path) -> None:
    sqlite = pytest.importorskip("navi_trio.store.sqlite")
    db = tmp_path / "navi.db"
    settings = Settings()
    with trio.fail_after(20):
        async with sqlite.SQLiteStore.open(db) as store:
            async with running_supervisor(settings, store) as (sup, _, _kv):
                done = sup.submit("s1", "code_exec", {}, after(0, "answer 42"))
                started = trio.Event()

                async def hang(job: Job) -> ToolResult:
                    started.set()  # the runner starts only after the marker is written
                    await trio.sleep_forever()
                    raise AssertionError("unreachable")

                hung = sup.submit("s1", "terminal", {"command": "sleep 1000"}, hang)
                await done.done.wait()
                await started.wait()
                assert await store.kv_get(RUNNING_SCOPE, f"s1:{hung.task_id}") is not None
        async with sqlite.SQLiteStore.open(db) as store:  # a new process state
            async with running_supervisor(settings, store):
                text = await drain_notes(store, settings, "s1")
                assert await store.kv_list(RUNNING_SCOPE) == []
    assert text is not None
    assert f"- {done.task_id} (code_exec) completed: answer 42" in text
    assert f"- {hung.task_id} (terminal) failed: lost: the daemon stopped" in text
