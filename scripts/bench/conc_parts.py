"""The two trio processes of conc.py: the daemon and a group of WebSocket clients.

daemon   the full runtime (bench profile, max_iterations 10; the token encoding loaded
         first, so the figures are the steady state) and an ApiServer on
         127.0.0.1:0 with one user per client; prints {"ws", "tokens"} and serves until
         its stdin closes.
clients  connects --count clients (tokens --first ...), says hello, prints ``ready``;
         on ``go`` each sends one message and reads its session's frames until
         ``stream_end``; prints {"gaps_ms" (a list per session), "rounds", "cpu_s",
         "errors"}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import trio
from navi_runs import BENCH_PROFILE, PROMPT, EchoTool, bench_runtime, ws_client, ws_daemon

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


async def daemon(a: argparse.Namespace) -> None:
    profile = {**BENCH_PROFILE, "max_iterations": ROUNDS}
    more = {"llm_transport": a.transport} if a.transport else {}  # conc.py --transport
    async with bench_runtime(
        a.url, [EchoTool()], profile=profile, session_idle_sec=3600.0, **more
    ) as rt:
        tokens: list[str] = []
        await rt.agent.parts.counter.preload()  # steady state: not its one-off load
        async with ws_daemon(rt, a.users, tokens) as (url, _):
            print(json.dumps({"ws": url, "tokens": tokens}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)


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
        await rt.agent.parts.counter.preload()  # as `daemon`
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
            gaps.append(mine)
            while True:
                f = await c.next()
                now = time.perf_counter()
                mine.append((now - last) * 1000)
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
        "gaps_ms": gaps, "rounds": rounds, "cpu_s": time.process_time() - cpu0,
        "errors": errors,
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
