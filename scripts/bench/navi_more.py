"""navi_trio's stop latency over WebSocket (item 2) and growth costs (item 5).

    python scripts/bench/navi_more.py stop --tries 50
    python scripts/bench/navi_more.py growth [--quick]

Stop: for each phase a fresh runtime + ApiServer on 127.0.0.1 with an in-process fake LLM
server (its disconnect times are on the same trio clock), one WebSocket client; each try
starts a session, waits until the run is in the phase, sends ``stop`` and times the
``stream_end`` frame, and (for phases with an open LLM request) the moment the fake
server saw the connection close. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from navi_runs import BENCH_PROFILE, PROMPT, EchoTool, WsClient, bench_runtime, ws_client, ws_daemon

from navi_trio.core.turn import ContextBuilder, ContextViews, TokenCounter
from navi_trio.runtime import default_tools
from navi_trio.settings import Settings
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing.fake_llm import FakeLLMServer
from navi_trio.testing.harness import test_config

STALL = {"text": "never", "delay_first": 1000}
SLEEP = {"name": "terminal", "arguments": {"action": "run", "command": "sleep 60"}}


def _profile(**changes: Any) -> dict[str, Any]:
    return {**BENCH_PROFILE, **changes}


def _tools(*names: str) -> dict[str, Any]:
    return {"agent": list(names), "subagent": ["echo"]}


async def _frame(c: WsClient, sid: str, pred: Callable[[dict[str, Any]], bool]) -> None:
    while True:
        f = await c.next()
        if f.get("session_id") == sid and pred(f):
            return


def _typed(t: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: f.get("type") == t


PHASES: dict[str, tuple[dict[str, Any], list[dict[str, Any]], str, int]] = {
    # phase: (profile, replies per try, how to know it is there, LLM requests per try)
    "planning": (
        _profile(planning_enabled=True, planning_first_message=True), [STALL], "request", 1
    ),
    "prefill": (_profile(), [STALL], "request", 1),
    "mid_stream": (
        _profile(), [{"text": "word", "endless": True, "delay_chunk": 0.001}], "text", 1
    ),
    "terminal_sleep60": (
        _profile(tools=_tools("terminal")), [{"tool_calls": [SLEEP]}], "tool", 1
    ),
    "parallel_batch": (
        _profile(tools=_tools("terminal"), parallel_tool_calls=True),
        [{"tool_calls": [SLEEP, SLEEP, SLEEP]}], "tool", 1,
    ),
    "subagent_sync": (
        _profile(tools=_tools("spawn_agent")),
        [{"tool_calls": [{"name": "spawn_agent", "arguments": {"task": "wait"}}]}, STALL],
        "request", 2,
    ),
}  # fmt: skip


def _pcts(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {}
    s = sorted(ms)

    def at(q: float) -> float:
        return s[min(len(s) - 1, int(len(s) * q))]

    return {"n": len(s), "p50": statistics.median(s), "p95": at(0.95), "p99": at(0.99),
            "max": s[-1]}  # fmt: skip


async def stop_phase(name: str, tries: int) -> dict[str, Any]:
    profile, replies, marker, per_try = PHASES[name]
    fake = FakeLLMServer(replies, loop=True)
    latency: list[float] = []
    disconnect: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(fake.serve)
        tools = [*default_tools(Settings.from_env({})), EchoTool()]
        # The default limit (NAVI_WS_FRAMES_PER_SEC 20, burst 40) drops frames of a client
        # sending faster, stop frames too: 50 tries in a row would hit it. Measured apart.
        async with bench_runtime(
            fake.url, tools, profile=profile, ws_frames_per_sec=1e6, ws_frames_burst=10**6
        ) as rt:
            async with ws_daemon(rt) as (url, token), ws_client(url, token) as c:
                for i in range(tries):
                    before = len(fake.chat_requests)
                    seen = len(fake.disconnects)
                    sid = await c.start_session(f"{PROMPT} {i}")
                    if marker == "request":
                        while len(fake.chat_requests) < before + per_try:
                            await fake.wait_requests(len(fake.requests) + 1)
                        await trio.sleep(0.005)  # the request is in the server's prefill
                    elif marker == "text":
                        await _frame(c, sid, _typed("text_delta"))
                    else:
                        await _frame(c, sid, _typed("tool_started"))
                        await trio.sleep(0.05)  # the process is running
                    t0 = trio.current_time()
                    p0 = time.perf_counter()
                    await c.send({"type": "stop", "session_id": sid})
                    await c.until_end(sid)
                    latency.append((time.perf_counter() - p0) * 1000)
                    if marker != "tool":
                        with trio.move_on_after(5):
                            await fake.wait_disconnects(seen + 1)
                        if len(fake.disconnects) > seen:
                            disconnect.append((fake.disconnects[seen]["time"] - t0) * 1000)
        nursery.cancel_scope.cancel()
    return {"stop_to_stream_end_ms": _pcts(latency), "llm_disconnect_ms": _pcts(disconnect)}


async def stop_bench(a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in a.phases.split(",") if a.phases else PHASES:
        try:
            with trio.fail_after(120):
                out[name] = await stop_phase(name, a.tries)
        except Exception as exc:  # one phase failing must not hide the others
            leaves = exc.exceptions if isinstance(exc, BaseExceptionGroup) else [exc]
            out[name] = {"error": "; ".join(f"{type(e).__name__}: {e}" for e in leaves)[:300]}
        print(name, out[name], file=sys.stderr, flush=True)
    return out


# --- 5. growth -----------------------------------------------------------------------


def _round(i: int) -> list[dict[str, Any]]:
    call = {"function": {"name": "echo", "arguments": {"text": f"ping {i}"}}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": f"ping {i}", "tool_name": "echo"},
    ]


async def _timed(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


async def growth_bench(a: argparse.Namespace) -> dict[str, Any]:
    sizes = [10, 1000, 10000]
    tmp = Path(tempfile.mkdtemp(prefix="navi-growth-"))
    settings = Settings.from_env({}, db_path=tmp / "navi.db", num_ctx=10_000_000)
    cfg = test_config({"bench": BENCH_PROFILE}, default_profile="bench").current
    profile = cfg.profiles["bench"]
    counter = TokenCounter()
    builder = ContextBuilder(settings, counter)
    out: dict[str, Any] = {}
    serial = itertools.count()
    async with SQLiteStore.open(settings.db_path) as store:
        for size in sizes:
            sid = f"g{size}"
            await store.create_session(sid, profile_id="bench")
            context: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
            i = 0
            while len(context) < size:
                batch = [m for k in range(i, i + 250) for m in _round(k)][: size - len(context)]
                i += 250
                await store.append(sid, messages=batch, context=batch)
                context += batch
            n = 20

            async def save(sid: str = sid) -> None:
                new = _round(10**6 + next(serial))
                await store.append(sid, messages=new, context=new)

            views = ContextViews()  # a running turn's: kept between its rounds

            async def build(
                context: list[dict[str, Any]] = context, views: ContextViews = views
            ) -> None:
                # One round of a turn: the round's two new messages, then the build and
                # the size check of the whole context.
                context += _round(10**6 + next(serial))
                built = builder.build(config=cfg, profile=profile, context=context, views=views)
                builder.check_context_size(built, num_ctx=settings.num_ctx, views=views)

            async def load(sid: str = sid) -> None:
                await store.load_session(sid)

            async def first_build(context: list[dict[str, Any]] = context) -> None:
                # A turn's first round builds every message once (new views).
                fresh = ContextViews()
                built = builder.build(config=cfg, profile=profile, context=context, views=fresh)
                builder.check_context_size(built, num_ctx=settings.num_ctx, views=fresh)

            await build()  # the counter's cache holds the history, as in a running turn
            out[str(size)] = {
                "save_ms": await _timed(save, n),
                "build_ms": await _timed(build, n),
                "first_build_ms": await _timed(first_build, 5),
                "load_session_ms": await _timed(load, 5 if size >= 10000 else n),
            }
            print(size, out[str(size)], file=sys.stderr, flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["stop", "growth"])
    p.add_argument("--tries", type=int, default=20)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--phases", default="", help="comma list of stop phases (default: all)")
    a = p.parse_args()
    fn = stop_bench if a.what == "stop" else growth_bench
    print(json.dumps(trio.run(fn, a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
