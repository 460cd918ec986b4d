"""`navi chat` as a new user meets it (issue 17), against a REAL `navi serve` subprocess.

What the status line says (the session's profile as the daemon names it, the model, also
after /resume), /compact on a short session, a tool call stopped with Ctrl+C, and the
exit code of a piped chat whose answer failed.

Rules: those of tests/test_client_real.py, whose helpers these are: loopback only, the
daemon (forked, as the chats are) with its own NAVI_DB and NAVI_DATA_DIR under tmp_path,
the fake LLM server in the test's trio loop, blocking pexpect calls in worker threads, a
timeout on every expect and an absolute deadline on every test. Nothing sleeps.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import navi_forks
import pytest
import trio
from test_cli import forked, unused_port
from test_client_real import DEADLINE, env, fake_llm, forked_chat

pytestmark = pytest.mark.slow
__all__ = ["env"]  # the fixture, imported for pytest

MODEL = "fake-m1"
# The line under each answer.
STATUS = r"session (s-[0-9a-f]+) · profile (\S+) · model (\S+) · context \d+ tokens"


async def test_the_status_line_names_the_sessions_profile_and_model_also_after_resume(
    env: dict[str, str], tmp_path: Path
) -> None:
    replies = [
        {"text": "first answer", "model": MODEL},  # "hi" is small talk: no plan first
        {"text": "second answer", "model": MODEL},
        {"text": "third answer", "model": MODEL},
    ]
    with trio.fail_after(DEADLINE):
        async with fake_llm(*replies) as llm, navi_forks.serving(env, llm.url) as daemon:
            url = daemon.url.rstrip("/")
            async with forked_chat(env, tmp_path, "--url", url) as c:
                await c.expect("connected to")
                await c.line("hi")
                await c.expect("first answer")
                status = await c.expect(STATUS)
                sid = status.group(1)
                # The daemon's config names its default profile "general": so does the
                # status line, as /sessions does.
                assert status.group(2, 3) == ("general", MODEL), c.screen
                await c.line("/sessions")
                await c.expect(rf"{sid} general · ")
                assert await c.quit() == 0
            # A second chat resumes it: the next answer's line still knows both.
            async with forked_chat(env, tmp_path, "--url", url) as c:
                await c.expect("connected to")
                await c.line(f"/resume {sid}")
                await c.expect(rf"resumed session {sid}")
                await c.line("and now?")
                await c.expect("second answer")
                status = await c.expect(STATUS)
                assert status.group(1, 2, 3) == (sid, "general", MODEL), c.screen
                # A message with another profile switches the session: the line says so.
                await c.line("/profile coder")
                await c.expect("profile coder: used from your next message")
                await c.line("thanks")  # small talk: no plan in the coder profile either
                await c.expect("third answer")
                status = await c.expect(STATUS)
                assert status.group(1, 2, 3) == (sid, "coder", MODEL), c.screen
                assert await c.quit() == 0
            assert not re.search(r"profile default|model \?", c.screen), c.screen


async def test_compact_on_a_short_session_says_so_once(env: dict[str, str], tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with fake_llm({"text": "short"}) as llm:
            async with navi_forks.serving(env, llm.url) as daemon:
                async with forked_chat(env, tmp_path, "--url", daemon.url.rstrip("/")) as c:
                    await c.expect("connected to")
                    await c.line("hi")
                    await c.expect(STATUS)
                    await c.line("/compact")
                    found = await c.expect(r"nothing to compact[^\n]*\n")
                    line = found.group(0)
                    # One dim line in the daemon's words: no error tag repeating them,
                    # no hint saying the same again.
                    assert line.count("nothing to compact") == 1, line
                    assert line.count("already short") == 1 and "✗ error" not in line, line
                    assert await c.quit() == 0


async def test_a_tool_call_stopped_with_ctrl_c_says_stopped_not_failed(
    env: dict[str, str], tmp_path: Path
) -> None:
    call = {"name": "terminal", "arguments": {"action": "run", "command": "echo up; sleep 60"}}
    replies: list[dict[str, Any]] = [{"text": "DIRECT"}, {"tool_calls": [call]}]
    with trio.fail_after(DEADLINE):
        async with fake_llm(*replies) as llm, navi_forks.serving(env, llm.url) as daemon:
            async with forked_chat(env, tmp_path, "--url", daemon.url.rstrip("/")) as c:
                await c.expect("connected to")
                await c.line("wait a minute")
                await c.expect(r"│ up")
                await c.key("\x03")
                await c.expect(r"⎿ ■ terminal stopped · \d+\.\ds\n")
                await c.expect(r"■ stopped")
                assert "terminal failed" not in c.screen, c.screen
                assert await c.quit() == 0


async def test_a_piped_chat_whose_answer_failed_exits_1(
    env: dict[str, str], tmp_path: Path
) -> None:
    dead_llm = f"http://127.0.0.1:{unused_port()}"
    with trio.fail_after(DEADLINE):
        async with navi_forks.serving(env, dead_llm) as daemon:
            done = await forked("chat", "--url", daemon.url.rstrip("/"), stdin=b"hi\n",
                                env=env, cwd=tmp_path)  # fmt: skip
    out = done.out
    assert "✗ error [llm_connection]" in out, out
    assert done.code == 1, (out, done.err)
