"""Benchmark: agent-loop overhead and stop latency.

    python scripts/bench_loop.py [--turns 200] [--stops 50]

Prints three figures, each over real HTTP to the fake LLM server on 127.0.0.1 and a
real SQLite file in a temp dir:

- turn overhead: wall time of a full turn (user message saved, context built, LLM
  streamed, answer saved, stream_end) for a one-word answer, minus nothing — the fake
  server answers instantly, so this is our cost plus loopback HTTP;
- tool-iteration overhead: the extra time of a turn with one `todo list` tool call;
- stop latency: from `RunControl.stop()` to `stream_end(stopped)` while the model is
  in prefill (the fake server holds its first chunk for 1000 s), and the time until the
  server sees the HTTP connection close.

Bounded: a fixed number of turns and stops, a 120 s overall limit.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import trio

from navi_trio.core.turn import RunControl
from navi_trio.events import StreamEnd
from navi_trio.testing import open_harness


def _fmt(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    return (
        f"n={len(ms)} min={ms[0]:.2f} ms median={statistics.median(ms):.2f} ms "
        f"p95={p95:.2f} ms max={ms[-1]:.2f} ms"
    )


async def _turns(
    tmp: Path, replies: list[dict[str, object]], turns: int, calls: int
) -> list[float]:
    """Time `turns` turns (10 sessions in rotation), each making `calls` LLM calls."""
    profiles = {"general": {"planning_enabled": False}}
    async with open_harness(tmp, replies=replies, loop=True, profiles=profiles) as h:
        agent = h.runtime.agent
        samples = []
        for i in range(turns):
            t0 = time.perf_counter()
            await agent.run(f"s-{i % 10}", "hi")  # "hi" is small talk: no planning
            samples.append(time.perf_counter() - t0)
        assert h.fake is not None
        made = len(h.fake.chat_requests)
        assert made == calls * turns, f"expected {calls * turns} LLM calls, got {made}"
        return samples


async def bench(turns: int, stops: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="navi-bench-"))
    with trio.fail_after(120):
        plain = await _turns(root / "plain", [{"text": "ok"}], turns, 1)
        print(f"turn (one LLM call, text answer): {_fmt(plain)}")
        call = {"name": "todo", "arguments": {"action": "list"}}
        todo: dict[str, object] = {"tool_calls": [call]}
        tooled = await _turns(root / "tool", [todo, {"text": "done"}], turns, 2)
        print(f"turn (tool call + answer, two LLM calls): {_fmt(tooled)}")

        async with open_harness(
            root / "stop", replies=[{"text": "never", "delay_first": 1000}], loop=True
        ) as h:
            agent = h.runtime.agent
            latency, disconnect = [], []
            for i in range(stops):
                control = RunControl()
                assert h.fake is not None
                seen = len(h.fake.disconnects)
                async with agent.run_stream(f"stop-{i % 10}", "hi", control=control) as events:
                    await h.fake.wait_requests(len(h.fake.requests) + 1)
                    await trio.sleep(0.005)  # let the request reach prefill
                    t0 = time.perf_counter()
                    control.stop()
                    async for event in events:
                        if isinstance(event, StreamEnd):
                            latency.append(time.perf_counter() - t0)
                await h.fake.wait_disconnects(seen + 1)
                disconnect.append(time.perf_counter() - t0)
            print(f"stop during prefill -> stream_end(stopped): {_fmt(latency)}")
            print(f"stop during prefill -> server saw the disconnect: {_fmt(disconnect)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--stops", type=int, default=50)
    args = parser.parse_args()
    trio.run(bench, args.turns, args.stops)


if __name__ == "__main__":
    main()
