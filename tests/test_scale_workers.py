"""`navi serve --workers N`: N daemon processes on one port over one PostgreSQL,
supervised.

- without PostgreSQL, `--workers 2` is refused with one line saying why;
- with it, once the supervisor says "listening" every worker serves the port, a worker
  killed with SIGKILL is started again and its replacement serves the port, and a
  session a dead worker ran is taken over at the next message.

Which worker's socket the kernel picks for a connection is a hash (chance), so no
assertion rests on it: the test pauses the supervisor (SIGSTOP) and kills a worker,
leaving one listener, which then must serve every connection.

Real processes on 127.0.0.1, real PostgreSQL; every wait is for a line, a frame or a
process (a pidfd), under `trio.fail_after`. Every process is killed and reaped on the
way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TextIO, cast

import pytest
import trio
from api_ws import Client
from daemons import history, no_plan_config
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql
from reliability import clean_env
from trio_websocket import open_websocket_url

from navi_trio.api.auth import read_local_token
from navi_trio.cli import workers
from navi_trio.testing import open_fake_llm
from navi_trio.testing.lifeline import watching

pytestmark = pytest.mark.slow
TIMEOUT = 180


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
    async with watching(proc.pid):  # it stops the supervisor if this process dies
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


async def exited(pid: int) -> None:
    """Until process `pid` (not our child) has exited: its pidfd turns readable once it
    is a zombie, after the kernel closed its files (its listening socket among them)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone already
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


@asynccontextmanager
async def alone(proc: trio.Process, victim: int) -> AsyncIterator[None]:
    """The supervisor paused (SIGSTOP: it starts no worker until SIGCONT) and the worker
    `victim` killed: the one worker left is the only listener on the port."""
    proc.send_signal(signal.SIGSTOP)
    try:
        os.kill(victim, signal.SIGKILL)
        await exited(victim)
        yield
    finally:
        proc.send_signal(signal.SIGCONT)


async def served_by(pg_url: str, url: str, token: str, sid: str, text: str) -> int:
    """Send `text` to `sid` through the port; the pid of the worker that ran it."""
    async with client(url, token) as c:
        ok = await c.request({"type": "message", "session_id": sid, "content": text})
        assert ok["type"] in ("ok", "session"), ok  # "session": it was created
        assert (await c.until_end(sid))["reason"] == "complete"
    ((pid,),) = sql(pg_url, "SELECT pid FROM leases WHERE session_id = %s", (sid,))
    return int(pid)


async def test_workers_share_the_port_and_a_killed_one_is_replaced(
    tmp_path: Path, pg_url: str
) -> None:
    # Which listening socket the kernel gives a connection is a hash: chance. So the test
    # leaves the kernel no choice: with one worker killed and the supervisor paused (no
    # replacement yet), every connection reaches the one worker left listening.
    env = clean_env(tmp_path, NAVI_CONFIG=str(no_plan_config(tmp_path)))
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
            # "listening": both workers listen. One of them (the kernel's pick) runs this.
            victim = await served_by(pg_url, url, token, "admin.w0", "hi")
            assert victim in first
            (other,) = first - {victim}

            async with alone(proc, victim):
                # Only the other worker listens: it serves the port, and the dead
                # worker's session goes on in it at the next message.
                assert await served_by(pg_url, url, token, "admin.w1", "hi") == other
                assert await served_by(pg_url, url, token, "admin.w0", "again") == other

            # The supervisor starts a worker in the victim's place.
            line = await lines.next()
            assert line.startswith("navi: worker ") and "started again (pid " in line, line
            replacement = int(line.rsplit("(pid ", 1)[1].rstrip(")"))
            assert children(proc.pid) == {other, replacement}

            async with alone(proc, other):
                # The replacement serves the port (the only listener left).
                assert await served_by(pg_url, url, token, "admin.w2", "hi") == replacement
                assert await served_by(pg_url, url, token, "admin.w0", "and") == replacement
            line = await lines.next()
            assert "started again (pid " in line, line
            assert history(pg_url, "admin.w0") == [
                ("user", "hi"), ("assistant", "done"), ("user", "again"), ("assistant", "done"),
                ("user", "and"), ("assistant", "done"),
            ]  # fmt: skip
        assert proc.returncode == 0


# A stand-in worker: the first start exits without a word (it never listened); the next
# one notes that it listens, says so, and waits for its SIGTERM.
STANDIN = """
import pathlib, signal, sys, time
marks = pathlib.Path(sys.argv[1])
if not marks.exists():
    marks.write_text("")
    sys.exit(1)
marks.write_text("listening")
print("navi: listening", flush=True)
signal.sigwait([signal.SIGTERM])
"""


class Seen:
    """The supervisor's stdout; for each line, whether the worker listened by then."""

    def __init__(self, marks: Path) -> None:
        self.marks = marks
        self.lines: list[tuple[str, bool]] = []
        self.said = trio.Event()

    def write(self, text: str) -> int:
        if text.strip():
            self.lines.append((text.strip(), self.marks.read_text() == "listening"))
            self.said.set()
        return len(text)

    def flush(self) -> None:
        pass


async def test_the_supervisor_says_listening_only_once_every_worker_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers, "RESTART_FIRST_SEC", 0.0)  # no real wait before the restart
    script, marks = tmp_path / "standin.py", tmp_path / "marks"
    script.write_text(STANDIN)
    seen = Seen(marks)
    argv = [sys.executable, str(script), str(marks)]
    supervisor = workers.Supervisor(argv, 1, cast(TextIO, seen))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(supervisor.run, "127.0.0.1", 0)
            while not any("listening on" in line for line, _ in seen.lines):
                seen.said = trio.Event()
                await seen.said.wait()
            os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's own stop: its workers go too
    ((line, listened),) = [(line, was) for line, was in seen.lines if "listening on" in line]
    assert line.startswith("navi: listening on ws://127.0.0.1:") and line.endswith("(1 workers)")
    assert listened, seen.lines  # said only once the restarted worker listened
    assert seen.lines[0][0].startswith("navi: worker 1 started again (pid ")
