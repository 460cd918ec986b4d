"""`navi chat` in a pseudo-terminal against a real `navi serve`: where the real prompt
matters (what lands on it, and when), and what the chat says while it waits.

Rules: those of tests/test_client_real.py, whose helpers this uses (loopback only, the
daemon and the chat forked from the warm fork server, the fake LLM in this test's loop,
pexpect in worker threads, an expect timeout on every step and an absolute deadline on
every test, every process killed at the end). Nothing sleeps: each step waits for what
the screen, the fake LLM or the daemon shows.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import navi_forks
import pytest
import trio
from daemons import no_plan_config
from test_cli import messages
from test_client_real import DEADLINE, Chat, _cat, _release, fake_llm, forked_chat
from test_client_real import env as env

pytestmark = pytest.mark.slow


@pytest.fixture
def plain(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """`env` with the shipped config minus the first message's plan (plain replies)."""
    return {**env, "NAVI_CONFIG": str(no_plan_config(tmp_path))}


def users(saved: list[dict[str, object]]) -> list[object]:
    return [m.get("content") for m in saved if m.get("role") == "user"]


@asynccontextmanager
async def first_turn(
    env: dict[str, str], tmp_path: Path, text: str, *replies: dict[str, Any]
) -> AsyncIterator[tuple[Chat, str]]:
    """A chat in a terminal with a real daemon, after its first message `text` was
    answered (the first of `replies`): the chat and its session id."""
    async with (
        fake_llm(*replies) as llm,
        navi_forks.serving(env, llm.url) as daemon,
        forked_chat(env, tmp_path, "--url", daemon.url.rstrip("/")) as c,
    ):
        await c.expect("connected to")
        await c.line(text)
        sid = (await c.expect(r"session (s-[0-9a-f]+)")).group(1)
        await c.expect(r"context \d+ tokens")
        yield c, sid


async def test_a_chat_rewind_puts_the_removed_message_on_the_very_next_prompt(
    plain: dict[str, str], tmp_path: Path
) -> None:
    replies = ({"text": "Sure, done."}, {"text": "Again."})
    with trio.fail_after(DEADLINE):
        text = "Create hello.txt containing hi"
        async with first_turn(plain, tmp_path, text, *replies) as (c, sid):
            await c.line("/rewind -1 chat")
            await c.expect(r"apply it\? \(y/n\)")
            await c.line("y")
            await c.expect(r"rewound: 2 message\(s\) removed")
            # The prompt drawn after `y` holds the removed message (nothing else shows
            # it again: the rewind's reload is silent); typed on, it is sent with what
            # was added (on the prompt after, it would not be).
            await c.expect(r"Create hello\.txt containing hi")
            await c.line(" again")
            await c.expect(r"Again\.")
            assert "missed part of the stream" not in c.screen  # the rewind's own reload
            assert await c.quit() == 0
        saved = await messages(Path(plain["NAVI_DB"]), sid)
        assert users(saved) == ["Create hello.txt containing hi again"]


async def test_a_refused_message_comes_back_on_the_prompt_and_a_bad_profile_is_refused_at_once(
    env: dict[str, str], tmp_path: Path
) -> None:
    busy = {**env, "NAVI_CONFIG": str(no_plan_config(tmp_path, on_busy="reject"))}
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    replies = [_cat(fifo, "Let me look."), {"text": "done looking"}, {"text": "Got it."}]
    try:
        with trio.fail_after(DEADLINE):
            async with (
                fake_llm(*replies) as llm,
                navi_forks.serving(busy, llm.url) as daemon,
                forked_chat(busy, tmp_path, "--url", daemon.url.rstrip("/")) as c,
            ):
                await c.expect("connected to")
                await c.line("/profile nosuch")
                await c.expect(
                    r"✗ error: unknown profile 'nosuch': the daemon has coder, general, local, "
                    r"researcher \(the profile is unchanged\)"
                )
                await c.line("look at the fifo")
                sid = (await c.expect(r"session (s-[0-9a-f]+)")).group(1)
                await c.expect(r"⏺ terminal\(")  # the run waits in its tool
                await c.line("and then summarise it")  # refused: the session is busy
                await c.expect(r"✗ error \[session_busy\]: [^\n]*on_busy: reject")
                await c.expect(r"your message is back on the prompt")
                await c.expect(r"and then summarise it")
                await trio.to_thread.run_sync(fifo.write_text, "released\n")
                await c.expect(r"done looking")
                await c.expect(r"context \d+ tokens")
                await c.key("\r")  # the prompt still holds it: Enter sends it
                await c.expect(r"Got it\.")
                assert await c.quit() == 0
            saved = await messages(Path(busy["NAVI_DB"]), sid)
            assert users(saved) == ["look at the fifo", "and then summarise it"]
    finally:
        _release(fifo)


async def test_ctrl_x_c_compacts_the_session_and_keeps_what_was_typed(
    plain: dict[str, str], tmp_path: Path
) -> None:
    replies = ({"text": "Hello."}, {"text": "Noted."})
    with trio.fail_after(DEADLINE):
        async with first_turn(plain, tmp_path, "hello one", *replies) as (c, sid):
            await c.key("partly typed")
            await c.key("\x18")  # Ctrl+X
            await c.key("c")
            await c.expect(r"compacting…")
            # One short turn: the daemon's answer to the compact frame.
            await c.expect(r"nothing to compact: the context is already short")
            await c.key("\r")  # what was typed is on the prompt again: Enter sends it
            await c.expect(r"Noted\.")
            assert await c.quit() == 0
        saved = await messages(Path(plain["NAVI_DB"]), sid)
        assert users(saved) == ["hello one", "partly typed"]
