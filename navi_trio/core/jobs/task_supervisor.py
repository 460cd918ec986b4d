"""The TaskSupervisor: the actor that owns every background job.

A tool call with ``"background": true`` is started by `submit` as a `Job` in the
supervisor's own nursery, outside any session's run: Stop on the session does not touch
it; only `cancel` (the `tasks cancel` action) cancels the job's own scope. A job's end
records its note, tells the session's clients (``task_update``) and deletes its running
marker, and only then sets `done`.

Caps (settings): running jobs per session, per user and globally, background sub-agents
per session, and submissions per session in a sliding window. Finished jobs are swept
lazily after `tasks_ttl_sec`, at most `tasks_keep_finished` kept per session.

Jobs die with the process; their running markers do not: on the next start, `run()`
turns each leftover marker into a "lost" note before it takes submissions, so the agent
does not wait for it forever. A marker of another live process on this host is left alone.
"""

from __future__ import annotations

import collections
import logging
import secrets
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

import attrs
import trio

from navi_trio.actor import NurseryHolder
from navi_trio.core.jobs.task_jobs import LOST_SUMMARY as LOST_SUMMARY
from navi_trio.core.jobs.task_jobs import RUNNING_SCOPE as RUNNING_SCOPE
from navi_trio.core.jobs.task_jobs import SPAWN_RING_SIZE as SPAWN_RING_SIZE
from navi_trio.core.jobs.task_jobs import Job as Job
from navi_trio.core.jobs.task_jobs import JobRunner as JobRunner
from navi_trio.core.jobs.task_jobs import (
    job_summary,
    on_a_live_machine,
    running_marker,
    runs_in_another_process,
    summarize_args,
)
from navi_trio.core.jobs.task_notes import JobNote, record_note
from navi_trio.errors import TaskRejectedError
from navi_trio.events import TaskUpdate
from navi_trio.settings import Settings
from navi_trio.store.fence import unfenced
from navi_trio.tools.base import KVStore, ToolResult

EXCERPT_MAX = 200
# Bookkeeping writes (marker, note) run shielded but must not hang a shutdown forever.
KV_DEADLINE_SEC = 10.0

log = logging.getLogger(__name__)


# Takes a finished job's note (core/triggers/wake.py `Waker.record`; else the store's kv).
NoteSink = Callable[[str, JobNote], Awaitable[None]]


@attrs.define(eq=False)
class TaskSupervisor(NurseryHolder):
    """Owns the nursery of background jobs; enforces caps; delivers results.

    `run` (NurseryHolder) holds the jobs' nursery until the daemon shuts down; the jobs
    are cancelled with it. Its start-up work (`on_start`) reports the jobs a previous
    process left running as lost."""

    _settings: Settings
    _kv: KVStore
    _publish: Callable[[str, TaskUpdate], None]
    # Where a finished job's note goes: the store (record_note), or the waker that also
    # wakes the session.
    _notes: NoteSink | None = None
    # session id -> task id -> job, in submit order.
    _jobs: dict[str, dict[str, Job]] = attrs.field(factory=dict, init=False)
    # session id -> trio times of accepted submissions inside the rate window.
    _submits: dict[str, collections.deque[float]] = attrs.field(factory=dict, init=False)
    # The caps counted for every daemon of a shared store, if any.
    shared: SharedSlots | None = attrs.field(default=None, init=False)
    # False on a shared store: the cluster reports lost jobs, knowing who is alive.
    lost_at_start: bool = attrs.field(default=True, init=False)

    async def on_start(self) -> None:
        if self.lost_at_start:
            await self.report_lost_jobs()

    async def report_lost_jobs(self, live: set[tuple[int, str]] | None = None) -> int:
        """Turn running markers left by a dead process into completion notes; how many.

        At start-up, and on a shared store every so often with `live` the (pid, host) of
        the daemons alive on other machines: their jobs are not lost."""
        try:
            markers = await self._kv.kv_list(RUNNING_SCOPE)
        except Exception:
            log.exception("could not read leftover background task markers")
            return 0
        lost = 0
        for key, marker in markers:
            info = marker if isinstance(marker, dict) else {}
            mine = self._jobs.get(str(info.get("session_id")), {}).get(str(info.get("task_id")))
            if mine is not None:
                continue  # one of this supervisor's own jobs
            if runs_in_another_process(info) or on_a_live_machine(info, live):
                continue  # another navi process on this DB runs it: not lost
            lost += 1
            session_id = str(info.get("session_id") or key.partition(":")[0])
            task_id = str(info.get("task_id") or key.rpartition(":")[2])
            args = str(info.get("args_summary") or "")
            try:
                # Through the note sink, as a job that ends here: a session whose profile
                # wakes on a finished job is woken by a lost one too.
                await self._note_sink()(
                    session_id,
                    JobNote(
                        task_id=task_id,
                        tool=str(info.get("tool") or "?"),
                        status="failed",
                        summary=f"{LOST_SUMMARY} {args}".strip(),
                    ),
                )
                await self._kv.kv_delete(RUNNING_SCOPE, key)
            except Exception:
                log.exception("could not report lost background task %s", key)
        return lost

    def submit(
        self,
        session_id: str,
        tool: str,
        args: dict[str, Any],
        runner: JobRunner,
        *,
        is_spawn: bool = False,
        user_id: str | None = None,
    ) -> Job:
        """Start `runner` as a background job of `user_id`, or raise TaskRejectedError
        with the reason."""
        if not self.running:
            raise TaskRejectedError("the task supervisor is not running")
        self._sweep()
        self._check_caps(session_id, is_spawn, user_id)
        now = trio.current_time()
        job = Job(
            task_id=self._new_task_id(),
            session_id=session_id,
            tool=tool,
            args_summary=summarize_args(args),
            is_spawn=is_spawn,
            started_at=now,
            user_id=user_id,
        )
        self._jobs.setdefault(session_id, {})[job.task_id] = job
        self._submits.setdefault(session_id, collections.deque()).append(now)
        self.nursery.start_soon(self._run_job, job, runner, name=f"background {job.task_id}")
        return job

    async def start(
        self,
        session_id: str,
        tool: str,
        args: dict[str, Any],
        runner: JobRunner,
        *,
        is_spawn: bool = False,
        user_id: str | None = None,
    ) -> Job:
        """`submit`, with the caps also counted across daemons when the store is shared:
        the global, per-user, per-session and sub-agent caps and the per-session rate
        limit hold for the whole cluster (a slot per job in the store, given back when it
        ends)."""
        shared = self.shared
        if shared is None:
            return self.submit(session_id, tool, args, runner, is_spawn=is_spawn, user_id=user_id)
        s = self._settings
        claims = [("*", s.tasks_max_global), (f"s:{session_id}", s.tasks_max_per_session)]
        if user_id is not None:
            claims.append((f"u:{user_id}", s.tasks_max_per_user))
        if is_spawn:
            claims.append((f"spawn:{session_id}", s.tasks_max_spawn))
        rate = (f"s:{session_id}", s.tasks_rate_limit, s.tasks_rate_window_sec)
        key, full = await shared.take("task", claims, rate)
        if full is not None:
            raise TaskRejectedError(_shared_refusal(full, s))
        try:
            job = self.submit(session_id, tool, args, runner, is_spawn=is_spawn, user_id=user_id)
        except BaseException:
            await shared.free(key)
            raise
        job.slot = key
        return job

    def list_jobs(self, session_id: str) -> list[Job]:
        self._sweep()
        return list(self._jobs.get(session_id, {}).values())

    def get(self, session_id: str, task_id: str) -> Job | None:
        """The job, or None when unknown, swept, or another session's."""
        self._sweep()
        return self._jobs.get(session_id, {}).get(task_id)

    # The timeout is part of the call (the tool's `timeout` argument, capped here), not a
    # deadline the caller could express with a cancel scope of its own.
    async def wait(self, session_id: str, task_id: str, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait for the job to finish; True if it did. `timeout` is capped at the max."""
        job = self.get(session_id, task_id)
        if job is None:
            raise LookupError(f"no task {task_id} in this session")
        limit = min(max(float(timeout), 0.0), self._settings.tasks_wait_max_sec)
        with trio.move_on_after(limit):
            await job.done.wait()
        return job.done.is_set()

    def cancel(self, session_id: str, task_id: str) -> bool:
        """Cancel the job's own scope; False if unknown, another session's, or finished."""
        job = self.get(session_id, task_id)
        if job is None or job.finished:
            return False
        job.cancel_scope.cancel()
        return True

    def cancel_users(self, user_ids: set[str]) -> int:
        """These users were removed: cancel every job one of them started (it ends as
        cancelled, its note says so); how many."""
        cancelled = 0
        for jobs in self._jobs.values():
            for job in jobs.values():
                if job.user_id in user_ids and not job.finished:
                    job.cancel_scope.cancel()
                    cancelled += 1
        return cancelled

    def running_count(self, session_id: str | None = None) -> int:
        if session_id is None:
            sessions = list(self._jobs.values())
        else:
            sessions = [self._jobs.get(session_id, {})]
        return sum(1 for jobs in sessions for job in jobs.values() if not job.finished)

    def states(self) -> dict[str, int]:
        """How many jobs this process keeps, by status (running, completed, …)."""
        found: dict[str, int] = {}
        for jobs in self._jobs.values():
            for job in jobs.values():
                found[job.status] = found.get(job.status, 0) + 1
        return found

    def _check_caps(self, session_id: str, is_spawn: bool, user_id: str | None) -> None:
        s = self._settings
        total = self.running_count()
        if total >= s.tasks_max_global:
            raise TaskRejectedError(
                f"the daemon already runs {total} background tasks (tasks_max_global)"
            )
        if user_id is not None:
            theirs = sum(
                1
                for jobs in self._jobs.values()
                for job in jobs.values()
                if job.user_id == user_id and not job.finished
            )
            if theirs >= s.tasks_max_per_user:
                raise TaskRejectedError(
                    f"your sessions already run {theirs} background tasks (tasks_max_per_user)"
                )
        mine = self.running_count(session_id)
        if mine >= s.tasks_max_per_session:
            raise TaskRejectedError(
                f"this session already runs {mine} background tasks (tasks_max_per_session)"
            )
        if is_spawn:
            spawns = sum(
                1
                for job in self._jobs.get(session_id, {}).values()
                if job.is_spawn and not job.finished
            )
            if spawns >= s.tasks_max_spawn:
                raise TaskRejectedError(
                    f"this session already runs {spawns} background sub-agents (tasks_max_spawn)"
                )
        recent = self._submits.get(session_id, collections.deque())
        if len(recent) >= s.tasks_rate_limit:
            retry = max(recent[0] + s.tasks_rate_window_sec - trio.current_time(), 0.0)
            raise TaskRejectedError(
                f"this session started {len(recent)} background tasks in the last "
                f"{s.tasks_rate_window_sec:g} s (tasks_rate_limit); "
                f"a new one is possible in {retry:.0f} s"
            )

    def _sweep(self) -> None:
        """Drop finished jobs past their TTL or beyond the per-session keep count."""
        now = trio.current_time()
        ttl = self._settings.tasks_ttl_sec
        keep = max(self._settings.tasks_keep_finished, 0)
        for session_id in list(self._jobs):
            jobs = self._jobs[session_id]
            finished = sorted(
                (j.finished_at, j.task_id) for j in jobs.values() if j.finished_at is not None
            )
            expired = {tid for at, tid in finished if now - at >= ttl}
            alive = [tid for _, tid in finished if tid not in expired]
            expired.update(alive[: max(len(alive) - keep, 0)])
            for task_id in expired:
                del jobs[task_id]
            if not jobs:
                del self._jobs[session_id]
        window_start = now - self._settings.tasks_rate_window_sec
        for session_id in list(self._submits):
            times = self._submits[session_id]
            while times and times[0] <= window_start:
                times.popleft()
            if not times:
                del self._submits[session_id]

    def _new_task_id(self) -> str:
        taken = {tid for jobs in self._jobs.values() for tid in jobs}
        while True:
            task_id = "bt-" + secrets.token_hex(4)
            if task_id not in taken:
                return task_id

    async def _run_job(self, job: Job, runner: JobRunner) -> None:
        # The job is the daemon's, not the run's that started it: its writes (its note,
        # its marker, a background sub-agent's) carry no lease fence (store/fence.py).
        with unfenced():
            await self._run_job_unfenced(job, runner)

    async def _run_job_unfenced(self, job: Job, runner: JobRunner) -> None:
        marker_key = f"{job.session_id}:{job.task_id}"
        with trio.move_on_after(KV_DEADLINE_SEC, shield=True):
            await self._kv_quietly(self._kv.kv_set(RUNNING_SCOPE, marker_key, running_marker(job)))
        # "running" is told once the marker is written: a client that saw it may list the
        # session's tasks through another daemon, which knows the job by its marker only.
        self._notify(job)
        try:
            with job.cancel_scope:
                result = await runner(job)
        except Exception as exc:
            job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"
        except BaseException:
            # The supervisor itself is being cancelled (daemon shutdown): the marker stays,
            # so the next start reports the job as lost. Wake any waiter, then unwind.
            job.status, job.error = "cancelled", LOST_SUMMARY
            job.finished_at = trio.current_time()
            job.done.set()
            raise
        else:
            if job.cancel_scope.cancelled_caught:
                job.status, job.error = "cancelled", "cancelled by request (tasks cancel)"
            elif not isinstance(result, ToolResult):
                job.status = "failed"
                job.error = f"the job returned {type(result).__name__}, not a ToolResult"
            else:
                job.result = result
                job.status = "completed" if result.ok else "failed"
                job.error = None if result.ok else (result.error or "failed")
        await self._finish(job, marker_key)

    def _note_sink(self) -> NoteSink:
        """Where a job's note goes: the waker (it may wake the session), else the store."""
        if self._notes is not None:
            return self._notes
        return partial(record_note, self._kv, self._settings)

    async def _finish(self, job: Job, marker_key: str) -> None:
        job.finished_at = trio.current_time()
        with trio.move_on_after(KV_DEADLINE_SEC, shield=True):
            note = self._note_sink()
            await self._kv_quietly(
                note(
                    job.session_id,
                    JobNote(job.task_id, job.tool, job.status, job_summary(job), job.tokens),
                )
            )
            self._notify(job)
            await self._kv_quietly(self._kv.kv_delete(RUNNING_SCOPE, marker_key))
            if job.slot is not None and self.shared is not None:
                await self.shared.free(job.slot, keep=True)  # still counts for the rate
        job.done.set()

    async def _kv_quietly(self, op: Awaitable[None]) -> None:
        # A failing store must not take the supervisor (and every other job) down.
        try:
            await op
        except Exception:
            log.exception("background task bookkeeping failed")

    def _notify(self, job: Job) -> None:
        excerpt = ""
        if job.result is not None:
            excerpt = (job.result.output or job.result.error or "")[:EXCERPT_MAX]
        elif job.error:
            excerpt = job.error[:EXCERPT_MAX]
        event = TaskUpdate(
            task_id=job.task_id,
            tool=job.tool,
            status=job.status,
            args_summary=job.args_summary,
            error=job.error,
            result_excerpt=excerpt,
            subagent_tokens=job.tokens,
        )
        try:
            self._publish(job.session_id, event)
        except Exception:
            log.exception("publishing task_update for %s failed", job.task_id)


class SharedSlots(Protocol):
    """Slots counted for every daemon of a shared store (core/cluster/cluster.py `Cluster`)."""

    async def take(
        self, kind: str, claims: list[tuple[str, int]], rate: tuple[str, int, float] | None = None
    ) -> tuple[str, str | None]: ...
    async def free(self, key: str, *, keep: bool = False) -> None: ...


def _shared_refusal(full: str, s: Settings) -> str:
    if full == "*":
        return f"the daemons already run {s.tasks_max_global} background tasks (tasks_max_global)"
    if full.startswith("u:"):
        return (
            f"your sessions already run {s.tasks_max_per_user} background tasks "
            "(tasks_max_per_user)"
        )
    if full.startswith("spawn:"):
        return (
            f"this session already runs {s.tasks_max_spawn} background sub-agents (tasks_max_spawn)"
        )
    if full == "rate":
        return (
            f"this session started {s.tasks_rate_limit} background tasks in the last "
            f"{s.tasks_rate_window_sec:g} s (tasks_rate_limit); try again later"
        )
    return (
        f"this session already runs {s.tasks_max_per_session} background tasks "
        "(tasks_max_per_session)"
    )
