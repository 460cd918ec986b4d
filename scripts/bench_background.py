"""Benchmark background tool calls through the whole runtime.

    python scripts/bench_background.py [--sessions 5] [--calls 4] [--job-seconds 0.3]

A full runtime (SQLite file in a temp dir, session actors, TaskSupervisor) talks real
HTTP to the fake LLM server on 127.0.0.1. Every session gets one message; the model's
reply asks for `--calls` background calls (code_exec and terminal run, alternating,
each about `--job-seconds` long), so 5 x 4 = 20 background jobs run across 5 sessions
at once. A subscriber per session timestamps the frames it receives, and prints:

- submit latency: from the executor taking a background call to its synthetic
  ``{"task_id", "status": "running", ...}`` result (`ToolExecutor.execute_one`, timed by
  a wrapper), and from the call's tool_started frame to that tool_result frame at the
  subscriber;
- job end → task_update: from the tool returning inside its job (a thin timing wrapper
  around the real tool) to the ``task_update`` frame with the final state reaching the
  subscriber (note written to SQLite, then published out-of-band).

Bounded (fails after 120 s) and stops by itself. The profile allows one iteration, so
each turn makes exactly one LLM call and every reply of the looping script is the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from navi_trio.settings import Settings  # noqa: E402
from navi_trio.testing import SessionDriver, open_harness  # noqa: E402
from navi_trio.tools.base import Tool, ToolContext, ToolResult  # noqa: E402
from navi_trio.tools.code_exec import CodeExecTool  # noqa: E402
from navi_trio.tools.terminal import TerminalTool  # noqa: E402

LIMIT_SEC = 120.0


class TimedTool:
    """Wraps a tool and records, per (session, call id), when its execute returned."""

    def __init__(self, inner: Tool, ends: dict[tuple[str, str], float]) -> None:
        self.inner = inner
        self.name = inner.name
        self.description = inner.description
        self.parameters = inner.parameters
        self.ends = ends

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            return await self.inner.execute(args, ctx)
        finally:
            self.ends[(ctx.session_id, ctx.call_id)] = trio.current_time()


def time_executor(h: Any, spans: list[float]) -> None:
    """Time every `execute_one` of the runtime's ToolExecutor (this bench's calls are
    all background ones)."""
    executor = h.runtime.agent.parts.executor
    inner = executor.execute_one

    async def timed(*args: Any, **kwargs: Any) -> ToolResult:
        began = trio.current_time()
        try:
            result: ToolResult = await inner(*args, **kwargs)
        finally:
            spans.append(trio.current_time() - began)
        return result

    executor.execute_one = timed


def _reply(calls: int, seconds: float) -> dict[str, Any]:
    tool_calls = []
    for i in range(calls):
        if i % 2 == 0:
            code = f"import time\ntime.sleep({seconds})\nprint('job {i} done')"
            tool_calls.append(
                {"name": "code_exec", "arguments": {"code": code, "background": True}}
            )
        else:
            command = f"sleep {seconds}; echo job {i} done"
            tool_calls.append(
                {
                    "name": "terminal",
                    "arguments": {"action": "run", "command": command, "background": True},
                }
            )
    return {"tool_calls": tool_calls}


def _fmt(samples: list[float]) -> str:
    if not samples:
        return "n=0"
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    return (
        f"n={len(ms)} min={ms[0]:.2f} ms median={statistics.median(ms):.2f} ms "
        f"p95={p95:.2f} ms max={ms[-1]:.2f} ms"
    )


class SessionWatch:
    """Reads one session's frames, with their arrival times, until all jobs ended."""

    def __init__(self, driver: SessionDriver, calls: int) -> None:
        self.driver = driver
        self.calls = calls
        self.started: dict[str, float] = {}  # call id -> tool_started arrival
        self.submitted: dict[str, float] = {}  # call id -> synthetic tool_result arrival
        self.task_call: dict[str, str] = {}  # task id -> call id
        self.final: dict[str, tuple[str, float]] = {}  # task id -> (status, arrival)
        self.rejected: list[str] = []

    async def run(self) -> None:
        ended = False
        while not ended or len(self.final) < len(self.task_call):
            frame = await self.driver.next()
            now = trio.current_time()
            kind = frame["type"]
            if kind == "tool_started" and not frame["is_subagent"]:
                self.started[frame["call_id"]] = now
            elif kind == "tool_result" and not frame["is_subagent"]:
                self.submitted[frame["call_id"]] = now
                if frame["ok"]:
                    payload = json.loads(frame["output"])
                    self.task_call[payload["task_id"]] = frame["call_id"]
                else:
                    self.rejected.append(str(frame["error"]))
            elif kind == "task_update" and frame["status"] != "running":
                self.final[frame["task_id"]] = (frame["status"], now)
            elif kind == "stream_end" and not frame["is_subagent"]:
                ended = True


async def bench(sessions: int, calls: int, seconds: float) -> int:
    ends: dict[tuple[str, str], float] = {}
    spans: list[float] = []
    settings = Settings()
    tools: list[Tool] = [
        TimedTool(CodeExecTool(settings), ends),
        TimedTool(TerminalTool(settings), ends),
    ]
    profiles = {
        "bench": {
            "tools": {"agent": ["code_exec", "terminal"], "subagent": []},
            "max_iterations": 1,
            "think_enabled": False,
        }
    }
    jobs = sessions * calls
    with tempfile.TemporaryDirectory(prefix="navi-bench-bg-") as tmp:
        with trio.fail_after(LIMIT_SEC):
            async with open_harness(
                Path(tmp),
                replies=[_reply(calls, seconds)],
                loop=True,
                profiles=profiles,
                tools=tools,
                tasks_max_global=max(20, jobs),
                tasks_max_per_session=max(5, calls),
                tasks_rate_limit=max(10, calls),
            ) as h:
                time_executor(h, spans)
                watches = []
                for i in range(sessions):
                    driver = await h.session(f"bench-{i}")
                    watches.append(SessionWatch(driver, calls))
                began = time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for w in watches:
                        nursery.start_soon(w.run)
                        w.driver.send("hi", profile_id="bench")
                wall = time.perf_counter() - began

    submit: list[float] = []
    delivery: list[float] = []
    statuses: dict[str, int] = {}
    rejected: list[str] = []
    for w in watches:
        rejected += w.rejected
        for call_id, at in w.submitted.items():
            if call_id in w.started:
                submit.append(at - w.started[call_id])
        for task_id, (status, at) in w.final.items():
            statuses[status] = statuses.get(status, 0) + 1
            end = ends.get((w.driver.session_id, w.task_call[task_id]))
            if end is not None:
                delivery.append(at - end)

    print(
        f"background jobs: {sum(statuses.values())} of {jobs} finished {statuses}, "
        f"{len(rejected)} refused, {sessions} sessions, wall {wall:.2f} s"
    )
    print(f"submit latency, executor:             {_fmt(spans)}")
    print(f"submit latency, frames at a client:   {_fmt(submit)}")
    print(f"job end -> task_update at a client:   {_fmt(delivery)}")
    for reason in rejected[:3]:
        print(f"refused: {reason}")
    ok = not rejected and statuses.get("completed", 0) == jobs
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--calls", type=int, default=4, help="background calls per turn")
    parser.add_argument("--job-seconds", type=float, default=0.3)
    args = parser.parse_args()
    if args.sessions < 1 or args.calls < 1 or args.job_seconds < 0:
        parser.error("--sessions and --calls must be 1 or more, --job-seconds 0 or more")
    return trio.run(bench, args.sessions, args.calls, args.job_seconds)


if __name__ == "__main__":
    sys.exit(main())
