"""A real ``navi serve`` for two users, with the fake LLM scripted step by step.

`served(base, ...)` starts the fake LLM server in this process (real HTTP on 127.0.0.1:
a test adds each reply right before the request that takes it, so several sessions'
requests come in a known order), adds the users with ``navi users add`` (the CLI, on the
daemon's database), then starts ``navi serve`` as its own process on port 0 (tests/
reliability.py) on a data folder under `base`, which lives outside /tmp (the sandbox's
private /tmp would hide a /tmp path anyway). `Served.connect(name)` is a WebSocket
client with that user's token. Everything started is stopped on the way out.

With ``forked=True``, for tests whose subject is what the daemon does and not how a
command or a new interpreter starts: the users are written to the database as that
command writes them (tests/daemons.py `store_user`), and the daemon is forked from the
warm fork server (`navi_serve(forked=True)`), a process of its own all the same, with
its log in the same file. That saves two or three Python starts a test (a second or more each
on a busy machine).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from api_ws import Client
from daemons import add_user, connect_as, store_user
from reliability import Daemon, clean_env, navi_serve

from navi_trio.settings import default_config_path
from navi_trio.testing import FakeLLMServer


@contextmanager
def outside_tmp(prefix: str) -> Iterator[Path]:
    """A folder under /var/tmp (the sandbox's /tmp is private), open to others (a root
    daemon's commands run as another user), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp")).resolve()
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def config_file(
    folder: Path,
    roots: Mapping[str, Sequence[str]] | None,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """The shipped config folder without first-message plans, with `workspace_roots`,
    and whatever `edit` changes in it."""
    shutil.copytree(default_config_path().parent, folder, dirs_exist_ok=True)
    path = folder / default_config_path().name
    data = json.loads(path.read_text(encoding="utf-8"))
    data["profiles"]["general"].update(planning_first_message=False)
    if roots is not None:
        data["workspace_roots"] = {k: list(v) for k, v in roots.items()}
    if edit is not None:
        edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@attrs.define(eq=False)
class Served:
    daemon: Daemon
    fake: FakeLLMServer
    tokens: dict[str, str]
    data_dir: Path

    def session_dir(self, sid: str) -> Path:
        return self.data_dir / "sessions" / sid

    @asynccontextmanager
    async def connect(self, user: str) -> AsyncIterator[Client]:
        async with connect_as(self.daemon.url, self.tokens[user]) as client:
            yield client


@asynccontextmanager
async def served(
    base: Path,
    *,
    users: Sequence[str] = ("alice", "bob"),
    roots: Mapping[str, Sequence[str]] | None = None,
    env: Mapping[str, str] | None = None,
    edit: Callable[[dict[str, Any]], None] | None = None,
    admins: Sequence[str] = (),
    forked: bool = False,
) -> AsyncIterator[Served]:
    data = base / "data"
    extra = {"NAVI_CONFIG": str(config_file(base / "config", roots, edit)), **(env or {})}
    environ = {**clean_env(base, **extra), "NAVI_DB": str(base / "db" / "navi.db")}
    (base / "db").mkdir(exist_ok=True)
    new_user = store_user if forked else add_user
    tokens = {name: await new_user(environ, name) for name in users}
    tokens |= {name: await new_user(environ, name, "admin") for name in admins}
    log = base / "daemon.log"
    async with trio.open_nursery() as nursery:
        fake: FakeLLMServer = await nursery.start(FakeLLMServer().serve)
        async with navi_serve(environ, fake.url, log, forked=forked) as daemon:
            yield Served(daemon, fake, tokens, data)
        nursery.cancel_scope.cancel()


async def send(client: Client, text: str, sid: str | None = None, **fields: Any) -> dict[str, Any]:
    """Send a message; its ``ok`` (after the ``session`` reply of a new session)."""
    frame: dict[str, Any] = {"type": "message", "content": text, **fields}
    if sid is not None:
        frame["session_id"] = sid
    reply = await client.request(frame)
    if reply["type"] == "session":
        reply = await client.until(
            lambda f: f.get("id") == reply.get("id") and f["type"] != "session"
        )
    assert reply["type"] == "ok", reply
    return reply


def results(client: Client, sid: str) -> list[dict[str, Any]]:
    """The tool results of session `sid` the client has seen, in order."""
    return [f for f in client.frames if f["type"] == "tool_result" and f.get("session_id") == sid]
