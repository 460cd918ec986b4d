"""A background job's record and its running marker.

`Job` is what the supervisor keeps of one job while it runs and after: its status, its
result, a ring of its live events. While it runs, a marker in kv "task_running" says so;
a marker of a job neither another process of this host nor a live daemon elsewhere runs
is a job the daemon lost.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from navi_trio.events import AgentEvent
from navi_trio.store.fence import pid_alive
from navi_trio.tools.base import ToolResult

RUNNING_SCOPE = "task_running"
RING_SIZE = 50
SPAWN_RING_SIZE = 200
ARGS_SUMMARY_MAX = 200
LOST_SUMMARY = "lost: the daemon stopped while it was running"


@attrs.define(eq=False)
class Job:
    """One background job. Touched only from trio tasks of the same run (no locks)."""

    task_id: str
    session_id: str
    tool: str
    args_summary: str
    is_spawn: bool
    status: str = "running"  # running | completed | failed | cancelled
    result: ToolResult | None = None
    error: str | None = None
    ring: collections.deque[AgentEvent] = attrs.field()
    dropped: int = 0
    done: trio.Event = attrs.field(factory=trio.Event)
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    started_at: float = 0.0
    finished_at: float | None = None
    tokens: int = 0
    slot: str | None = None  # its slot in the caps several daemons share (`start`)
    user_id: str | None = None  # who started it (the per-user cap)

    @ring.default
    def _ring_default(self) -> collections.deque[AgentEvent]:
        return collections.deque(maxlen=SPAWN_RING_SIZE if self.is_spawn else RING_SIZE)

    def emit(self, event: AgentEvent) -> None:
        """Record a live event; never blocks. A full ring drops its oldest event."""
        if self.ring.maxlen is not None and len(self.ring) >= self.ring.maxlen:
            self.dropped += 1
        self.ring.append(event)

    @property
    def finished(self) -> bool:
        return self.status != "running"


JobRunner = Callable[[Job], Awaitable[ToolResult]]


def summarize_args(args: dict[str, Any]) -> str:
    """json.dumps of the arguments (minus the background flag), capped for display."""
    shown = {k: v for k, v in args.items() if k != "background"}
    text = json.dumps(shown, ensure_ascii=False, default=str)
    if len(text) > ARGS_SUMMARY_MAX:
        text = text[: ARGS_SUMMARY_MAX - 1] + "…"
    return text


def job_summary(job: Job) -> str:
    """What the job's completion note says: its result, else its error."""
    if job.result is not None:
        return job.result.content()
    return job.error or ""


def running_marker(job: Job) -> dict[str, Any]:
    """The running marker of `job`: who runs it (pid, host) and what it is."""
    return {
        "session_id": job.session_id,
        "task_id": job.task_id,
        "tool": job.tool,
        "args_summary": job.args_summary,
        "is_spawn": job.is_spawn,
        "started": time.time(),  # wall time: `tasks list` on another daemon shows its age
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }


def on_a_live_machine(marker: dict[str, Any], live: set[tuple[int, str]] | None) -> bool:
    """The marker's job belongs to a live daemon of another host (`live`: of the cluster;
    None: nothing is known of other hosts, and their jobs count as lost, as before)."""
    host = marker.get("host")
    if live is None or host == socket.gethostname():
        return False
    return (marker.get("pid"), host) in live


def runs_in_another_process(marker: dict[str, Any]) -> bool:
    """The marker's job belongs to another live process on this host (same database)."""
    pid = marker.get("pid")
    return (
        isinstance(pid, int)
        and pid != os.getpid()
        and marker.get("host") == socket.gethostname()
        and pid_alive(pid)
    )


def task_info(
    task_id: str, tool: str, status: str, age_sec: float, session_id: str, args: str
) -> dict[str, Any]:
    """A job as the ``tasks`` reply lists it: one shape for this daemon's jobs
    (api/commands.py) and those other daemons run (core/cluster/owner_calls.py)."""
    return {
        "task_id": task_id,
        "tool": tool,
        "status": status,
        "age_sec": round(max(0.0, age_sec), 3),
        "session_id": session_id,
        "args": args,
    }
