"""The two trio processes of conc.py: the daemon and a group of WebSocket clients.

daemon   the full runtime (bench profile, max_iterations 10; warmed up as `navi serve`
         is before it listens, so the figures are the steady state) and an ApiServer on
         127.0.0.1:0 with one user per client; prints {"ws", "tokens"} and serves until
         its stdin closes.
clients  connects --count clients (tokens --first ...), says hello, prints ``ready``;
         on ``go`` each sends one message and reads its session's frames until
         ``stream_end``; prints {"gaps_ms" (a list per session), "kinds" (the type
         of the frame that ended each gap), "rounds", "cpu_s", "errors"}; with
         ``--phases`` also "at" (each frame's time.perf_counter(), per session).

``--probe PATH`` (daemon, bench only): the collector's passes (`gc.callbacks`: start,
length, generation, in the trio thread or not), the loop's lateness (a task that
sleeps 5 ms and notes how late it woke, past 2 ms late) and each round's parts (an
`Observer`: each LLM call's start, first chunk and end, each non-delta event; the echo
tool's run), all in time.perf_counter() (CLOCK_MONOTONIC: the clients' clock too),
written to PATH as JSON when the daemon's stdin closes.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import trio
from navi_runs import BENCH_PROFILE, PROMPT, EchoTool, bench_runtime, ws_client, ws_daemon

from navi_trio.core.turn import LLMCallDone
from navi_trio.events import AgentEvent
from navi_trio.tools.base import ToolContext, ToolResult

ROUNDS = 10  # rounds of each session's tool loop
# Connections on their way to their hello at once from one client process: the daemon
# holds at most NAVI_WS_PENDING_PER_ADDRESS (32) from one address and closes the oldest
# past that, so 50 clients connecting together would push one another out.
CONNECTING = 16


def _patch_sync(sync: str) -> None:
    """What-if only: open the store with this ``synchronous=`` (see navi_runs.py)."""
    from navi_trio.store.sqlite import SQLiteStore

    real_open = SQLiteStore.open.__func__  # type: ignore[attr-defined]

    def open_with(cls: Any, /, path: Any, **kw: Any) -> Any:
        return real_open(cls, path, **{**kw, "synchronous": sync})

    SQLiteStore.open = classmethod(open_with)  # type: ignore[method-assign,assignment]


LATE_TICK_S = 0.005  # the lateness probe's sleep
LATE_NOTED_S = 0.002  # a wake-up later than this is noted


class Probe:
    """Bench only (``--probe``): when the collector stopped the process, how late the
    trio loop ran, and when each part of each round happened (see the module's doc).

    Also the runtime's `Observer` (text deltas left out: they cost it nothing) and the
    echo tool. Its lists grow by a few entries a round; the bench's load is bounded."""

    deltas = False

    def __init__(self) -> None:
        self.main = threading.get_ident()
        # start, seconds, generation, freed, in the trio thread, CPU seconds of the pass
        self.gc: list[tuple[float, float, int, int, bool, float]] = []
        self.late: list[tuple[float, float]] = []  # woke at, seconds late
        self.calls: list[tuple[str, float, float | None, float]] = []  # sid, start, 1st, end
        self.tools: list[tuple[str, float, float]] = []  # sid, start, end
        self._gc_start = self._gc_cpu = 0.0
        self.at_listen: list[int] = []  # objects the collector tracks, per generation

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        if phase == "start":
            self._gc_start, self._gc_cpu = now, cpu
            return
        main = threading.get_ident() == self.main
        self.gc.append((self._gc_start, now - self._gc_start, info["generation"],
                        info["collected"], main, cpu - self._gc_cpu))  # fmt: skip

    def llm_call(self, done: LLMCallDone) -> None:
        end = time.perf_counter()
        start = end - done.seconds
        first = None if done.first_chunk_seconds is None else start + done.first_chunk_seconds
        self.calls.append((done.session_id, start, first, end))

    def event(self, session_id: str, event: AgentEvent) -> None:
        pass  # the clients see the events; the parts of a round come from the calls

    def stopped(self, seconds: float) -> None:
        pass

    async def lateness(self) -> None:
        """Sleep `LATE_TICK_S` over and over; note each wake-up `LATE_NOTED_S` late."""
        while True:
            want = time.perf_counter() + LATE_TICK_S
            await trio.sleep(LATE_TICK_S)
            now = time.perf_counter()
            if now - want > LATE_NOTED_S:
                self.late.append((now, now - want))

    def figures(self) -> dict[str, Any]:
        old = collections.Counter(type(o).__name__ for o in gc.get_objects(2))
        return {"gc": self.gc, "late": self.late, "calls": self.calls, "tools": self.tools,
                "gc_old_types": old.most_common(15),
                "gc_threshold": gc.get_threshold(), "gc_frozen": gc.get_freeze_count(),
                "gc_objects": [len(gc.get_objects(g)) for g in (0, 1, 2)],
                "gc_objects_at_listen": self.at_listen}  # fmt: skip


class ProbedEcho(EchoTool):
    """The echo tool, its runs noted in a `Probe`."""

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self.probe = probe

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        start = time.perf_counter()
        result = ToolResult.success(str(args.get("text", "")))
        self.probe.tools.append((ctx.session_id, start, time.perf_counter()))
        return result


async def daemon(a: argparse.Namespace) -> None:
    profile = {**BENCH_PROFILE, "max_iterations": ROUNDS}
    more: dict[str, Any] = {"llm_transport": a.transport} if a.transport else {}
    probe = Probe() if a.probe else None
    if probe is not None:
        more["observer"] = probe
        gc.callbacks.append(probe.on_gc)
    tool = EchoTool() if probe is None else ProbedEcho(probe)
    async with (
        bench_runtime(a.url, [tool], profile=profile, session_idle_sec=3600.0, **more) as rt,
        trio.open_nursery() as nursery,
    ):
        tokens: list[str] = []
        await rt.warm_up()  # as `navi serve` before it listens: the steady state
        async with ws_daemon(rt, a.users, tokens) as (url, _):
            if probe is not None:
                probe.at_listen = [len(gc.get_objects(g)) for g in (0, 1, 2)]
                nursery.start_soon(probe.lateness)
            print(json.dumps({"ws": url, "tokens": tokens}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)
        if probe is not None:
            await trio.Path(a.probe).write_text(json.dumps(probe.figures()))
        nursery.cancel_scope.cancel()


async def cluster_daemon(a: argparse.Namespace) -> None:
    """One of `conc.py --daemons N`: `daemon` on the PostgreSQL at --db, in the cluster;
    the first (no --tokens) makes the users, the others read their tokens from --tokens."""
    from navi_trio.api.auth import new_token
    from navi_trio.api.server import ApiServer
    from navi_trio.runtime import open_runtime
    from navi_trio.settings import Settings
    from navi_trio.testing.harness import test_config

    profile = {**BENCH_PROFILE, "max_iterations": ROUNDS}
    cfg = test_config({"bench": profile}, default_profile="bench")
    tmp = Path(a.data)
    conf = Settings.from_env(
        {}, db_url=a.db, data_dir=tmp, llm_backend="ollama", llm_url=a.url,
        num_ctx=1_000_000, default_model="fake-model", session_idle_sec=3600.0,
    )  # fmt: skip
    tokens: list[str] = list(a.token_list)
    async with open_runtime(conf, config=cfg, tools=[EchoTool()], cluster=True) as rt:
        await rt.warm_up()  # as `daemon`
        if not tokens:
            for i in range(a.users):
                token = new_token()
                await rt.store.create_user(f"bench{i}", token, "admin" if i == 0 else "user")
                tokens.append(token)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(ApiServer(rt, host="127.0.0.1", port=0).run)
            url = f"ws://127.0.0.1:{port}/"
            print(json.dumps({"ws": url, "tokens": tokens}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)
            nursery.cancel_scope.cancel()


async def clients(a: argparse.Namespace) -> None:
    tokens: list[str] = a.token_list[a.first : a.first + a.count]
    gaps: list[list[float]] = []  # per session, in order
    kinds: list[list[str]] = []  # the type of the frame that ended each gap
    ats: list[list[float]] = []  # each frame's time (--phases)
    sids: list[str] = []  # each session's id, in the same order
    errors: list[str] = []
    rounds = 0
    go = trio.Event()
    connected = 0
    all_in = trio.Event()
    connecting = trio.Semaphore(CONNECTING)

    async def one(token: str) -> None:
        nonlocal rounds, connected
        async with contextlib.AsyncExitStack() as stack:
            async with connecting:
                c = await stack.enter_async_context(ws_client(a.ws, token))
            connected += 1
            if connected == len(tokens):
                all_in.set()
            await go.wait()
            sid = await c.start_session(PROMPT)
            last = time.perf_counter()
            mine: list[float] = []
            types: list[str] = []
            at: list[float] = []
            gaps.append(mine)
            sids.append(sid)
            kinds.append(types)
            ats.append(at)
            while True:
                f = await c.next()
                now = time.perf_counter()
                mine.append((now - last) * 1000)
                types.append(str(f.get("type")))
                if a.phases:
                    at.append(now)
                last = now
                if f.get("session_id") != sid or f.get("is_subagent"):
                    continue
                if f.get("type") == "tool_result":
                    rounds += 1
                elif f.get("type") == "error":
                    errors.append(str(f)[:200])
                elif f.get("type") == "stream_end":
                    return

    cpu0 = time.process_time()
    async with trio.open_nursery() as nursery:
        for token in tokens:
            nursery.start_soon(one, token)
        await all_in.wait()
        print("ready", flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        if line.strip() != "go":
            nursery.cancel_scope.cancel()
            return
        go.set()
    print(json.dumps({
        "gaps_ms": gaps, "kinds": kinds, "rounds": rounds,
        "cpu_s": time.process_time() - cpu0, "errors": errors,
        **({"at": ats, "sids": sids} if a.phases else {}),
    }), flush=True)  # fmt: skip


def main(a: argparse.Namespace) -> int:
    if a.sync:
        _patch_sync(a.sync)
    a.token_list = json.loads(Path(a.tokens).read_text()) if a.tokens else []
    if a.what == "daemon" and a.db:
        trio.run(cluster_daemon, a)
        return 0
    trio.run(daemon if a.what == "daemon" else clients, a)
    return 0
