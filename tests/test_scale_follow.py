"""Following a session across daemons (docs/pages/scaling.md, "Events reach every
daemon").

Two or three real `navi serve` processes on one PostgreSQL, each with a data folder of
its own (as machines have), users added through one daemon's CLI and their tokens used
on every daemon; a fake LLM over real HTTP. Waits are for frames, lines and processes,
never sleeps; every test under `trio.fail_after`; every process is killed on the way out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client
from daemons import add_user, cli_env, connect_as, pg_daemons
from pg_server import pg_url_with_schema as pg_url_with_schema

from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow

TIMEOUT = 120
WORDS = 60


def long_text(n: int = WORDS) -> str:
    return " ".join(f"w{i}" for i in range(n))


def texts(c: Client, sid: str) -> str:
    return "".join(
        f["text"] for f in c.frames if f["type"] == "text_delta" and f.get("session_id") == sid
    )


async def test_a_client_that_joins_on_another_daemon_mid_run_gets_resync_and_the_live_frames(
    tmp_path: Path, pg_url: str
) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "first"},
        {"text": long_text(), "delay_chunk": 0.1},
    ]
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 2, separate=True, forked=True) as (a, b),
        ):
            token = await add_user(cli_env(tmp_path, pg_url, a), "alice", forked=True)
            async with connect_as(a.url, token) as on_a, connect_as(b.url, token) as on_b:
                made = await on_a.request({"type": "message", "content": "first"})
                sid = made["session_id"]
                assert (await on_a.until_end(sid))["reason"] == "complete"
                ok = await on_a.request({"type": "message", "session_id": sid, "content": "second"})
                assert ok["type"] == "ok", ok
                await on_a.until_type("text_delta", session_id=sid)
                sub = await on_b.request({"type": "subscribe", "session_id": sid, "last_seq": 0})
                assert sub["type"] == "ok", sub
                first = await on_b.until(lambda f: f.get("session_id") == sid and "seq" in f)
                assert first["type"] == "resync", first
                # A relays to B now: the rest of the answer needs no pacing (held, then
                # let go: it comes at once).
                release = llm.hold_after(0)
                await llm.wait_held()
                release.set()
                end = await on_b.until_end(sid)
                assert (end["reason"], end["text"]) == ("complete", long_text()), end
                assert long_text().endswith(texts(on_b, sid)) and texts(on_b, sid), texts(on_b, sid)
