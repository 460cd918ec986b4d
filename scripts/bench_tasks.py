"""Benchmark the TaskSupervisor: submit latency and delivery latency.

Runs a supervisor on a real SQLite store in a temp dir, submits 20 background jobs
across 5 sessions (runner: a short trio.sleep, then a ToolResult) and prints:

- submit latency: how long the synchronous `submit()` takes;
- job end → note written: from the runner returning to the completion note's kv_set
  returning (the store's worker thread round trip);
- job end → task_update: from the runner returning to the publish callback (after the
  note is written, by design: a client told "completed" can already drain the note).

Bounded (fails after 60 s) and stops by itself::

    python scripts/bench_tasks.py [--jobs 20] [--sessions 5] [--memory]

``--memory`` uses an in-memory KV instead of SQLite, to separate the supervisor's own
cost from the store's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from navi_trio.core.jobs import NOTES_SCOPE, Job, TaskSupervisor
from navi_trio.events import TaskUpdate  # noqa: E402
from navi_trio.settings import Settings  # noqa: E402
from navi_trio.testing.memkv import MemoryKV  # noqa: E402
from navi_trio.tools.base import KVStore, ToolResult  # noqa: E402


class TimedKV:
    """Wraps a KV store and records when each note write returned, per task id."""

    def __init__(self, inner: KVStore) -> None:
        self.inner = inner
        self.note_written: dict[str, float] = {}

    async def kv_get(self, scope: str, key: str) -> Any | None:
        return await self.inner.kv_get(scope, key)

    async def kv_set(self, scope: str, key: str, value: Any) -> None:
        await self.inner.kv_set(scope, key, value)
        if scope == NOTES_SCOPE:
            self.note_written[str(value["task_id"])] = time.perf_counter()

    async def kv_delete(self, scope: str, key: str) -> None:
        await self.inner.kv_delete(scope, key)

    async def kv_list(self, scope: str, prefix: str = "") -> list[tuple[str, Any]]:
        return await self.inner.kv_list(scope, prefix)


def _stats(name: str, values_s: list[float]) -> str:
    us = sorted(v * 1e6 for v in values_s)
    p95 = us[min(len(us) - 1, round(0.95 * (len(us) - 1)))]
    return (
        f"{name:<28} n={len(us):<3} min={us[0]:9.1f}  median={statistics.median(us):9.1f}  "
        f"p95={p95:9.1f}  max={us[-1]:9.1f}  (µs)"
    )


async def bench(kv: KVStore, jobs: int, sessions: int, stagger: float) -> list[str]:
    timed = TimedKV(kv)
    published: dict[str, float] = {}
    all_final = trio.Event()
    ended: dict[str, float] = {}

    def publish(session_id: str, event: TaskUpdate) -> None:
        if event.status != "running":
            published[event.task_id] = time.perf_counter()
            if len(published) == jobs:
                all_final.set()

    async def runner(job: Job) -> ToolResult:
        await trio.sleep(0.01 + stagger * order[job.task_id])
        ended[job.task_id] = time.perf_counter()
        return ToolResult.success(f"job {job.task_id} done")

    # Caps are raised only as far as the run needs: 20 jobs over 5 sessions fits the
    # defaults (4 per session, 20 global); larger runs must not trip them.
    per_session = -(-jobs // sessions)
    settings = Settings(
        tasks_max_per_session=max(per_session, 5),
        tasks_max_global=max(jobs, 20),
        tasks_rate_limit=max(per_session, 10),
    )
    sup = TaskSupervisor(settings, timed, publish)
    submit_s: list[float] = []
    order: dict[str, int] = {}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            for i in range(jobs):
                t0 = time.perf_counter()
                job = sup.submit(
                    f"s-bench{i % sessions}", "terminal", {"command": f"job {i}"}, runner
                )
                submit_s.append(time.perf_counter() - t0)
                order[job.task_id] = i
                await trio.lowlevel.checkpoint()  # let jobs start as a real executor would
            await all_final.wait()
            nursery.cancel_scope.cancel()
    ids = sorted(ended)
    return [
        _stats("submit()", submit_s),
        _stats("job end -> note written", [timed.note_written[t] - ended[t] for t in ids]),
        _stats("job end -> task_update", [published[t] - ended[t] for t in ids]),
    ]


SCENARIOS = (
    ("staggered: jobs end 20 ms apart", 0.02),
    ("burst: all jobs end at once (one store thread serialises the writes)", 0.0),
)


async def main(args: argparse.Namespace) -> None:
    print(f"{args.jobs} background jobs across {args.sessions} sessions")
    for title, stagger in SCENARIOS:
        print(f"\n{title}")
        if args.memory:
            print("store: in-memory KV")
            lines = await bench(MemoryKV(), args.jobs, args.sessions, stagger)
        else:
            from navi_trio.store.sqlite import SQLiteStore

            with tempfile.TemporaryDirectory(prefix="navi-bench-") as tmp:
                db = Path(tmp) / "navi.db"
                print(f"store: SQLite {db}")
                async with SQLiteStore.open(db) as store:
                    lines = await bench(store, args.jobs, args.sessions, stagger)
        for line in lines:
            print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--memory", action="store_true", help="use an in-memory KV store")
    trio.run(main, parser.parse_args())
