"""Benchmark the two session stores: one append + load round, SQLite against PostgreSQL.

Each round is what a turn does to its store: `append` one message to the history and the
context (durable, then not), and `load_session` (history + context, the repair check).
The SQLite store is a file in a temp folder (``synchronous=FULL``, the default); the
PostgreSQL store a database of a throwaway local server (navi_trio/testing/postgres.py)
started with fsync on, as in production, on 127.0.0.1. Prints the median and p95 of
each step in ms, and the rounds per second of `--sessions` sessions saving at once::

    python scripts/bench_store.py [--rounds 200] [--history 50] [--sessions 20]

`--history` messages are in the session before the rounds start (a load reads them all).
Bounded: every phase has a time limit and the script stops by itself.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from navi_trio.store.methods import SessionStore  # noqa: E402
from navi_trio.store.postgres import PostgresStore  # noqa: E402
from navi_trio.store.sqlite import SQLiteStore  # noqa: E402
from navi_trio.testing.postgres import PgServer, PgUnavailable  # noqa: E402

LIMIT_S = 300  # per store
PAD = "a line of a tool's output, about as long as real ones are. " * 8  # ~0.5 KB


def message(n: int) -> dict[str, Any]:
    return {"role": "user" if n % 2 else "assistant", "content": f"{n}: {PAD}"}


def ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"{statistics.median(ordered) * 1000:7.2f} / {p95 * 1000:7.2f}"


async def bench(
    name: str, opener: Callable[[], AbstractAsyncContextManager[SessionStore]], args: Any
) -> None:
    steps: dict[str, list[float]] = {"append": [], "append durable=False": [], "load_session": []}
    with trio.fail_after(LIMIT_S):
        async with opener() as store:
            sid = (await store.create_session(profile_id="bench")).id
            history = [message(n) for n in range(args.history)]
            await store.append(sid, messages=history, context=history)
            for n in range(args.rounds):
                for step, durable in (("append", True), ("append durable=False", False)):
                    t0 = time.perf_counter()
                    await store.append(sid, messages=[message(n)], context=[message(n)],
                                       durable=durable)  # fmt: skip
                    steps[step].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await store.load_session(sid)
                steps["load_session"].append(time.perf_counter() - t0)
            rate = await concurrent(store, args)
    print(f"{name}:")
    for step, samples in steps.items():
        print(f"  {step:22} {ms(samples)} ms (median / p95)")
    round_ms = sum(statistics.median(s) for s in steps.values()) * 1000
    print(f"  {'one round':22} {round_ms:7.2f} ms (sum of the medians)")
    print(f"  {args.sessions} sessions at once: {rate:7.0f} appends/s")


async def concurrent(store: SessionStore, args: Any) -> float:
    """Appends per second with `args.sessions` sessions saving in parallel."""
    sids = [(await store.create_session(profile_id="bench")).id for _ in range(args.sessions)]
    per = max(1, int(args.rounds) // 4)

    async def writer(sid: str) -> None:
        for n in range(per):
            await store.append(sid, messages=[message(n)], context=[message(n)])

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for sid in sids:
            nursery.start_soon(writer, sid)
    return len(sids) * per / (time.perf_counter() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--history", type=int, default=50)
    parser.add_argument("--sessions", type=int, default=20)
    args = parser.parse_args()
    args.rounds = max(1, min(args.rounds, 5000))
    print(f"{args.rounds} rounds on a session of {args.history} messages; "
          f"{args.sessions} concurrent sessions")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="navi-bench-store-") as folder:
        path = Path(folder) / "navi.db"
        trio.run(bench, "SQLite (synchronous=FULL)", lambda: SQLiteStore.open(path), args)
    try:
        server = PgServer.start(fast=False)
    except PgUnavailable as exc:
        print(f"PostgreSQL: skipped ({exc})")
        return 0
    try:
        url = server.create_database()
        trio.run(bench, "PostgreSQL (fsync on, 127.0.0.1)", lambda: PostgresStore.open(url), args)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
