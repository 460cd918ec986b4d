"""Several real `navi serve` processes on one PostgreSQL database.

`pg_daemons(tmp_path, pg_url, llm_url, n)` starts `n` daemons one after the other
(each on 127.0.0.1 port 0, the same data folder, so one local token opens all of them,
and the shipped config without first-message plans) and kills every one on the way out
(tests/reliability.py `navi_serve`). With ``machines=True`` each daemon has a data
folder of its own (``tmp_path/machine<i>``), as daemons on separate machines have: the
clients then connect as users made with the CLI (`cli_user`, the ``navi users add``
an operator types) through `connect`. `history(url, sid)` reads a session's display
history straight from the database, and `lease(url, sid)` its lease row, the way a
third process would.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from api_ws import Client
from pg_server import sql
from reliability import Daemon, clean_env, navi_serve
from trio_websocket import open_websocket_url

from navi_trio.settings import default_config_path


def no_plan_config(tmp_path: Path, **general: Any) -> Path:
    """The shipped config with no first-message plan (scripts hold no plan replies)."""
    folder = tmp_path / "config"
    shutil.copytree(default_config_path().parent, folder, dirs_exist_ok=True)
    path = folder / default_config_path().name
    data = json.loads(path.read_text(encoding="utf-8"))
    data["profiles"]["general"].update(planning_first_message=False, **general)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@asynccontextmanager
async def pg_daemons(
    tmp_path: Path, pg_url: str, llm_url: str, n: int, *, machines: bool = False, **env: str
) -> AsyncIterator[list[Daemon]]:
    if "NAVI_CONFIG" not in env:  # (setdefault would write tmp_path/config even when given)
        env["NAVI_CONFIG"] = str(no_plan_config(tmp_path))
    async with AsyncExitStack() as stack:
        daemons = []
        for i in range(n):
            home = tmp_path / f"machine{i}" if machines else tmp_path
            base = {**clean_env(home, **env), "NAVI_DB": pg_url}
            log = tmp_path / f"daemon{i}.log"
            daemons.append(await stack.enter_async_context(navi_serve(base, llm_url, log)))
        yield daemons


async def cli_user(tmp_path: Path, pg_url: str, name: str) -> str:
    """``navi users add NAME --db URL``, as an operator runs it: the token it prints."""
    env = clean_env(tmp_path / "operator")
    done = await trio.run_process(
        [sys.executable, "-m", "navi_trio", "users", "add", name, "--db", pg_url],
        capture_stdout=True, capture_stderr=True, env=env, check=False,
    )  # fmt: skip
    out = done.stdout.decode()
    assert done.returncode == 0, (out, done.stderr.decode())
    return out.strip().splitlines()[-1]


@asynccontextmanager
async def connect(url: str, token: str) -> AsyncIterator[Client]:
    """A WebSocket client of the daemon at `url`, past its hello with `token`."""
    async with open_websocket_url(url) as ws:
        c = Client(ws)
        await c.send({"type": "hello", "token": token})
        welcome = await c.next()
        assert welcome["type"] == "welcome", welcome
        yield c


def history(url: str, sid: str) -> list[tuple[Any, ...]]:
    """(role, content) of each display message of `sid`, in order."""
    return sql(url, "SELECT role, content FROM messages WHERE session_id = %s"
                    " ORDER BY position", (sid,))  # fmt: skip


def lease(url: str, sid: str) -> tuple[Any, ...] | None:
    """(owner, pid, expires_at, generation, now) of `sid`'s lease, server clock."""
    rows = sql(url, "SELECT owner, pid, expires_at, generation,"
                    " extract(epoch FROM clock_timestamp()) FROM leases"
                    " WHERE session_id = %s", (sid,))  # fmt: skip
    return rows[0] if rows else None
