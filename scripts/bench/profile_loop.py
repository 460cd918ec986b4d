"""Where navi_trio's tool-loop time goes: cProfile of the measured runs + store job counts.

    python scripts/bench/profile_loop.py --url URL [--mode inproc|ws] [--rounds 50] [--reps 6]
                                          [--steps | --count]

URL is a fake LLM server looping over `rounds` echo calls and a final text (run.py's
loop script; start one with ``python -m navi_trio.testing.fake_llm --loop --script F``).
The first run is a warm-up and not profiled. Prints the store jobs per round by kind and
the top functions of the main thread by its CPU time (`time.thread_time`: waits for the
socket or the store cost nothing; cProfile sees only the trio thread, and the store
worker thread's CPU is not in it). For both threads use
py-spy: ``py-spy record --threads -f raw -o out.txt -- python navi_runs.py loop ...``.

Two ways to count a round's work without cProfile's overhead on every call:

``--steps``: the trio thread's CPU of each task step (a trio instrument reads
`time.thread_time` around every step), keyed by the task and where it resumed and then
waited, per round; and the CPU outside any step (the scheduler, epoll). A round is a few
steps (the LLM request, its reads, a store job's answer), so this splits a round by the
waits that bound its parts.

``--count``: the Python calls per round on the trio thread (`sys.setprofile`; a
coroutine's resumption counts as a call), by module and by function, and the built-in
calls.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import sqlite3
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

import trio
from navi_runs import PROMPT, EchoTool, bench_runtime, ws_client, ws_daemon

from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing.harness import SessionDriver

T = TypeVar("T")


def _waits_at(task: trio.lowlevel.Task) -> str:
    """Where `task` waits: its innermost frame of navi_trio's (file:line), else its name."""
    coro: Any = task.coro
    found = ""
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        frame = frame or getattr(coro, "gi_frame", None)
        if frame is not None and "navi_trio" in frame.f_code.co_filename:
            found = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
        coro = coro or getattr(coro, "gi_yieldfrom", None)
    return found or task.name.rsplit(".", 1)[-1][:30]


class StepClock(trio.abc.Instrument):
    """`--steps`: CPU of each task step by (task, resumed at, waits at); CPU between."""

    def __init__(self) -> None:
        self.cpu: collections.defaultdict[tuple[str, str, str], float] = collections.defaultdict(
            float
        )
        self.steps: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.between = 0.0
        self._at: dict[trio.lowlevel.Task, str] = {}
        self._started = self._left = time.thread_time()
        self._from = "?"

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        now = time.thread_time()
        self.between += now - self._left
        self._started, self._from = now, self._at.get(task, "?")

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        now = time.thread_time()
        to = _waits_at(task)
        self._at[task] = to
        key = (task.name.rsplit(".", 1)[-1][:18], self._from, to)
        self.cpu[key] += now - self._started
        self.steps[key] += 1
        self._left = time.thread_time()

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self._at.pop(task, None)

    def report(self, rounds: int, cpu: float) -> None:
        inside = sum(self.cpu.values())
        print(
            f"trio thread CPU per round {cpu / rounds * 1e6:.0f} us: in task steps "
            f"{inside / rounds * 1e6:.0f} us, between them {self.between / rounds * 1e6:.0f} us"
        )
        print("  us/round  steps/round  task  resumed at -> waits at")
        for key, spent in sorted(self.cpu.items(), key=lambda kv: -kv[1])[:25]:
            task, start, end = key
            print(
                f"  {spent / rounds * 1e6:8.1f}  {self.steps[key] / rounds:11.2f}  "
                f"{task} {start} -> {end}"
            )


class CallCount:
    """`--count`: Python and built-in calls on the thread that set it, by function."""

    def __init__(self) -> None:
        self.calls: collections.Counter[tuple[str, int, str]] = collections.Counter()
        self.builtins: collections.Counter[str] = collections.Counter()

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            self.calls[(code.co_filename, code.co_firstlineno, code.co_name)] += 1
        elif event == "c_call":
            self.builtins[getattr(arg, "__qualname__", repr(arg))] += 1

    def report(self, rounds: int, top: int) -> None:
        total, built = sum(self.calls.values()), sum(self.builtins.values())
        print(f"calls per round: {total / rounds:.0f} Python, {built / rounds:.0f} built-in")
        modules: collections.Counter[str] = collections.Counter()
        for (path, _, _), n in self.calls.items():
            modules[_module(path)] += n
        print("--- Python calls per round by module")
        for name, n in modules.most_common(top):
            print(f"  {n / rounds:8.1f}  {name}")
        print("--- by function")
        for (path, line, name), n in self.calls.most_common(top):
            print(f"  {n / rounds:8.1f}  {_module(path)}:{line} {name}")
        print("--- built-in calls per round")
        for name, n in self.builtins.most_common(top):
            print(f"  {n / rounds:8.1f}  {name}")


def _module(path: str) -> str:
    """A short name for a code object's file: navi_trio's path, else the package."""
    if "navi_trio/" in path:
        return path.rsplit("navi_trio/", 1)[-1]
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0]
    return path.rsplit("/", 1)[-1]


async def main(a: argparse.Namespace) -> None:
    ops: collections.Counter[str] = collections.Counter()
    waits: collections.Counter[str] = collections.Counter()
    real_run = SQLiteStore._run

    async def counted(
        self: Any, op: str, fn: Callable[[sqlite3.Connection], T], **options: bool
    ) -> T:
        kind = op.split(" ")[0] + " " + (op.split(" ")[1] if " " in op else "")
        t0 = time.perf_counter()
        try:
            return await real_run(self, op, fn, **options)
        finally:
            ops[kind] += 1
            waits[kind] += int((time.perf_counter() - t0) * 1e6)

    SQLiteStore._run = counted  # type: ignore[method-assign]
    echo = EchoTool()
    prof = cProfile.Profile(time.thread_time)  # CPU of the trio thread, not waits
    async with bench_runtime(a.url, [echo]) as rt:

        async def one(i: int) -> None:
            echo.start()
            if a.mode == "inproc":
                actor = await rt.sessions.get(f"p-{i}")
                driver = SessionDriver(actor, actor.subscribe())
                driver.send(PROMPT)
                await driver.until_end()
                driver.subscription.close()
            else:
                sid = await client.start_session(PROMPT)
                await client.until_end(sid)

        async with ws_daemon(rt) as (url, token), ws_client(url, token) as client:
            await one(0)
            ops.clear()
            waits.clear()
            steps, count = StepClock(), CallCount()
            t0, cpu0 = time.perf_counter(), time.thread_time()
            if a.steps:
                trio.lowlevel.add_instrument(steps)
            elif a.count:
                sys.setprofile(count.hook)
            else:
                prof.enable()
            for i in range(1, a.reps + 1):
                await one(i)
            prof.disable()
            sys.setprofile(None)
            if a.steps:
                trio.lowlevel.remove_instrument(steps)
            wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    rounds = a.rounds * a.reps
    if a.steps or a.count:
        print(f"{a.mode}: {wall * 1000 / rounds:.2f} ms per round over {rounds} rounds")
        if a.steps:
            steps.report(rounds, cpu)
        else:
            count.report(rounds, a.top)
        return
    print(f"{a.mode}: {wall * 1000 / rounds:.2f} ms per round over {rounds} rounds (profiled)")
    print("store jobs per round (count, ms waited per round):")
    for kind, n in ops.most_common():
        print(f"  {n / rounds:6.2f}  {waits[kind] / 1000 / rounds:6.3f} ms  {kind}")
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(a.top)
        print(f"--- by {key} (main thread)")
        print("\n".join(out.getvalue().splitlines()[6:]))


def cli() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--mode", default="inproc", choices=["inproc", "ws"])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--top", type=int, default=35)
    how = p.add_mutually_exclusive_group()
    how.add_argument("--steps", action="store_true", help="CPU per task step, not cProfile")
    how.add_argument("--count", action="store_true", help="calls per round, not cProfile")
    trio.run(main, p.parse_args())


if __name__ == "__main__":
    cli()
