"""Sessions per core: how many sessions streaming at 50 tokens/s one daemon core carries.

    python scripts/bench/per_core.py [--words 40] [--start 20] [--max 400] [--limit-ms 50]
    python scripts/bench/per_core.py --counts 40,80,160 [--phases]

conc.py's realistic load (a chunk every 20 ms: `--words` words of text, then one
``echo`` call; 10 rounds a session; SQLite; one daemon), run as conc.py runs it (its
`measure`, imported), with every process pinned: the daemon (all its threads) on core
0 with ``taskset -c 0``, the fake LLM and the client processes on core 1. The session
count rises (doubling from `--start`, then halving the step between the last count
that held and the first that did not, down to `--step`) until the p99 gap between two
frames of a session in flow (each session's first gap left out: the start, when all
ask at once) exceeds `--limit-ms`. Prints one JSON object: every run's figures and the
largest count that held. Core 1's own load is reported beside each run (the fake LLM's
and the clients' CPU over the wall time): near 1.0, the clients, not the daemon, are
what lags, and the count is a floor.

The gap in flow (the measure the count is held to) is also given in its two kinds, as
conc.py splits them: in a stream (word to word of one answer) and at a round's end (the
model's end of stream, the round's saves, the tool, the next request). ``--counts``
measures the given counts instead of searching; ``--phases`` adds conc.py's daemon
notes (the collector's pauses, the parts of a round end) to each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import conc  # noqa: E402  (beside this file)

DAEMON_CORE, OTHERS_CORE = "0", "1"
PER_CLIENT_PROC = 25
STAGGER_S = 1.0


def _pinned_spawn(args: list[str]) -> subprocess.Popen[str]:
    """conc.py's `_spawn`, under ``taskset``: the daemon on core 0, the rest on core 1.

    Client processes start a second apart, each with at most `PER_CLIENT_PROC` sessions:
    the daemon closes the oldest of more than 32 connections from one address that wait
    for their hello (NAVI_WS_PENDING_PER_ADDRESS), and a pinned daemon under load says
    hello to a burst more slowly than that.
    """
    core = DAEMON_CORE if args[:2] == ["conc.py", "daemon"] else OTHERS_CORE
    if args[:2] == ["conc.py", "clients"]:
        time.sleep(STAGGER_S)
    return subprocess.Popen(
        ["taskset", "-c", core, sys.executable, *args], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, cwd=HERE,
    )  # fmt: skip


def run(sessions: int, a: argparse.Namespace) -> dict[str, Any]:
    """One conc.py measurement of `sessions` sessions, pinned; its figures that count."""
    ns = argparse.Namespace(
        sessions=sessions, client_procs=max(a.client_procs, -(-sessions // PER_CLIENT_PROC)),
        timeout=a.timeout, py_spy="", sync="", pace="realistic", words=a.words,
        transport="", phases=a.phases, limit_ms=a.limit_ms,
    )  # fmt: skip
    r = conc.measure(ns)
    wall = r["seconds"]
    return {
        "sessions": sessions, "p99_gap_in_flow_ms": r["p99_gap_in_flow_ms"],
        "p99_gap_in_stream_ms": r["p99_gap_in_stream_ms"],
        "p99_gap_round_end_ms": r["p99_gap_round_end_ms"],
        "p50_gap_ms": r["p50_gap_ms"], "max_gap_ms": r["max_gap_ms"],
        "rounds": r["rounds"], "rounds_per_s": r["rounds_per_s"],
        "daemon_core_util": r["cpu_util"]["daemon"],
        "core1_util": (r["cpu_s"]["llm"] + r["cpu_s"]["clients"]) / wall,
        "cpu_ms_per_round": r["cpu_ms_per_round"], "errors": r["errors"][:3],
        "loadavg": [r["loadavg_start"], r["loadavg_end"]],
        "holds": not r["errors"] and r["p99_gap_in_flow_ms"] <= a.limit_ms,
        **({"phases": r["phases"]} if a.phases else {}),
    }  # fmt: skip


def counts(a: argparse.Namespace) -> dict[str, Any]:
    """``--counts``: each given count once, in order, no search."""
    runs = []
    for n in (int(c) for c in a.counts.split(",")):
        runs.append(run(n, a))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    return {"limit_ms": a.limit_ms, "words": a.words, "cores": os.cpu_count(), "runs": runs}


def search(a: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    good, bad = 0, 0
    n = a.start
    while n <= a.max:  # doubling until a count fails (bounded by --max)
        runs.append(run(n, a))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
        if not runs[-1]["holds"]:
            bad = n
            break
        good, n = n, n * 2
    while bad and bad - good > a.step:  # then halve the gap (bounded: log2 steps)
        n = (good + bad) // 2
        runs.append(run(n, a))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
        good, bad = (n, bad) if runs[-1]["holds"] else (good, n)
    return {
        "largest_that_holds": good, "first_that_failed": bad or None,
        "limit_ms": a.limit_ms, "words": a.words, "cores": os.cpu_count(),
        "pinned": {"daemon": DAEMON_CORE, "llm_and_clients": OTHERS_CORE}, "runs": runs,
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--words", type=int, default=40, help="words of text per round")
    p.add_argument("--start", type=int, default=20)
    p.add_argument("--max", type=int, default=400)
    p.add_argument("--step", type=int, default=10, help="stop halving below this gap")
    p.add_argument("--limit-ms", type=float, default=50.0)
    p.add_argument("--client-procs", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--counts", default="", help="these counts (40,80,160), no search")
    p.add_argument("--phases", action="store_true", help="the daemon's GC and round parts")
    a = p.parse_args()
    if (os.cpu_count() or 1) < 2:
        p.error("needs two cores: the daemon on one, the LLM and the clients on the other")
    if not 1 <= a.start <= a.max <= 2000:
        p.error(f"need 1 <= --start <= --max <= 2000, got {a.start} and {a.max}")
    try:
        given = [int(c) for c in a.counts.split(",")] if a.counts else []
    except ValueError:
        p.error(f"--counts: numbers separated by commas, got {a.counts!r}")
    if not all(1 <= n <= 2000 for n in given):
        p.error(f"--counts: each from 1 to 2000, got {a.counts!r}")
    conc._spawn = _pinned_spawn  # every process conc.measure starts, pinned
    print(json.dumps(counts(a) if given else search(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
