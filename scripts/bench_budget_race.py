"""How far parallel sessions get past a user's daily budget, through real daemons.

    python scripts/bench_budget_race.py [--sessions 3 8 20] [--daemons 1] [--db URL]
                                        [--answer-max-tokens N]

For each count N: a fresh database (a SQLite file in a temp folder, or a fresh
PostgreSQL database on the server `--db` names, which needs ``--daemons 2`` to mean
anything), the shipped config with ``role_budgets {"user": {"user_day": {"tokens":
3000, "tool_calls": 4}}}``, no first-message plan and only the ``todo`` tool (a short
prompt, near the 400 tokens the fake reports), a user added with ``navi users
add``, `--daemons` real ``navi serve`` processes (each with a data folder of its own)
and the fake LLM on 127.0.0.1 answering every request with one ``todo`` call (it
reports 400 prompt and 20 completion tokens, after 0.3 s; `--answer-max-tokens` sets the
profile's output cap, which a call reserves with its prompt). N new sessions are started
at once, spread over the daemons, each looping on that call until its budget stops it. Printed,
one JSON line per N: the tool calls that ran (tool results in the histories that are
not refusals), the tokens the model reported for the calls it answered, and the
user's day as the database counted it. Bounded: 120 s per N, then it fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio
from trio_websocket import open_websocket_url

# The tests' daemon helpers (navi_trio is whichever one Python finds: PYTHONPATH may
# point at another tree, to measure it).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from reliability import clean_env, navi_serve  # noqa: E402

from navi_trio.settings import default_config_path  # noqa: E402
from navi_trio.testing import open_fake_llm  # noqa: E402

LIMIT_SEC = 120
PROMPT, COMPLETION = 400, 20
BUDGET = {"user": {"user_day": {"tokens": 3000, "tool_calls": 4}}}
REPLY = {
    "tool_calls": [{"name": "todo", "arguments": {"action": "list"}}],
    "prompt_tokens": PROMPT,
    "completion_tokens": COMPLETION,
    "delay_first": 0.3,  # a model takes a while: the sessions' calls overlap
}


def _env(folder: Path, db: str, cap: int | None) -> dict[str, str]:
    return {**clean_env(folder), "NAVI_DB": db, "NAVI_CONFIG": _config(folder, cap)}


def _config(folder: Path, cap: int | None) -> str:
    target = folder / "config"
    shutil.copytree(default_config_path().parent, target, dirs_exist_ok=True)
    path = target / default_config_path().name
    data = json.loads(path.read_text(encoding="utf-8"))
    general = data["profiles"]["general"]
    general["planning_first_message"] = False
    general["tools"] = {**general["tools"], "agent": ["todo"]}  # a prompt of a few tokens
    if cap is not None:
        general["answer_max_tokens"] = cap
    data["role_budgets"] = BUDGET
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


async def _run_sessions(url: str, token: str, n: int) -> list[str]:
    async with open_websocket_url(url) as ws:
        await ws.send_message(json.dumps({"type": "hello", "token": token}))
        assert json.loads(await ws.get_message())["type"] == "welcome"
        for i in range(n):
            await ws.send_message(json.dumps({"type": "message", "content": "loop", "id": i}))
        sids: list[str] = []
        ended = 0
        while ended < n:
            frame = json.loads(await ws.get_message())
            if frame["type"] == "ok" and "session_id" in frame:
                sids.append(frame["session_id"])
            elif frame["type"] == "error" and "id" in frame:
                raise SystemExit(f"a message was refused: {frame}")
            elif frame["type"] == "stream_end" and not frame.get("is_subagent"):
                ended += 1
        return sids


def _query(db: str, query: str) -> list[tuple[Any, ...]]:
    if db.startswith("postgresql"):
        import psycopg

        with psycopg.connect(db) as conn:
            return [tuple(r) for r in conn.execute(query.encode())]
    with sqlite3.connect(db) as conn:
        return list(conn.execute(query))


async def measure(n: int, daemons: int, db_url: str | None, cap: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="navi-budget-race-") as tmp:
        root = Path(tmp)
        db = db_url or str(root / "navi.db")
        async with open_fake_llm([REPLY], loop=True) as llm, AsyncExitStack() as stack:
            env0 = _env(root / "d0", db, cap)
            added = await trio.run_process(
                [sys.executable, "-m", "navi_trio", "users", "add", "alice"], env=env0,
                capture_stdout=True, capture_stderr=True,
            )  # fmt: skip
            token = added.stdout.decode().split()[-1]
            urls = []
            for i in range(daemons):
                env = env0 if i == 0 else _env(root / f"d{i}", db, cap)
                log = root / f"daemon{i}.log"
                daemon = await stack.enter_async_context(navi_serve(env, llm.url, log))
                urls.append(daemon.url)
            with trio.fail_after(LIMIT_SEC):
                async with trio.open_nursery() as nursery:
                    share = [n // daemons + (1 if i < n % daemons else 0) for i in range(daemons)]
                    for url, k in zip(urls, share, strict=True):
                        if k:
                            nursery.start_soon(_run_sessions, url, token, k)
            answered = llm.completed
            caps = [r["body"].get("options", {}).get("num_predict") for r in llm.chat_requests]
        rows = await trio.to_thread.run_sync(
            _query, db, "SELECT content FROM messages WHERE role = 'tool'"
        )
        ran = sum(1 for (content,) in rows if not content.startswith("Error"))
        usage = await trio.to_thread.run_sync(
            _query, db, "SELECT key, tokens, tool_calls FROM usage WHERE key LIKE 'user:%'"
        )
        return {
            "sessions": n, "daemons": daemons, "answer_max_tokens": cap, "tool_calls": ran,
            "tokens_reported": answered * (PROMPT + COMPLETION), "llm_calls": answered,
            "usage_row": [{"tokens": u[1], "tool_calls": u[2]} for u in usage],
            "budget": BUDGET["user"]["user_day"], "caps": caps,
        }  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[3, 8, 20])
    parser.add_argument("--daemons", type=int, default=1)
    parser.add_argument("--db", help="a postgresql:// URL of a server (default: SQLite)")
    parser.add_argument("--answer-max-tokens", type=int, help="the profile's output cap")
    args = parser.parse_args()
    for n in args.sessions:
        db = args.db
        if db is not None:  # a fresh database for each N
            import psycopg

            name = f"navi_budget_race_{n}_{os.getpid()}"
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name}")
                conn.execute(f"CREATE DATABASE {name}")
            db = db.rsplit("/", 1)[0] + "/" + name
        result = await measure(n, args.daemons, db, args.answer_max_tokens)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    trio.run(main)
