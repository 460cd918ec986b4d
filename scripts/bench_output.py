"""Benchmark: a tool call that prints a lot, end to end.

    python scripts/bench_output.py [--sizes 5000000,50000000] [--read-mb 300] [--limit 300]

For each size N, one turn whose model calls ``terminal run "yes | head -c N"`` (N
bytes of "y" lines: N/2 lines) runs through `agent.run_stream` — real HTTP to the
fake LLM server on 127.0.0.1, a real SQLite file in a temp dir — and every event is
serialised to JSON as ``navi run --events`` does. Each size runs in a fresh Python
process, so the peak RSS printed (``ru_maxrss``) is that run's own. Printed per size:
wall time of the turn, peak RSS, the number of events and of tool_event progress
events, and the length of the tool's result. Then the same figures for a filesystem
`read` of a file of `--read-mb` MB with no newline at all (0 skips it).

Bounded: each size has a time limit (`--limit` seconds, the child is killed past it).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from navi_trio.events import ToolEvent, ToolResultEvent, event_to_dict
from navi_trio.profiles import load_config
from navi_trio.settings import REPO_ROOT, Settings
from navi_trio.testing import open_harness
from navi_trio.testing.memkv import MemoryKV
from navi_trio.tools.base import ToolContext
from navi_trio.tools.filesystem import FilesystemTool


async def one(size: int) -> dict[str, float | int]:
    args = {"action": "run", "command": f"yes | head -c {size}"}
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "terminal", "arguments": args}]},
        {"text": "done"},
    ]
    events = progress = result_chars = 0
    with tempfile.TemporaryDirectory() as tmp:
        async with open_harness(Path(tmp), replies=replies) as h:
            started = time.perf_counter()
            async with h.runtime.agent.run_stream("s1", "hi") as stream:  # "hi": no planning call
                async for event in stream:
                    json.dumps(event_to_dict(event))  # what `navi run --events` does
                    events += 1
                    progress += isinstance(event, ToolEvent)
                    if isinstance(event, ToolResultEvent):
                        result_chars = len(event.output or event.error or "")
            seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "bytes": size,
        "seconds": round(seconds, 3),
        "peak_rss_mb": round(peak_mb, 1),
        "events": events,
        "tool_events": progress,
        "result_chars": result_chars,
    }


async def read_file(megabytes: int) -> dict[str, float | int]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = load_config(REPO_ROOT / "config" / "config.json")
        ctx = ToolContext(
            session_id="s1",
            session_dir=root,
            kv=MemoryKV(),
            settings=Settings.from_env({}, data_dir=root),
            profile=config.profile(config.default_profile),
            config=config,
        )
        with (root / "big.txt").open("wb") as fh:
            for _ in range(megabytes):
                fh.write(b"x" * 1_000_000)
        started = time.perf_counter()
        result = await FilesystemTool().execute({"action": "read", "path": "big.txt"}, ctx)
        seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "bytes": megabytes * 1_000_000,
        "seconds": round(seconds, 3),
        "peak_rss_mb": round(peak_mb, 1),
        "events": 0,
        "tool_events": 0,
        "result_chars": len(result.content()),
    }


def _child(args: list[str], limit: float, label: str) -> None:
    command = [sys.executable, __file__, *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        print(f"{label}: did not finish within {limit:g} s")
        return
    if done.returncode != 0:
        print(f"{label}: failed ({done.returncode}): {done.stderr[-500:]}")
        return
    r = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"{label}: {r['seconds']:.3f} s, peak RSS {r['peak_rss_mb']:.0f} MB, "
        f"{r['events']} events ({r['tool_events']} tool_event), "
        f"result {r['result_chars']} chars"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5000000,50000000")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds per size")
    parser.add_argument("--read-mb", type=int, default=300)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--read", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.one is not None:
        print(json.dumps(trio.run(one, opts.one)))
        return
    if opts.read is not None:
        print(json.dumps(trio.run(read_file, opts.read)))
        return
    for size in (int(s) for s in opts.sizes.split(",")):
        _child(["--one", str(size)], opts.limit, f"terminal run, {size:>9} bytes")
    if opts.read_mb:
        _child(["--read", str(opts.read_mb)], opts.limit, f"filesystem read, {opts.read_mb} MB")


if __name__ == "__main__":
    main()
