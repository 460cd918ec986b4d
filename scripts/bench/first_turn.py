"""The first turns of a fresh runtime: how long the trio thread stands still.

    python scripts/bench/first_turn.py [--sessions 20] [--repeat 5] [--cold]

A fresh runtime has not loaded the token encoding (cl100k, 0.1-1.4 s). `navi serve`
loads it on a worker thread before it listens (`Runtime.warm_up`), and so does this
bench by default; with ``--cold`` it does not (as `navi run`): the first turn loads it
on a worker thread, whose last ~70-130 ms hold the GIL and so stall the loop. Each
repeat opens a fresh runtime on a temp SQLite file with the fake LLM on 127.0.0.1 (in
this process), sends one message to each of `--sessions` sessions at once (an ``echo``
call, then an answer), and measures the longest gap of a task that asks to wake every
2 ms: the longest time the loop was held. Prints one JSON object: per repeat the longest
stall and the time until every turn ended, and their medians. Each repeat runs in a
process of its own (tiktoken keeps a loaded encoding for the process), with the module
imported before the runtime opens, so what is timed is the load of the encoding, not
the import.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from agent_tools import EchoTool, call, toolset, with_tools  # noqa: E402

from navi_trio.testing import open_harness  # noqa: E402

TICK = 0.002


async def _watch(stall: list[float], task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    while True:
        before = time.perf_counter()
        await trio.sleep(TICK)
        stall[0] = max(stall[0], time.perf_counter() - before - TICK)


async def one(sessions: int, cold: bool) -> dict[str, float]:
    replies = [call("echo", text="one"), {"text": "done"}]
    profiles = {"general": with_tools(["echo"], planning_first_message=False)}
    with tempfile.TemporaryDirectory() as tmp:
        async with open_harness(
            Path(tmp), replies=replies, loop=True, tools=toolset(EchoTool()), profiles=profiles
        ) as h:
            assert not h.runtime.agent.parts.counter.loaded
            if not cold:
                await h.runtime.warm_up()  # as navi serve, before it listens
            stall = [0.0]
            async with trio.open_nursery() as nursery:
                await nursery.start(_watch, stall)
                start = time.perf_counter()
                async with trio.open_nursery() as turns:
                    for i in range(sessions):
                        turns.start_soon(h.turn, f"s{i}", "echo one")
                took = time.perf_counter() - start
                nursery.cancel_scope.cancel()
            return {"max_stall_ms": round(stall[0] * 1000, 1), "all_turns_s": round(took, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--one", action="store_true", help="one repeat, in this process")
    parser.add_argument("--cold", action="store_true", help="no warm-up (as navi run)")
    args = parser.parse_args()
    if args.one:
        import tiktoken  # noqa: F401 -- the module, not the encoding: that is timed

        print(json.dumps(trio.run(one, args.sessions, args.cold)))
        return
    runs = []
    for _ in range(args.repeat):  # a process each: tiktoken caches a loaded encoding
        cmd = [sys.executable, __file__, "--one", "--sessions", str(args.sessions)]
        cmd += ["--cold"] if args.cold else []
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    out = {
        "sessions": args.sessions,
        "warm_up": not args.cold,
        "runs": runs,
        "median_max_stall_ms": statistics.median(r["max_stall_ms"] for r in runs),
        "median_all_turns_s": statistics.median(r["all_turns_s"] for r in runs),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
