"""navi_trio's side of the benchmarks (trio; one measurement per process).

    python scripts/bench/navi_runs.py loop --mode inproc|ws --url URL --rounds 50 --reps 3
    python scripts/bench/navi_runs.py stop --tries 20
    python scripts/bench/navi_runs.py stream --url URL --words 100000
    python scripts/bench/navi_runs.py growth
    python scripts/bench/navi_runs.py idle_rss --sessions 200

Each prints one JSON object on stdout. The full runtime is used (SQLite file in a temp
dir, events, subscribers); only the profile is a bench profile: one `echo` tool,
planning, anti-stall, goal anchoring and thinking off (no peer does them either).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from navi_trio.api.auth import new_token
from navi_trio.api.daemon_client import DaemonConnection, open_daemon
from navi_trio.api.metrics import DaemonMetrics
from navi_trio.api.server import ApiServer
from navi_trio.api.tracing import open_tracing
from navi_trio.core.turn import Observers
from navi_trio.runtime import Runtime, open_runtime
from navi_trio.settings import Settings
from navi_trio.testing.harness import SessionDriver, test_config
from navi_trio.tools.base import ToolContext, ToolResult

BENCH_PROFILE = {
    "description": "benchmark: one echo tool",
    "max_iterations": 100_000,
    "planning_enabled": False,
    "planning_first_message": False,
    "think_enabled": False,
    "anti_stall_enabled": False,
    "goal_anchoring_enabled": False,
    "iteration_budget_enabled": False,
    "tools": {"agent": ["echo"], "subagent": ["echo"]},
}
PROMPT = "call echo until told otherwise"


class EchoTool:
    name = "echo"
    description = "echo the text back"
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }

    def __init__(self) -> None:
        self.t: list[float] = []
        self.c: list[float] = []
        self.cpu_runs: list[list[float]] = []  # CPU ms of each round (all threads)

    def start(self) -> None:
        self.t = [time.perf_counter()]
        self.c = [time.process_time()]

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.t.append(time.perf_counter())
        self.c.append(time.process_time())
        return ToolResult.success(str(args.get("text", "")))

    def rounds_ms(self) -> list[float]:
        if len(self.t) > 1:
            self.cpu_runs.append([(b - a) * 1000 for a, b in zip(self.c, self.c[1:], strict=False)])
        return [(b - a) * 1000 for a, b in zip(self.t, self.t[1:], strict=False)]


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@asynccontextmanager
async def bench_runtime(
    url: str,
    tools: list[Any],
    *,
    num_ctx: int = 1_000_000,
    profile: dict[str, Any] | None = None,
    observer: Any = None,
    **settings: Any,
) -> AsyncIterator[Runtime]:
    tmp = Path(tempfile.mkdtemp(prefix="navi-bench-"))
    cfg = test_config({"bench": profile or BENCH_PROFILE}, default_profile="bench")
    conf = Settings.from_env(
        {}, db_path=tmp / "navi.db", data_dir=tmp / "data", llm_backend="ollama",
        llm_url=url, num_ctx=num_ctx, default_model="fake-model", **settings,
    )  # fmt: skip
    # Traces when OTEL_* says so, as `navi serve` does (besides the metrics of --metrics).
    tracing = open_tracing(os.environ)
    if tracing is not None:
        observer = tracing[0] if observer is None else Observers(observer, tracing[0])
    try:
        async with open_runtime(conf, config=cfg, tools=tools, observer=observer) as rt:
            yield rt
    finally:
        if tracing is not None:
            tracing[1].shutdown()


class WsClient:
    """A bench client of the daemon: `open_daemon`'s connection and a few shortcuts."""

    def __init__(self, daemon: DaemonConnection) -> None:
        self.daemon = daemon

    async def send(self, frame: dict[str, Any]) -> None:
        await self.daemon.send(frame)

    async def next(self) -> dict[str, Any]:
        return await self.daemon.receive()

    async def start_session(self, text: str) -> str:
        """A new session running `text`; its frames so far wait for `next`."""
        return (await self.daemon.send_message(text)).session_id

    async def until_end(self, sid: str, on_frame: Any = None) -> dict[str, Any]:
        while True:
            f = await self.next()
            if on_frame is not None:
                on_frame(f)
            if f.get("type") == "stream_end" and f.get("session_id") == sid:
                if not f.get("is_subagent"):
                    return f


@asynccontextmanager
async def ws_daemon(
    rt: Runtime, users: int = 1, tokens: list[str] | None = None, metrics: Any = None
) -> AsyncIterator[tuple[str, str]]:
    """An ApiServer on 127.0.0.1:0 over `rt`; yields (url, token of the first user).

    With `users` > 1 every user's token is appended to `tokens` (the daemon caps the
    connections per user, so the concurrency bench gives each client its own user)."""
    tokens = [] if tokens is None else tokens
    async with trio.open_nursery() as nursery:
        server = ApiServer(rt, host="127.0.0.1", port=0, metrics=metrics)
        port = await nursery.start(server.run)
        for i in range(users):
            token = new_token()
            await rt.store.create_user(f"bench{i}", token, "admin" if i == 0 else "user")
            tokens.append(token)
        yield f"ws://127.0.0.1:{port}/", tokens[0]
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def ws_client(url: str, token: str) -> AsyncIterator[WsClient]:
    async with open_daemon(url, token) as daemon:
        yield WsClient(daemon)


# --- 1. tool loop --------------------------------------------------------------------


async def loop_bench(a: argparse.Namespace) -> dict[str, Any]:
    echo = EchoTool()
    runs: list[list[float]] = []
    totals: list[float] = []
    compressions = 0
    # --metrics: the daemon's metrics on, as `navi serve` has them (api/metrics.py).
    metrics = DaemonMetrics() if a.metrics else None
    async with bench_runtime(a.url, [echo], num_ctx=a.num_ctx, observer=metrics) as rt:
        if a.mode == "inproc":
            for i in range(a.reps):
                actor = await rt.sessions.get(f"bench-{i}")
                driver = SessionDriver(actor, actor.subscribe())
                echo.start()
                driver.send(PROMPT)
                frames = await driver.until_end()
                totals.append((time.perf_counter() - echo.t[0]) * 1000)
                driver.subscription.close()
                compressions += sum(f["type"] == "context_compressed" for f in frames)
                runs.append(echo.rounds_ms())
        else:
            async with (
                ws_daemon(rt, metrics=metrics) as (url, token),
                ws_client(url, token) as c,
            ):
                for _ in range(a.reps):
                    seen: list[str] = []
                    echo.start()
                    sid = await c.start_session(PROMPT)
                    await c.until_end(sid, lambda f: seen.append(f["type"]))  # noqa: B023
                    totals.append((time.perf_counter() - echo.t[0]) * 1000)
                    compressions += seen.count("context_compressed")
                    runs.append(echo.rounds_ms())
    return {
        "runs": runs, "cpu": echo.cpu_runs, "total_ms": totals, "compressions": compressions
    }  # fmt: skip


# --- 3. stream throughput ------------------------------------------------------------


async def stream_bench(a: argparse.Namespace) -> dict[str, Any]:
    # No answer cap here.
    big: dict[str, Any] = {"answer_max_chars": 10**9, "answer_max_tokens": 10**9}
    async with bench_runtime(a.url, [EchoTool()], **big) as rt, ws_daemon(rt) as (url, token):
        async with ws_client(url, token) as c:
            t0 = time.perf_counter()
            sid = await c.start_session("stream")
            words = 0
            frames = 0

            def count(f: dict[str, Any]) -> None:
                nonlocal words, frames
                if f.get("type") == "text_delta":
                    frames += 1
                    words += len(str(f.get("text", "")).split())

            await c.until_end(sid, count)
            dt = time.perf_counter() - t0
    return {"words": words, "seconds": dt, "words_per_s": words / dt, "frames": frames}


# --- 4. concurrency: conc.py (the daemon, the clients and the LLM in separate processes)


async def idle_rss_bench(a: argparse.Namespace) -> dict[str, Any]:
    import gc
    import tracemalloc

    async with bench_runtime(a.url, [EchoTool()], session_idle_sec=3600.0) as rt:
        for i in range(20):  # warm up allocators and code paths
            await rt.sessions.get(f"warm-{i}")
        gc.collect()
        before = rss_kb()
        tracemalloc.start()
        traced0 = tracemalloc.get_traced_memory()[0]
        for i in range(a.sessions):
            await rt.sessions.get(f"idle-{i}")
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - traced0
        tracemalloc.stop()
        after = rss_kb()
    return {
        "sessions": a.sessions,
        "rss_per_idle_session_kb": (after - before) / a.sessions,
        "python_heap_per_idle_session_kb": traced / 1024 / a.sessions,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("what")
    p.add_argument("--mode", default="inproc", choices=["inproc", "ws"])
    p.add_argument("--url", default="http://127.0.0.1:9")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--num-ctx", type=int, default=1_000_000)
    p.add_argument("--sessions", type=int, default=10)
    p.add_argument("--tries", type=int, default=20)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--profile", default="")
    p.add_argument("--metrics", action="store_true", help="the daemon's metrics on (loop)")
    p.add_argument(
        "--sync", default="", help="what-if: open the store with this synchronous= (OFF, NORMAL)"
    )
    a = p.parse_args()
    if a.sync:
        # An experiment, not a setting: how much of a figure is the per-commit fsync.
        from navi_trio.store.sqlite import SQLiteStore

        real_open = SQLiteStore.open.__func__  # type: ignore[attr-defined]

        def open_with(cls: Any, /, path: Any, **kw: Any) -> Any:
            return real_open(cls, path, **{**kw, "synchronous": a.sync})

        SQLiteStore.open = classmethod(open_with)  # type: ignore[method-assign,assignment]
    fn = {
        "loop": loop_bench, "stream": stream_bench,
        "idle_rss": idle_rss_bench,
    }  # fmt: skip

    async def go() -> dict[str, Any]:
        return await fn[a.what](a)

    if a.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        result = trio.run(go)
        prof.disable()
        prof.dump_stats(a.profile)
    else:
        result = trio.run(go)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
