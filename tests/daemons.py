"""Several real `navi serve` processes on one PostgreSQL database.

`pg_daemons(tmp_path, pg_url, llm_url, n)` starts `n` daemons at once
(each on 127.0.0.1 port 0, the same data folder, so one local token opens all of them,
and the shipped config without first-message plans) and kills every one on the way out
(tests/reliability.py `navi_serve`); with `separate=True` each has a data folder of its
own, as daemons on several machines do; with `forked=True` each is forked from the warm
fork server (tests/navi_forks.py): the same command, a process of its own, without a
new interpreter's start and imports (3 s of a 5 s start at load 11), for tests whose
subject is what daemons do together, not how one starts. `history(url, sid)` reads a
session's display history straight from the database, and `lease(url, sid)` its lease
row, the way a third process would; `run_out(url, owner)` expires a paused daemon's
leases and its row there, as a pause past its TTL would.

Users made as an operator makes them: `navi_users(env, "add", "bob")` runs `navi users`
in a process of its own (on the database `env` names: `cli_env`, on a daemon's machine or
on one of the operator's own) and `add_user` returns the token it printed (`forked=True`:
the command forked, `forked_users`);
`connect_as(url, token)` is a WebSocket client past its hello. Where `navi users` is not
the subject: `store_user` writes the user to the store as the command does (no process),
and `forked_users` runs the command forked from the warm fork server (tests/navi_forks.py).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import navi_forks
import trio
from api_ws import Client
from pg_server import sql
from reliability import Daemon, clean_env, navi_serve
from trio_websocket import open_websocket_url

from navi_trio.api.auth import new_token
from navi_trio.settings import Settings, default_config_path
from navi_trio.store.factory import open_store

CLI_LIMIT = 60  # real seconds for one `navi users` (a Python start on 2 busy cores)


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
    tmp_path: Path,
    pg_url: str,
    llm_url: str,
    n: int,
    *,
    separate: bool = False,
    forked: bool = False,
    **env: str,
) -> AsyncIterator[list[Daemon]]:
    if "NAVI_CONFIG" not in env:  # (setdefault would write tmp_path/config even when given)
        env["NAVI_CONFIG"] = str(no_plan_config(tmp_path))
    base = {**clean_env(tmp_path, **env), "NAVI_DB": pg_url}
    started: list[Daemon | None] = [None] * n

    async def start(nursery: trio.Nursery, i: int) -> None:
        own = {"NAVI_DATA_DIR": str(tmp_path / f"data{i}")} if separate else {}
        log = tmp_path / f"daemon{i}.log"
        started[i] = await nursery.start(_serving, {**base, **own}, llm_url, log, forked)

    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as starting:  # at once: a start is mostly waiting
            for i in range(n):
                starting.start_soon(start, nursery, i)
        yield [d for d in started if d is not None]
        nursery.cancel_scope.cancel()


async def _serving(
    env: dict[str, str],
    llm_url: str,
    log: Path,
    forked: bool,
    *,
    task_status: trio.TaskStatus[Daemon],
) -> None:
    """`navi_serve` (`forked`: forked from the warm fork server, a process of its own that
    takes SIGSTOP and SIGKILL) as a task: started once it listens, killed when
    cancelled."""
    async with navi_serve(env, llm_url, log, forked=forked) as daemon:
        task_status.started(daemon)
        await trio.sleep_forever()


def cli_env(tmp_path: Path, pg_url: str, daemon: Daemon | None = None) -> dict[str, str]:
    """The environment of `navi` commands an operator types on the shared database: on
    `daemon`'s machine (its data folder) when given, else on a machine of their own."""
    home = tmp_path / "operator"
    data = {"NAVI_DATA_DIR": str(daemon.data_dir)} if daemon is not None else {}
    return {**clean_env(home), "NAVI_DB": pg_url, **data}


async def navi_users(env: dict[str, str], *args: str) -> str:
    """``navi users ARGS`` in a process of its own; its output (it must succeed)."""
    with trio.fail_after(CLI_LIMIT):
        done = await trio.run_process(
            [sys.executable, "-m", "navi_trio", "users", *args],
            capture_stdout=True, capture_stderr=True, check=False, env=env,
        )  # fmt: skip
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout.decode()


async def add_user(
    env: dict[str, str], name: str, role: str = "user", *, forked: bool = False
) -> str:
    """A new user made with `navi users add` (`forked`: forked from the warm fork server,
    `forked_users`); the token it printed (once)."""
    out = await (forked_users if forked else navi_users)(env, "add", name, "--role", role)
    return out.strip().splitlines()[-1]


async def rotate_user(env: dict[str, str], name: str) -> str:
    """`navi users rotate NAME`; the new token it printed."""
    return (await navi_users(env, "rotate", name)).strip().splitlines()[-1]


async def store_user(where: dict[str, str] | str, name: str, role: str = "user") -> str:
    """A new user written to the store an environment names (or a NAVI_DB value: a
    SQLite file, a database URL), as `navi users add` writes one, in this process (that
    command's own tests: test_api_daemon's test_users_add_list_rotate_remove, and
    test_store_postgres on a server's database); their token. No process: a test that
    only needs a user saves a Python start."""
    env = {"NAVI_DB": where} if isinstance(where, str) else where
    token = new_token()
    async with open_store(Settings.from_env(env)) as store:
        await store.create_user(name, token, role)
    return token


async def forked_users(env: dict[str, str], *args: str) -> str:
    """`navi_users`, forked from the warm fork server: a process of its own, without a
    new interpreter's start."""
    with trio.fail_after(CLI_LIMIT):
        proc = await navi_forks.start("users", *args, env=env, cwd=Path.cwd())
        code, out, err = await navi_forks.communicate(proc)
    assert code == 0, (args, out, err)
    return out.decode()


@asynccontextmanager
async def connect_as(url: str, token: str) -> AsyncIterator[Client]:
    """A WebSocket client of `url` whose hello with `token` was welcomed."""
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


def run_out(url: str, owner: str) -> None:
    """What a pause of daemon `owner` past its TTL leaves in the database, without the
    wait: the leases it holds (not released) and its own row expire now, by the server's
    clock, in one transaction. Its own clock has not run out: on resuming, what it does
    in those sessions is fenced by the database alone. Waits for a row lock the paused
    daemon's open transaction holds until the server ends that (its idle timeout)."""
    now = "extract(epoch FROM clock_timestamp())"
    sql(url, f"WITH l AS (UPDATE leases SET expires_at = {now} WHERE owner = %s"
             f" AND expires_at > {now}) UPDATE daemons SET expires_at = {now}"
             f" WHERE owner = %s AND expires_at > {now}", (owner, owner))  # fmt: skip
