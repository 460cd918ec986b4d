"""Fencing across real daemons (issue 20 "One owner per session"): a `navi serve` paused
with SIGSTOP past its lease, whose session another daemon took over meanwhile, has every
late write refused when it resumes (SIGCONT): the history holds each message once, the
paused daemon's late answer not at all, and its client is told why.

Real processes, real PostgreSQL, real time: the only wait is for the lease to run out,
read from the lease row itself (the server's clock). Every test under `trio.fail_after`.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import trio
from daemons import history, lease, pg_daemons
from pg_server import pg_server as pg_server
from pg_server import pg_url as pg_url

from navi_trio.testing import open_fake_llm

TIMEOUT = 120
TTL = 1.5  # NAVI_LEASE_TTL_SEC of both daemons


async def wait_lease_expired(url: str, sid: str) -> None:
    """Until `sid`'s lease has run out by the database's clock."""
    row = lease(url, sid)
    assert row is not None
    await trio.sleep(max(0.0, float(row[2]) - float(row[4])) + 0.3)
    row = lease(url, sid)
    assert row is not None and float(row[2]) < float(row[4]), row


async def test_a_paused_daemons_late_writes_are_refused_after_a_takeover(
    tmp_path: Path, pg_url: str
) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "late answer from A", "delay_first": 0.5},  # A's run: stopped mid-wait
        {"text": "answer from B"},
    ]
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 2, NAVI_LEASE_TTL_SEC=str(TTL)) as (a, b),
        ):
            async with a.connect() as on_a, b.connect() as on_b:
                sid = "admin.fenced"
                ok = await on_a.request({"type": "message", "session_id": sid, "content": "one"})
                assert ok["type"] == "session", ok
                await llm.wait_requests(1)  # A waits for its model's first chunk
                first = lease(pg_url, sid)
                assert first is not None and first[1] == a.pid
                os.kill(a.pid, signal.SIGSTOP)
                try:
                    await wait_lease_expired(pg_url, sid)
                    # B takes the session over on the next command: a new generation.
                    await on_b.request({"type": "message", "session_id": sid, "content": "two"})
                    end = await on_b.until_end(sid)
                    assert end["reason"] == "complete", end
                    took = lease(pg_url, sid)
                    assert took is not None and took[1] == b.pid and took[3] == first[3] + 1
                finally:
                    os.kill(a.pid, signal.SIGCONT)
                # A resumes, gets its late answer and tries to save it: refused.
                end = await on_a.until_end(sid)
                errors = [f for f in on_a.frames if f["type"] == "error"]
                assert [e["code"] for e in errors] == ["session_busy"], errors
                assert "taken over" in errors[0]["message"], errors
                assert end["reason"] == "error", end
            assert history(pg_url, sid) == [
                ("user", "one"),
                ("assistant", ""),  # A's turn, ended by B when it took over (DEAD_TURN)
                ("user", "two"),
                ("assistant", "answer from B"),
            ]
            # A's lease release at the end of its run took nothing from B.
            after = lease(pg_url, sid)
            assert after is not None and after[3] == took[3] and after[0] == took[0]
