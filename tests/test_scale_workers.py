"""`navi serve --workers N` (issue 20 "Many cores on one machine"): N daemon processes
on one port over one PostgreSQL, supervised.

- without PostgreSQL, `--workers 2` is refused with one line saying why;
- with it, connections on the one port are spread over both workers (the sessions'
  leases name both pids), a worker killed with SIGKILL is started again, and a session
  it was running is taken over by a worker at the next message.

Real processes on 127.0.0.1, real PostgreSQL; every wait is for a line, a frame or a
process, under `trio.fail_after`. Every process is killed and reaped on the way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from api_ws import Client
from daemons import history, no_plan_config
from pg_server import pg_server as pg_server
from pg_server import pg_url as pg_url
from pg_server import sql
from reliability import clean_env
from trio_websocket import open_websocket_url

from navi_trio.api.auth import read_local_token
from navi_trio.testing import open_fake_llm

TIMEOUT = 180
CLIENTS = 16  # all on one worker by chance: 2 / 2**16


def children(pid: int) -> set[int]:
    """`pid`'s child processes (of any of its threads: trio starts them from one)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found |= {int(p) for p in (task / "children").read_text().split()}
        except FileNotFoundError:
            continue  # a thread that just ended
    return found


class Lines:
    """The supervisor's stdout, a line at a time."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> str:
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some()
            assert chunk, f"the supervisor closed its output; it printed {self.buffer!r}"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


@asynccontextmanager
async def supervisor(env: dict[str, str], llm_url: str, log: Path) -> AsyncIterator[
    tuple[trio.Process, Lines, str]
]:  # fmt: skip
    with log.open("ab") as err:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "navi_trio", "serve", "--workers", "2", "--port", "0",
             "--llm-url", llm_url, "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=err, env=env,
        )  # fmt: skip
    assert proc.stdout is not None
    workers: set[int] = set()
    try:
        lines = Lines(proc.stdout)
        line = await lines.next()
        assert line.startswith("navi: listening on ws://127.0.0.1:"), line
        assert line.endswith("(2 workers)"), line
        workers = children(proc.pid)
        yield proc, lines, line.split()[3]
    finally:
        workers |= children(proc.pid) if proc.returncode is None else set()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)  # the supervisor stops its workers
        with trio.CancelScope(shield=True):
            with trio.move_on_after(60):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            for pid in workers:  # never left behind, whatever happened above
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            await proc.stdout.aclose()


@asynccontextmanager
async def client(url: str, token: str) -> AsyncIterator[Client]:
    async with open_websocket_url(url) as ws:
        c = Client(ws)
        await c.send({"type": "hello", "token": token})
        assert (await c.next())["type"] == "welcome"
        yield c


async def test_workers_above_one_are_refused_without_postgresql(tmp_path: Path) -> None:
    env = clean_env(tmp_path)  # NAVI_DB: a SQLite file
    with trio.fail_after(TIMEOUT):
        done = await trio.run_process(
            [sys.executable, "-m", "navi_trio", "serve", "--workers", "2", "--port", "0",
             "--llm-url", "http://127.0.0.1:9"],
            env=env, capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "--workers 2 needs a database the workers share" in lines[0]
    assert "postgresql://" in lines[0]
    assert done.stdout == b""


async def test_workers_share_the_port_and_a_killed_one_is_replaced(
    tmp_path: Path, pg_url: str
) -> None:
    env = clean_env(
        tmp_path, NAVI_CONFIG=str(no_plan_config(tmp_path)), NAVI_WS_CONNECTIONS_PER_USER="64"
    )
    env["NAVI_DB"] = pg_url
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm([{"text": "done"}], loop=True) as llm,
            supervisor(env, llm.url, tmp_path / "supervisor.log") as (proc, lines, url),
        ):
            first = children(proc.pid)
            assert len(first) == 2, first
            token = read_local_token(Path(env["NAVI_DATA_DIR"]))
            assert token is not None
            sids = [f"admin.w{n}" for n in range(CLIENTS)]
            for sid in sids:
                async with client(url, token) as c:
                    await c.request({"type": "message", "session_id": sid, "content": "hi"})
                    assert (await c.until_end(sid))["reason"] == "complete"
            owners = dict(sql(pg_url, "SELECT session_id, pid FROM leases"))
            assert set(owners) == set(sids)
            assert set(owners.values()) == first  # both workers took connections

            # SIGKILL one worker: the supervisor starts another in its place.
            victim = min(first)
            os.kill(victim, signal.SIGKILL)
            line = await lines.next()
            assert line.startswith("navi: worker ") and "started again" in line, line
            now = children(proc.pid)
            assert len(now) == 2 and victim not in now and (first - {victim}) < now, now

            # A session the dead worker ran goes on in a live one at the next message.
            sid = next(s for s, pid in owners.items() if pid == victim)
            async with client(url, token) as c:
                ok = await c.request({"type": "message", "session_id": sid, "content": "again"})
                assert ok["type"] == "ok", ok
                assert (await c.until_end(sid))["reason"] == "complete"
            (pid,) = sql(pg_url, "SELECT pid FROM leases WHERE session_id = %s", (sid,))[0]
            assert pid in now
            assert history(pg_url, sid) == [
                ("user", "hi"), ("assistant", "done"), ("user", "again"), ("assistant", "done")
            ]  # fmt: skip
        assert proc.returncode == 0
