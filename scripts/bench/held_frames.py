"""What the order of a lease's frames costs: a session run by two daemons in turn.

    python scripts/bench/held_frames.py [--pairs 8] [--turns 20] [--json]

Two runtimes joined as daemons on one throwaway PostgreSQL (one process, as the scale
tests run them), each with its own fake LLM over HTTP on 127.0.0.1 (one short answer a
turn) and each following the session, so every frame one publishes goes out on the bus
for the other. The session's turns alternate between the daemons: each turn's run
claims the lease the other one let go, and lets it go at its end. A sample is `--turns`
turns of a new session, each from its message to its session's actor idle again;
reported per mode, the median turn (ms) over the samples, each round's ratio to
``none``, and each wait itself (ms: its median and its longest).

Modes, alternated within each round in a rotating order (no mode always first):
``none``: a release does not wait for the outbox, a claim not for the listener (as
before both); ``flush``: a release waits until the frames published so far are through
NOTIFY (`Cluster.sent`); ``both``: that, and a claim of a lease another daemon held
last waits until the frames sent before it are handed to the actor (`Cluster.caught_up`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from navi_trio.core.turn import UserMessage
from navi_trio.runtime import Runtime, open_runtime
from navi_trio.settings import Settings
from navi_trio.testing import open_fake_llm
from navi_trio.testing.harness import test_config
from navi_trio.testing.postgres import PgServer

MODES = ("none", "flush", "both")
NO_PLAN = {"general": {"planning_first_message": False}}


@asynccontextmanager
async def _daemon(folder: Path, url: str, turns: int) -> AsyncIterator[Runtime]:
    async with open_fake_llm([{"text": "ok"}] * turns) as llm:
        settings = Settings.from_env(
            {}, db_url=url, data_dir=folder / "data", llm_backend="ollama", llm_url=llm.url
        )
        async with open_runtime(settings, config=test_config(NO_PLAN), cluster=True) as rt:
            yield rt


WAITS: dict[str, list[float]] = {"release": [], "claim": []}  # each wait (ms)


def _timed(key: str, wait: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    async def timed(*args: Any) -> None:
        start = time.perf_counter()
        await wait(*args)
        WAITS[key].append((time.perf_counter() - start) * 1000)

    return timed


def _mode(rts: list[Runtime], mode: str) -> None:
    for rt in rts:
        cluster = rt.cluster
        assert cluster is not None
        leases = rt.agent.leases
        leases.before_release = None if mode == "none" else _timed("release", cluster.sent)
        leases.after_claim = _timed("claim", cluster.caught_up) if mode == "both" else None


async def _sample(rts: list[Runtime], turns: int, sid: str) -> float:
    """The median turn (ms) of `turns` turns of a new session `sid`, followed by both
    daemons, alternating between them (a new session: no sample has a longer history)."""
    await rts[0].store.create_session(sid, profile_id="general")
    for rt in rts:
        assert rt.cluster is not None
        await rt.cluster.follow(sid)
        await rt.sessions.get(sid)
    took: list[float] = []
    for i in range(turns):
        actor = await rts[i % 2].sessions.get(sid)
        start = time.perf_counter()
        actor.send_message(UserMessage(f"m{i}"))
        await actor.idle.wait()
        took.append((time.perf_counter() - start) * 1000)
    return statistics.median(took)


async def bench(pairs: int, turns: int) -> dict[str, Any]:
    server = PgServer.start()
    try:
        url = server.create_database()
        total = (pairs * len(MODES) + 1) * turns
        with tempfile.TemporaryDirectory(prefix="navi-held-") as tmp:
            async with AsyncExitStack() as stack:
                rts = [
                    await stack.enter_async_context(_daemon(Path(tmp) / n, url, total))
                    for n in "ab"
                ]
                _mode(rts, "both")
                await _sample(rts, turns, "warm-up")
                for waits in WAITS.values():
                    waits.clear()
                got: dict[str, list[float]] = {m: [] for m in MODES}
                for r in range(pairs):
                    for mode in MODES[r % 3 :] + MODES[: r % 3]:
                        _mode(rts, mode)
                        got[mode].append(await _sample(rts, turns, f"s{r}-{mode}"))
    finally:
        server.stop()
    ratios = {
        m: statistics.median(x / n for x, n in zip(got[m], got["none"], strict=True)) for m in MODES
    }
    return {
        "pairs": pairs,
        "turns": turns,
        "median_turn_ms": {m: round(statistics.median(v), 2) for m, v in got.items()},
        "ratio_to_none": {m: round(v, 3) for m, v in ratios.items()},
        "wait_ms": {
            k: {"n": len(v), "p50": round(statistics.median(v), 3), "max": round(max(v), 2)}
            for k, v in WAITS.items()
            if v
        },
        "samples_ms": {m: [round(x, 2) for x in v] for m, v in got.items()},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = trio.run(bench, args.pairs, args.turns)
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return
    for mode in MODES:
        print(
            f"{mode:6} median turn {out['median_turn_ms'][mode]:8.2f} ms"
            f"  ratio to none {out['ratio_to_none'][mode]:.3f}"
        )
    for key, wait in out["wait_ms"].items():
        print(f"wait at a {key}: {wait['n']} waits, p50 {wait['p50']} ms, max {wait['max']} ms")


if __name__ == "__main__":
    main()
