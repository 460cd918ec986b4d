"""Benchmark: the planning parsers stay linear on hostile text.

    python scripts/bench_plan_parser.py [--size 50000]

Runs `parse_plan`, `parse_analysis` and `review_sections` on texts built to make a
backtracking regex take minutes (long whitespace runs, repeated tags) and prints the
time of each. A linear parser takes milliseconds; the script exits 1 when any text
takes longer than --limit seconds (default 2). This lived in the test suite as a
wall-clock assert, which depends on the machine: here it is a figure you read.
"""

from __future__ import annotations

import argparse
import sys
import time

from navi_trio.core.turn import parse_analysis, parse_plan, review_sections


def hostile_texts(size: int) -> dict[str, str]:
    pad = " " * size
    return {
        "spaces then x": pad + "x",
        "bullet, spaces": "- " + pad + "x",
        "tool, spaces, colon": "1. a tool" + pad + ":",
        "dash, spaces, self": "1. a -" + pad + "self x",
        "reflect, spaces": "reflect" + pad + "maybe",
        "think tags": "<think>" * (size // 2 or 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=50_000, help="length of each run")
    parser.add_argument("--limit", type=float, default=2.0, help="seconds allowed per text")
    args = parser.parse_args()
    worst = 0.0
    for name, text in hostile_texts(args.size).items():
        start = time.perf_counter()
        parse_plan(text)
        parse_analysis(text)
        review_sections(text)
        took = time.perf_counter() - start
        worst = max(worst, took)
        print(f"{name:24} {took * 1000:8.1f} ms")
    print(f"worst: {worst * 1000:.1f} ms (limit {args.limit * 1000:.0f} ms)")
    return 0 if worst <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
