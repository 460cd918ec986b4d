"""Where navi_trio's tool-loop time goes: cProfile of the measured runs + store job counts.

    python scripts/bench/profile_loop.py --url URL [--mode inproc|ws] [--rounds 50] [--reps 6]

URL is a fake LLM server looping over `rounds` echo calls and a final text (run.py's
loop script; start one with ``python -m navi_trio.testing.fake_llm --loop --script F``).
The first run is a warm-up and not profiled. Prints the store jobs per round by kind and
the top functions of the main thread by its CPU time (`time.thread_time`: waits for the
socket or the store cost nothing; cProfile sees only the trio thread, and the store
worker thread's CPU is not in it). For both threads use
py-spy: ``py-spy record --threads -f raw -o out.txt -- python navi_runs.py loop ...``.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

import trio
from navi_runs import PROMPT, EchoTool, bench_runtime, ws_client, ws_daemon

from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing.harness import SessionDriver

T = TypeVar("T")


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
            t0 = time.perf_counter()
            prof.enable()
            for i in range(1, a.reps + 1):
                await one(i)
            prof.disable()
            wall = time.perf_counter() - t0
    rounds = a.rounds * a.reps
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
    trio.run(main, p.parse_args())


if __name__ == "__main__":
    cli()
