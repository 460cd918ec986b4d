"""One `navi acp` agent and one fake LLM for the tests of a module that need no fresh
process.

The agent is driven by the official ACP SDK's client (tests/acp_sdk_client.py, in
``--serve`` mode): the client spawns the agent once, initializes it, and then runs each
test's steps as they come on its stdin. The fake LLM runs in a trio loop on a thread of
the test process (`web_browser.Loop`), on 127.0.0.1. Each test gets sessions of its own
(``session/new`` in its steps, its own working folder) and the fake LLM as new, with the
test's replies only. A test that did not see its scenario to the end (a failure, a
timeout), a client or agent that died, or a scenario that saw updates of another's
sessions (a run left going) hands the next test a fresh client and agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import navi_forks
import trio
from daemons import no_plan_config
from web_browser import Loop

CLIENT = Path(__file__).with_name("acp_sdk_client.py")
AGENT = [sys.executable, "-m", "navi_trio", "acp"]
ACP_WARM = navi_forks.AGENTS_WARM  # the fork server that has imported the agent and client


def navi_command(*args: str) -> list[str]:
    """`navi ARGS` forked (tests/navi_forks.py) by a fork server that has imported the
    agent: a process of its own on its caller's stdio, which gets its signals, started in
    a fraction of `AGENT`'s time (a new interpreter). Blocking: the first call starts the
    server."""
    return navi_forks.attach_command(*args, warm=ACP_WARM)


def client_command(*args: str) -> list[str]:
    """`python tests/acp_sdk_client.py ARGS`, forked as `navi_command` forks an agent:
    the SDK's import (~0.7 s of CPU) done once. Blocking, as `navi_command`."""
    return navi_forks.attach_command(*args, warm=ACP_WARM, script=str(CLIENT))


class Lines:
    """JSON lines off a stream; what was read past the last line is kept for the next
    call, on this stream or the one `stream` is set to next."""

    def __init__(self, stream: trio.abc.ReceiveStream | None = None) -> None:
        self.stream = stream
        self.buf = b""

    async def next(self) -> dict[str, Any]:
        assert self.stream is not None
        while b"\n" not in self.buf:
            data = await self.stream.receive_some(65536)
            assert data, "the agent closed stdout"
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    async def until(self, match: Any) -> dict[str, Any]:
        while True:
            message = await self.next()
            if match(message):
                return message


class SharedAgent:
    """The module's client, agent and fake LLM: started when a test first asks, and
    again after a test that left them in doubt (`dirty`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.loop: Loop | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.home = folder
        self.work = folder  # the sessions' folder, the test's
        self.init: dict[str, Any] | None = None  # the initialize's line
        self.lines = Lines()
        self.dirty = False  # a scenario did not end, or saw another's updates
        self.starts = 0
        self.forget = True  # the fake LLM made new for each test (off: to see it matter)

    @property
    def db(self) -> Path:
        return self.home / "navi.db"

    def ready(self, env: dict[str, str], work: Path) -> SharedAgent:
        """Started (again if in doubt), the fake LLM with no script, the sessions' folder
        `work`; `env`: the test's clean environment (its DB, data folder and config are
        replaced by the agent's)."""
        work.mkdir(exist_ok=True)
        self.work = work
        if self.proc is not None and (self.proc.poll() is not None or self.dirty):
            self.close()  # the fake LLM too: what the old agent may still ask goes nowhere
        if self.loop is None:
            self.loop = Loop().start()
        if self.proc is None:
            self.start(env)
        if self.forget:
            self.loop.forget()
            self.loop.call(setattr, self.loop.llm, "loop", True)  # as the old --loop
        return self

    def start(self, env: dict[str, str]) -> None:
        assert self.loop is not None
        self.starts += 1
        self.home = self.folder / f"agent{self.starts}"
        self.home.mkdir()
        env = {
            **env,
            "NAVI_DB": str(self.db),
            "NAVI_DATA_DIR": str(self.home / "data"),
            "NAVI_CONFIG": str(no_plan_config(self.home)),
        }
        agent = navi_command("acp", "--llm-url", self.loop.llm.url)
        path = self.home / "agent.json"
        path.write_text(json.dumps({"agent": agent, "env": env, "cwd": str(self.home)}))
        with open(self.home / "err.log", "ab") as errlog:
            self.proc = subprocess.Popen(
                client_command("--serve", str(path)),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errlog,
                env=env,
            )
        self.init, self.lines, self.dirty = None, Lines(), False

    def err(self) -> str:
        """The tail of the client's and the agent's stderr."""
        log = self.home / "err.log"
        return log.read_text(encoding="utf-8", errors="replace")[-3000:] if log.exists() else ""

    async def run(
        self, steps: Sequence[dict[str, Any]], replies: Sequence[dict[str, Any]] = ()
    ) -> list[dict[str, Any]]:
        """Play `replies` on the fake LLM and `steps` in `work`: one dict per step, the
        initialize's first (as `sdk_client` answers)."""
        assert self.loop is not None and self.proc is not None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if replies:
            await trio.to_thread.run_sync(self.loop.add_replies, *replies)
        self.dirty = True
        send = trio.lowlevel.FdStream(os.dup(self.proc.stdin.fileno()))
        self.lines.stream = trio.lowlevel.FdStream(os.dup(self.proc.stdout.fileno()))
        try:
            if self.init is None:
                self.init = await self.lines.next()
            asked = {"cwd": str(self.work), "steps": list(steps)}
            await send.send_all((json.dumps(asked) + "\n").encode())
            out = [self.init]
            while (line := await self.lines.next())["op"] != "end":
                out.append(line)
        except (AssertionError, trio.BrokenResourceError) as exc:
            raise AssertionError(f"{exc}\n{self.err()}") from exc
        finally:
            send.close()
            self.lines.stream.close()
        self.dirty = line["foreign"] > 0
        return out

    def close(self) -> None:
        """The client's stdin closed: it closes the agent's, which stops its runs and
        exits. A client in doubt is killed at once: the agent sees its stdin close all
        the same. Then the fake LLM's loop stopped."""
        if self.proc is not None:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            if self.dirty:
                self.proc.kill()
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc.stdout.close()
            self.proc = None
        if self.loop is not None:
            self.loop.stop()
            self.loop = None
