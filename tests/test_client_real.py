"""`navi chat` in a pseudo-terminal (pexpect) against a REAL `navi serve` subprocess.

Rules: loopback only; the daemon is `navi serve` with its own NAVI_DB and NAVI_DATA_DIR
under tmp_path (the chat finds its local-token file there), and the chat `navi chat` on
a terminal of its own, both forked from the warm fork server (tests/navi_forks.py) but
where a new interpreter is the point (the daemon a chat starts in the background, and
that chat: ``python -m navi_trio``); the fake LLM server runs in this
test's trio loop with replies added step by step; the blocking pexpect calls run in
worker threads. Every expect has its own timeout, every test an absolute deadline, and
every process is killed at the end. Nothing sleeps: each step waits for what the screen,
the fake LLM or the daemon shows.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import navi_forks
import pexpect
import pytest
import trio
from test_cli import forked, messages, unused_port

from navi_trio.client.daemon import log_file, pid_file
from navi_trio.settings import REPO_ROOT
from navi_trio.testing import FakeLLMServer

pytestmark = pytest.mark.slow
DEADLINE = 120
EXPECT = 20
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-B]|\r")

BACKSPACE = re.compile(r"[^\n]\x08")


def _clean(raw: str) -> str:
    """The text a terminal shows for `raw`: escape codes out, backspaced chars erased."""
    text = ANSI.sub("", raw)
    while "\x08" in text:
        shorter = BACKSPACE.sub("", text)
        if shorter == text:
            return text.replace("\x08", "")
        text = shorter
    return text


PLAN = """Complexity: simple
Milestones:
- the folder is known
Steps:
1. Run echo in the terminal — TOOL: terminal
2. Report what it said — SELF
"""


ECHO = "echo hi-from-echo"


def _todo(i: int) -> dict[str, Any]:
    args = {"action": "update", "index": i, "status": "done", "validation": "seen"}
    return {"name": "todo", "arguments": args}


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    """The shared `env` (tests/conftest.py), plus what the terminal client needs."""
    return {
        **env,
        "PYTHONPATH": str(REPO_ROOT),
        "TERM": "xterm",
        "PROMPT_TOOLKIT_NO_CPR": "1",  # pexpect never answers cursor-position requests
    }


@asynccontextmanager
async def fake_llm(*replies: dict[str, Any]) -> AsyncIterator[FakeLLMServer]:
    async with trio.open_nursery() as nursery:
        llm = await nursery.start(FakeLLMServer(replies).serve)
        yield llm
        nursery.cancel_scope.cancel()


class Chat:
    """One `navi chat` process in a pseudo-terminal. `expect` searches the screen text with
    the escape codes removed (rich puts them between words); blocking reads run in a
    worker thread."""

    def __init__(self, child: pexpect.spawn) -> None:
        self.child = child
        self.raw = ""
        self.screen = ""  # everything shown so far, escape codes removed
        self.pos = 0  # where the next expect starts searching

    def _expect(self, pattern: str | None) -> re.Match[str] | None:
        deadline = time.monotonic() + EXPECT
        while True:
            if pattern is not None:
                found = re.compile(pattern).search(self.screen, self.pos)
                if found:
                    self.pos = found.end()
                    return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"not on screen within {EXPECT}s: {pattern!r}\n{self.screen}")
            try:
                self.raw += self.child.read_nonblocking(65536, timeout=left)
            except pexpect.EOF:
                if pattern is None:
                    return None
                raise AssertionError(
                    f"the chat exited before {pattern!r}:\n{self.screen}"
                ) from None
            except pexpect.TIMEOUT:
                continue
            self.screen = _clean(self.raw)

    async def expect(self, pattern: str) -> re.Match[str]:
        found = await trio.to_thread.run_sync(self._expect, pattern)
        assert found is not None
        return found

    async def eof(self) -> int:
        await trio.to_thread.run_sync(self._expect, None)
        await trio.to_thread.run_sync(self.child.close)
        if isinstance(self.child, navi_forks.Terminal):
            return await self.child.proc.wait()
        return int(self.child.exitstatus)

    async def line(self, text: str) -> None:
        await trio.to_thread.run_sync(self.child.sendline, text)

    async def key(self, text: str) -> None:
        await trio.to_thread.run_sync(self.child.send, text)

    async def quit(self) -> int:
        await self.line("/quit")
        return await self.eof()


@asynccontextmanager
async def chat(env: dict[str, str], cwd: Path, *args: str) -> AsyncIterator[Chat]:
    child = await trio.to_thread.run_sync(
        lambda: pexpect.spawn(
            sys.executable,
            ["-m", "navi_trio", "chat", *args],
            env=env,
            dimensions=(50, 160),
            encoding="utf-8",
            timeout=EXPECT,
            cwd=str(cwd),
        )
    )
    try:
        yield Chat(child)
    finally:
        if child.isalive():
            child.terminate(force=True)


@asynccontextmanager
async def forked_chat(env: dict[str, str], cwd: Path, *args: str) -> AsyncIterator[Chat]:
    """`chat`, forked from the warm fork server (tests/navi_forks.py) onto a terminal of
    its own instead of a new interpreter: for a test of what the chat does."""
    child = await navi_forks.on_terminal("chat", *args, env=env, cwd=cwd, rows=50, cols=160)
    try:
        yield Chat(child)
    finally:
        await child.proc.end()
        child.close()


async def test_a_chat_with_the_real_daemon(env: dict[str, str], tmp_path: Path) -> None:
    """Plan, tool cards, queue + Ctrl+C stop, /sessions, /tasks, a background task,
    /compact, an unknown command, quit; then /resume in a second chat replays it all."""
    with trio.fail_after(DEADLINE):
        first_turn: list[dict[str, Any]] = [
            {"text": "Two small steps.\nREFLECT: no"},
            {"text": PLAN},
            {
                "tool_calls": [
                    {"name": "terminal", "arguments": {"action": "run", "command": ECHO}},
                    _todo(1),
                ]
            },
            {"tool_calls": [_todo(2)]},
            {"text": "The terminal said **hi-from-echo**.\n\nBoth steps are done."},
        ]
        async with fake_llm(*first_turn) as llm, navi_forks.serving(env, llm.url) as daemon:
            url = daemon.url.rstrip("/")
            async with forked_chat(env, tmp_path, "--url", url) as c:
                await c.expect(f"connected to navi_trio .* at {url} as local-admin")
                await c.line("echo something in the terminal and tell me what it said")
                sid = (await c.expect(r"session (s-[0-9a-f]+)")).group(1)
                await c.expect(r"Plan 0/2")
                await c.expect(r"⏺ terminal\(")
                await c.expect(r"✔ terminal · \d+\.\ds · hi-from-echo")
                await c.expect(r"Plan 2/2")
                await c.expect(r"The terminal said hi-from-echo\.")
                await c.expect(r"model .* · context \d+ tokens")
                assert c.screen.count("Plan 0/2") == 1  # the plan, then its todo list: shown once

                # A long run: a message typed meanwhile is queued; Ctrl+C stops the run;
                # then the daemon runs the queued message.
                llm.add_replies(
                    {"text": "essay ", "endless": True, "delay_chunk": 0.02},
                    {"text": "A short summary."},
                )
                await c.line("write a long essay")
                await llm.wait_requests(len(llm.requests) + 1)
                await c.line("and then summarise it")
                await c.expect(r"queued #1 and then summarise it")
                await c.key("\x03")
                await c.expect(r"stopping the run")
                await c.expect(r"■ stopped")
                await c.expect(r"A short summary\.")

                # Out-of-band: a background task's updates are notices.
                llm.add_replies(
                    {
                        "tool_calls": [
                            {
                                "name": "terminal",
                                "arguments": {
                                    "action": "run", "command": "echo bg-done", "background": True,
                                },
                            }
                        ]
                    },
                    {"text": "It runs in the background."},
                )  # fmt: skip
                await c.line("run echo in the background")
                await c.expect(r"◆ task \S+ terminal: running")
                await c.expect(r"It runs in the background\.")
                await c.expect(r"◆ task \S+ terminal: completed — bg-done")
                await c.line("/tasks")
                await c.expect(r"\S+ terminal: completed · \d+s")
                await c.line("/sessions")
                await c.expect(rf"{sid} general · \d{{4}}-\d\d-\d\d \d\d:\d\d")
                llm.add_replies({"text": "The user asked for an echo, an essay and a task."})
                await c.line("/compact")
                await c.expect(r"context compressed: \d+ → \d+ tokens")
                await c.line("/bogus")
                await c.expect(r"✗ error: unknown command /bogus: type /help for the list")
                assert await c.quit() == 0
            # The daemon saved the stopped run as a partial answer, and the queued one.
            saved = await messages(Path(env["NAVI_DB"]), sid)
            essay = [m for m in saved if str(m.get("content", "")).startswith("essay")]
            assert essay and essay[0]["partial"] is True
            assert any(m.get("content") == "and then summarise it" for m in saved)

            # A second chat resumes the session: its history is replayed.
            async with forked_chat(env, tmp_path, "--url", url) as c:
                await c.expect("connected to")
                await c.line(f"/resume {sid}")
                await c.expect(r"› echo something in the terminal")
                await c.expect(r"› write a long essay")
                await c.expect(r"› and then summarise it")
                await c.expect(r"messages replayed")
                await c.expect(rf"resumed session {sid}")
                assert await c.quit() == 0


async def test_a_bad_token_and_an_unreachable_llm_are_one_line_each(
    env: dict[str, str], tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE):
        dead_llm = f"http://127.0.0.1:{unused_port()}"
        async with navi_forks.serving(env, dead_llm) as daemon:
            url = daemon.url.rstrip("/")
            async with forked_chat(env, tmp_path, "--url", url, "--token", "nope") as c:
                await c.expect(r"navi: error: the daemon refused the token .*NAVI_TOKEN")
                assert await c.eof() == 1
            async with forked_chat(env, tmp_path, "--url", url) as c:
                await c.expect("connected to")
                await c.line("hi")
                await c.expect(r"✗ error \[\w+\]: [^\n]*127\.0\.0\.1[^\n]*\n")
                error_lines = [ln for ln in c.screen.splitlines() if "✗ error" in ln]
                assert len(error_lines) == 1, c.screen
                await c.expect(r"session s-")  # the status line after the run ended
                await c.line("/resume s-nothere")
                await c.expect(r"✗ error \[not_found\]: no session 's-nothere' — check the id")
                await c.line("/sessions")  # and the chat goes on
                await c.expect(r"/resume ID continues one")
                assert await c.quit() == 0


async def test_no_daemon_answering_starts_a_real_one_in_the_background(
    env: dict[str, str], tmp_path: Path
) -> None:
    port = unused_port()
    data = Path(env["NAVI_DATA_DIR"])
    try:
        with trio.fail_after(DEADLINE):
            async with fake_llm({"text": "hello from the started daemon"}) as llm:
                env = {**env, "OLLAMA_HOST": llm.url}
                async with chat(env, tmp_path, "--url", f"ws://127.0.0.1:{port}") as c:
                    await c.expect(rf"started a navi daemon in the background on .*:{port}")
                    await c.expect(r"connected to navi_trio .* as local-admin")
                    await c.line("hi")
                    await c.expect(r"hello from the started daemon")
                    assert await c.quit() == 0
            log = log_file(data, port).read_text()
            assert f"listening on ws://127.0.0.1:{port}/" in log
            # It outlives the chat, and its pid file (its own, for its port) says the pid
            # the line said.
            pid = int(pid_file(data, port).read_text())
            os.kill(pid, 0)
            assert f"pid {pid}" in c.screen
    finally:
        written = pid_file(data, port)
        if written.exists():
            os.kill(int(written.read_text()), signal.SIGKILL)


def _cat(fifo: Path, text: str = "") -> dict[str, Any]:
    """A reply whose tool call waits until the test writes to `fifo`."""
    call = {"name": "terminal", "arguments": {"action": "run", "command": f"cat {fifo}"}}
    return {"text": text, "tool_calls": [call]}


def _release(fifo: Path) -> None:
    """End a `cat fifo` left waiting (a killed daemon's tool): it reads end of file."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader left


@attrs.define(eq=False)
class Proxy:
    """A TCP forwarder between the chat and the daemon: `cut()` kills every connection
    for real (the daemon goes on); while `gate` is closed new connections wait."""

    target_port: int
    port: int = 0
    live: list[trio.CancelScope] = attrs.field(factory=list)
    gate: trio.Event = attrs.field(factory=trio.Event)

    async def serve(
        self, *, task_status: trio.TaskStatus[Proxy] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        self.gate.set()
        task_status.started(self)
        await trio.serve_listeners(self._handle, listeners)

    def cut(self) -> None:
        self.gate = trio.Event()
        for scope in self.live:
            scope.cancel()
        self.live.clear()

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            await self.gate.wait()
            scope = trio.CancelScope()
            self.live.append(scope)
            with scope:
                server = await trio.open_tcp_stream("127.0.0.1", self.target_port)
                async with server, trio.open_nursery() as nursery:
                    nursery.start_soon(self._pipe, client, server, nursery.cancel_scope)
                    nursery.start_soon(self._pipe, server, client, nursery.cancel_scope)

    @staticmethod
    async def _pipe(src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope) -> None:
        try:
            async for data in src:
                await dst.send_all(data)
        except trio.BrokenResourceError:
            pass
        done.cancel()


async def test_a_connection_cut_mid_run_is_resumed_without_gap_or_duplicate(
    env: dict[str, str], tmp_path: Path
) -> None:
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    words = " ".join(f"w{i}" for i in range(1, 41))
    replies = [
        {"text": "hello there"},
        _cat(fifo),
        {"text": words},
    ]
    with trio.fail_after(DEADLINE):
        async with fake_llm(*replies) as llm, navi_forks.serving(env, llm.url) as daemon:
            port = int(daemon.url.rstrip("/").rsplit(":", 1)[1])
            async with trio.open_nursery() as nursery:
                proxy = await nursery.start(Proxy(port).serve)
                url = f"ws://127.0.0.1:{proxy.port}"
                async with forked_chat(env, tmp_path, "--url", url) as c:
                    await c.expect("connected to")
                    await c.line("hi")
                    await c.expect("hello there")
                    await c.line("cat the fifo, then count to forty")
                    await c.expect(r"⏺ terminal\(")
                    # Mid-run: the tool waits on the fifo. Cut the connection, let the
                    # run finish while the chat cannot reconnect, then let it in.
                    proxy.cut()
                    await c.expect(r"connection lost")
                    await trio.to_thread.run_sync(fifo.write_text, "released\n")
                    await llm.wait_completed(3)
                    proxy.gate.set()
                    await c.expect(r"reconnected")
                    await c.expect(r"✔ terminal · [^\n]*released")
                    await c.expect(r"w40")
                    await c.expect(r"context \d+ tokens")
                    # All of it, once, in order, however the terminal wrapped it.
                    flat = " ".join(c.screen.split())
                    assert flat.count(words) == 1, c.screen
                    assert (flat.count("w1 w2 "), flat.count("w40")) == (1, 1), c.screen
                    assert c.screen.count("✔ terminal") == 1
                    assert await c.quit() == 0
                nursery.cancel_scope.cancel()


async def test_a_restarted_daemon_makes_the_chat_resync_and_go_on(
    env: dict[str, str], tmp_path: Path
) -> None:
    port = unused_port()
    fifo = tmp_path / "never"
    os.mkfifo(fifo)
    # The killed run streamed "Let me look first." (shown as its tool starts) and
    # started a tool that waits forever.
    replies = [{"text": "hello there"}, _cat(fifo, "Let me look first."), {"text": "after it"}]
    try:
        with trio.fail_after(DEADLINE):
            async with fake_llm(*replies) as llm:
                # Both daemons forked (each a process of its own, the first killed for
                # real): the chat gives up after six reconnects (23.5 s), and a new
                # interpreter's start took longer than that at load 30.
                async with navi_forks.serving(env, llm.url, "--port", str(port)) as daemon:
                    url = daemon.url.rstrip("/")
                    async with forked_chat(env, tmp_path, "--url", url) as c:
                        await c.expect("connected to")
                        await c.line("hi")
                        sid = (await c.expect(r"session (s-[0-9a-f]+)")).group(1)
                        await c.expect("hello there")
                        await c.line("look at the fifo")
                        await c.expect(r"⏺ terminal\(")
                        daemon.kill()  # SIGKILL mid-run
                        await daemon.wait()
                        await c.expect(r"connection lost")
                        async with navi_forks.serving(env, llm.url, "--port", str(port)):
                            await c.expect(r"reconnected")
                            await c.expect(r"missed part of the stream: reloading the history")
                            await c.expect(r"› look at the fifo")
                            await c.expect(r"\d+ messages replayed \(turns 2\+\)")
                            assert c.screen.count("hello there") == 1  # not shown again
                            await c.line("and now?")
                            await c.expect(r"after it")
                            await c.expect(rf"session {sid} · ")
                            # The killed run's text: shown before its tool's card, then once
                            # more with its turn from the history, never glued to the next
                            # answer.
                            screen = c.screen
                            assert screen.count("Let me look first.") == 2, screen
                            assert screen.index("Let me look first.") < screen.index("⏺ terminal(")
                            shown = [ln for ln in c.screen.splitlines() if "after it" in ln]
                            assert [ln.strip() for ln in shown] == ["after it"], c.screen
                            assert await c.quit() == 0
    finally:
        _release(fifo)


async def test_piped_lines_go_to_one_session_and_each_gets_its_answer(
    env: dict[str, str], tmp_path: Path
) -> None:
    replies = [{"text": "DIRECT"}, {"text": "first answer"}, {"text": "second answer"}]
    with trio.fail_after(DEADLINE):
        async with fake_llm(*replies) as llm, navi_forks.serving(env, llm.url) as daemon:
            # Forked (quick to its first line): the second line goes out while the first
            # run streams, and the daemon may take it after that run ended, with its ok
            # on the way after the run's first frames; the chat waits for its answer.
            done = await forked(
                "chat", "--url", daemon.url.rstrip("/"),
                # The second line is read before the daemon has named the new session.
                stdin=b"what can you do for me?\nand what else?\n",
                env=env, cwd=tmp_path,
            )  # fmt: skip
    out = done.out
    assert done.code == 0, done.err
    assert "first answer" in out and "second answer" in out, out
    assert len(set(re.findall(r"session (s-[0-9a-f]+)", out))) == 1, out


async def test_a_full_mode_terminal_call_asks_and_y_lets_it_run(
    env: dict[str, str], tmp_path: Path
) -> None:
    """/mode full (the local token is admin): the terminal call runs unsandboxed, so it
    asks; the card shows, y approves it once, and the command really runs."""
    marker = tmp_path / "approved-marker"
    call = {"name": "terminal", "arguments": {"action": "run", "command": f"touch {marker}"}}
    replies: list[dict[str, Any]] = [
        {"text": "DIRECT"},
        {"tool_calls": [call]},
        {"text": "The marker is there."},
    ]
    with trio.fail_after(DEADLINE):
        async with fake_llm(*replies) as llm, navi_forks.serving(env, llm.url) as daemon:
            async with forked_chat(env, tmp_path, "--url", daemon.url.rstrip("/")) as c:
                await c.expect("connected to")
                await c.line("/mode full")
                await c.expect(r"mode full: asked for in your next messages")
                await c.line("create the marker file")
                await c.expect(r"\? approve terminal: [^\n]*touch")
                await c.expect(r"rule: mode full: terminal runs without a sandbox")
                await c.expect(r"mode full · no answer in \d+s is a deny")
                await c.expect(r"y yes · s this session · a always · n no")
                assert not marker.exists()  # it waits for the answer
                await c.line("y")
                await c.expect(r"✔ approved terminal \(once, by owner\)")
                await c.expect(r"✔ terminal · ")
                await c.expect(r"The marker is there\.")
                assert marker.exists()
                assert await c.quit() == 0
