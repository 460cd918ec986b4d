"""A user's daily budget across daemons: two real `navi serve` processes (each with a
data folder of its own) on one PostgreSQL database, twenty sessions of one user started
at once over both, every model call held until each session has one waiting or has
ended (tests/budget_race.py). What a call may spend is reserved in the database before
it runs (a hold row taken under the usage row's lock), so together the daemons spend no
more than the day's 3000 tokens and 4 tool calls.

Real parts: the daemons, the user added with ``navi users add``, PostgreSQL from
tests/pg_server.py, the fake LLM on 127.0.0.1, the real ``todo`` tool. No sleeps; every
test under `trio.fail_after`.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client
from budget_race import race
from daemons import add_user, cli_env, pg_daemons
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql
from trio_websocket import open_websocket_url

from navi_trio.settings import default_config_path
from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow

TIMEOUT = 120
SESSIONS = 20
PROMPT, COMPLETION = 400, 20
ANSWER: dict[str, Any] = {
    "tool_calls": [{"name": "todo", "arguments": {"action": "list"}}],
    "prompt_tokens": PROMPT,
    "completion_tokens": COMPLETION,
}


def budget_config(tmp_path: Path) -> Path:
    """The shipped config: no first-message plan, only the todo tool (a prompt near
    the 400 tokens the fake reports), a 500-token answer cap, and the user role's day
    budget of 3000 tokens and 4 tool calls."""
    folder = tmp_path / "config"
    shutil.copytree(default_config_path().parent, folder, dirs_exist_ok=True)
    path = folder / default_config_path().name
    data = json.loads(path.read_text(encoding="utf-8"))
    general = data["profiles"]["general"]
    general.update(planning_first_message=False, answer_max_tokens=500)
    general["tools"] = {**general["tools"], "agent": ["todo"]}
    data["role_budgets"] = {"user": {"user_day": {"tokens": 3000, "tool_calls": 4}}}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


async def test_a_users_daily_budget_holds_across_two_daemons(tmp_path: Path, pg_url: str) -> None:
    config = budget_config(tmp_path)
    with trio.fail_after(TIMEOUT):
        token = await add_user(cli_env(tmp_path, pg_url), "alice", forked=True)
        async with (
            open_fake_llm([ANSWER], loop=True) as llm,
            pg_daemons(
                tmp_path, pg_url, llm.url, 2, separate=True, NAVI_CONFIG=str(config), forked=True
            ) as (
                a,
                b,
            ),
            open_websocket_url(a.url) as on_a,
            open_websocket_url(b.url) as on_b,
        ):
            clients = [Client(on_a), Client(on_b)]
            for c in clients:
                await c.send({"type": "hello", "token": token})
                assert (await c.next())["type"] == "welcome"
            ends = await race(clients, llm, SESSIONS)
            answered = llm.completed
    assert a.data_dir != b.data_dir
    assert len(ends) == SESSIONS
    assert {e["reason"] for e in ends.values()} == {"budget_exhausted"}
    # Both daemons ran sessions.
    owners = {c: [f["session_id"] for f in c.frames if f["type"] == "stream_end"] for c in clients}
    assert all(owners.values())
    ran = sql(pg_url, "SELECT count(*) FROM messages WHERE role = 'tool'"
                      " AND content NOT LIKE 'Error%%'")[0][0]  # fmt: skip
    (alice,) = sql(pg_url, "SELECT id FROM users WHERE name = 'alice'")[0]
    day = time.strftime("%Y-%m-%d", time.gmtime())
    usage = sql(pg_url, "SELECT tokens, tool_calls FROM usage WHERE key = %s",
                (f"user:{alice}:{day}",))  # fmt: skip
    assert usage == [(answered * (PROMPT + COMPLETION), ran)]
    assert answered * (PROMPT + COMPLETION) <= 3000
    assert 1 <= ran <= 4
    refused = [
        f for c in clients for f in c.frames
        if f["type"] == "budget_exhausted" and f["held"] > 0
    ]  # fmt: skip
    assert refused and all(f["scope"] == "user_day" for f in refused)
    # Every hold was settled: nothing is left reserved.
    assert sql(pg_url, "SELECT count(*) FROM usage_holds") == [(0,)]
