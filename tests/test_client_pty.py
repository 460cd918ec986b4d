"""`navi chat` driven in a pseudo-terminal (pexpect) against the in-process stand-in daemon.

Rules: loopback only, port 0; the stand-in (tests/chat_standin.py) runs in this test's
trio loop and the blocking pexpect calls run in a worker thread; every expect has its
own timeout and the whole test an absolute deadline. Nothing sleeps: each step waits
for what the screen (or the stand-in) shows.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest
import trio
from chat_standin import StandIn

from navi_trio.settings import REPO_ROOT

DEADLINE = 60
EXPECT = 15

pytestmark = pytest.mark.slow


def _spawn(url: str, tmp_path: Path, *extra: str) -> pexpect.spawn:
    env = {
        **os.environ,
        "TERM": "xterm",
        "PROMPT_TOOLKIT_NO_CPR": "1",  # pexpect never answers cursor-position requests
        "NAVI_DATA_DIR": str(tmp_path / "data"),
        "NAVI_TOKEN": "",
        "PYTHONPATH": str(REPO_ROOT),
    }
    args = ["-m", "navi_trio", "chat", "--url", url, *extra]
    return pexpect.spawn(
        sys.executable,
        args,
        env=env,
        dimensions=(40, 110),
        encoding="utf-8",
        timeout=EXPECT,
        cwd=str(tmp_path),
    )


async def _in_thread(fn: Any, *args: Any) -> Any:
    return await trio.to_thread.run_sync(fn, *args)


async def test_chat_in_a_terminal_answers_cards_stops_helps_and_quits(tmp_path: Path) -> None:
    daemon = StandIn(token="t0k")
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.serve)
            child = await _in_thread(_spawn, daemon.url, tmp_path, "--token", "t0k")
            try:
                await _in_thread(child.expect, "connected to stand-in")
                # A run with thinking, a plan, a tool card and a Markdown answer.
                await _in_thread(child.sendline, "tool")
                await _in_thread(child.expect, r"✻ thinking… \(5 words\)")
                await _in_thread(child.expect, r"⏺ terminal")
                await _in_thread(child.expect, r"│ README\.md")
                await _in_thread(child.expect, r"✔ terminal.*1\.2s")
                await _in_thread(child.expect, r"Plan.*2/2")
                await _in_thread(child.expect, r"The folder holds .*README\.md.* only\.")
                await _in_thread(child.expect, r"model stand-in-model · context 321 tokens")
                # A run that waits: a message typed meanwhile is queued; Ctrl-C sends stop.
                await _in_thread(child.sendline, "wait")
                await daemon.wait_for("message", content="wait")
                await _in_thread(child.sendline, "and then?")
                await _in_thread(child.expect, r"queued #1")
                await _in_thread(child.send, "\x03")
                await _in_thread(child.expect, r"stopping the run")
                stop = await daemon.wait_for("stop")
                assert stop["session_id"] == "s-1"
                await _in_thread(child.expect, r"■ stopped")
                # Slash commands.
                await _in_thread(child.sendline, "/help")
                await _in_thread(child.expect, r"/resume ID")
                await _in_thread(child.sendline, "/bogus")
                await _in_thread(child.expect, r"unknown command /bogus: type /help")
                await _in_thread(child.sendline, "/quit")
                await _in_thread(child.expect, pexpect.EOF)
                child.close()
                assert child.exitstatus == 0
            finally:
                if child.isalive():
                    child.terminate(force=True)
            nursery.cancel_scope.cancel()


async def test_a_bad_token_in_a_terminal_is_one_line_and_exit_1(tmp_path: Path) -> None:
    daemon = StandIn(token="t0k")
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.serve)
            child = await _in_thread(_spawn, daemon.url, tmp_path, "--token", "nope")
            try:
                await _in_thread(child.expect, r"navi: error: the daemon refused the token")
                # Where the local admin's token is (a token was given: leave it out).
                local_token = str(tmp_path / "data" / "local-token")
                await _in_thread(child.expect_exact, f"admin's token is in {local_token}")
                await _in_thread(child.expect, r"leave out --token and NAVI_TOKEN")
                await _in_thread(child.expect, pexpect.EOF)
                assert "(unauthorized)" not in child.before  # the wire code is not news here
                child.close()
                assert child.exitstatus == 1
            finally:
                if child.isalive():
                    child.terminate(force=True)
            nursery.cancel_scope.cancel()


async def test_sigint_warns_ctrl_d_quits_and_the_token_file_is_used(tmp_path: Path) -> None:
    daemon = StandIn(token="from-file")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "local-token").write_text("from-file\n")
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.serve)
            child = await _in_thread(_spawn, daemon.url, tmp_path)
            try:
                await _in_thread(child.expect, "connected to stand-in")
                # A SIGINT from outside the prompt is handled like Ctrl+C typed at it.
                await _in_thread(child.kill, signal.SIGINT)
                await _in_thread(child.expect, "press Ctrl\\+C again or Ctrl\\+D to quit")
                await _in_thread(child.send, "\x04")
                await _in_thread(child.expect, pexpect.EOF)
                child.close()
                assert child.exitstatus == 0
            finally:
                if child.isalive():
                    child.terminate(force=True)
            nursery.cancel_scope.cancel()


async def test_piped_input_is_sent_and_the_chat_waits_for_the_answer_before_quitting(
    tmp_path: Path,
) -> None:
    daemon = StandIn(token="t0k")
    env = {**os.environ, "NAVI_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO_ROOT)}
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.serve)
            done = await trio.run_process(
                [sys.executable, "-m", "navi_trio", "chat", "--url", daemon.url, "--token", "t0k"],
                stdin=b"/tasks\nhi from a script\n",
                capture_stdout=True,
                capture_stderr=True,
                env=env,
                check=False,
            )
            nursery.cancel_scope.cancel()
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "you said: hi from a script" in out
    assert "t-1 terminal: running" in out
