"""Fencing across real daemons: a `navi serve` paused with SIGSTOP past its lease, whose
session another daemon took over meanwhile, has every late write refused when it resumes
(SIGCONT): the history holds each message once, the paused daemon's late answer not at
all, and its client is told why. Nor does it run a tool call, write its scratchpad, or
publish a frame to another daemon's clients after it comes back: every effect of a run
is fenced, not only the history.

Real processes, real PostgreSQL, real time: the only wait is for the lease to run out,
read from the lease row itself (the server's clock). Every test under `trio.fail_after`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from daemons import connect_as, history, lease, pg_daemons, store_user
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql

from navi_trio.store.repair import PLACEHOLDER_CONTENT
from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 120
TTL = 1.5  # NAVI_LEASE_TTL_SEC of both daemons


async def wait_lease_expired(url: str, sid: str) -> None:
    """Until `sid`'s lease, as it is now, has run out by the database's clock: it has
    expired, or a peer has taken it over already (a later generation). A peer looks
    for abandoned sessions every half TTL, its owner's daemon row having run out too,
    so it may well come before the test's next message: the same takeover."""
    held = lease(url, sid)
    assert held is not None
    await trio.sleep(max(0.0, float(held[2]) - float(held[4])) + 0.3)
    row = lease(url, sid)
    assert row is not None and (float(row[2]) < float(row[4]) or row[3] > held[3]), (held, row)


def end_of(text: str) -> Callable[[dict[str, Any]], bool]:
    """The end of the run that answered `text`. Not merely the session's next end: where
    the peer's sweep took the session over first, the end of the paused daemon's turn
    (an error, no text) comes to the peer's clients before it."""
    return lambda f: f["type"] == "stream_end" and f.get("text") == text


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
            pg_daemons(tmp_path, pg_url, llm.url, 2, NAVI_LEASE_TTL_SEC=str(TTL), forked=True) as (
                a,
                b,
            ),
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
                    end = await on_b.until(end_of("answer from B"))
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


async def test_a_paused_daemon_runs_no_call_writes_nothing_and_publishes_nothing_after_a_takeover(
    tmp_path: Path, pg_url: str
) -> None:
    """A's turn holds a batch of calls (a terminal call, a scratchpad write, a second
    terminal call); A is paused during the first until its lease runs out, and a
    message through B takes the session over. When A comes back, it runs no call more
    (the second terminal call's file line never appears), writes nothing (the
    scratchpad), publishes nothing more (a client following on C never gets A's late
    frames) and asks its model nothing more; its own client is told once why."""
    gate = "while [ ! -e go ]; do sleep 0.05; done; echo one >> marks"
    replies: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {"name": "terminal", "arguments": {"action": "run", "command": gate}},
                {"name": "scratchpad", "arguments": {"action": "write", "content": "A was here"}},
                {
                    "name": "terminal",
                    "arguments": {"action": "run", "command": "echo two >> marks"},
                },
            ]
        },  # fmt: skip
        {"text": "answer from B"},
        {"text": "A again, now the owner"},
        {"text": "never asked"},
    ]
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(
                tmp_path,
                pg_url,
                llm.url,
                3,
                separate=True,
                NAVI_LEASE_TTL_SEC=str(TTL),
                forked=True,
            ) as (a, b, c),  # fmt: skip
        ):
            token = await store_user(pg_url, "alice")
            sid = "alice.fenced"
            folder = a.data_dir / "sessions" / sid  # A's machine
            async with connect_as(a.url, token) as on_a, connect_as(b.url, token) as on_b:
                made = await on_a.request({"type": "message", "session_id": sid, "content": "do"})
                assert made["type"] == "session", made
                async with connect_as(c.url, token) as on_c:
                    sub = await on_c.request({"type": "subscribe", "session_id": sid})
                    assert sub["type"] == "ok", sub
                    started = await on_a.until_type("tool_started", session_id=sid)
                    assert started["name"] == "terminal", started
                    os.kill(a.pid, signal.SIGSTOP)
                    try:
                        await wait_lease_expired(pg_url, sid)
                        ok = await on_b.request(
                            {"type": "message", "session_id": sid, "content": "take over"}
                        )
                        assert ok["type"] == "ok", ok
                        end = await on_b.until(end_of("answer from B"))
                        assert end["reason"] == "complete", end
                        (folder / "go").touch()  # A's first call may end now
                    finally:
                        os.kill(a.pid, signal.SIGCONT)
                    end = await on_a.until_end(sid)
                    assert end["reason"] == "error", end
                    # A, the owner again: its frames reach C after any late ones it sent.
                    await on_a.request({"type": "message", "session_id": sid, "content": "again"})
                    end = await on_c.until(
                        lambda f: (
                            f["type"] == "stream_end" and f.get("text") == "A again, now the owner"
                        )
                    )
                    assert end["reason"] == "complete", end
                for client in (on_a, on_c):
                    names = [f["name"] for f in client.frames if f["type"] == "tool_started"]
                    assert "scratchpad" not in names and names.count("terminal") <= 1, names
                    done = [f for f in client.frames if f["type"] == "tool_result" and f["ok"]]
                    assert done == [], done
                late = [f for f in on_a.frames if f["type"] == "error"]
                assert [e["code"] for e in late] == ["session_busy"], late
                assert "taken over" in late[0]["message"], late
            marks = (folder / "marks").read_text() if (folder / "marks").exists() else ""
            assert "two" not in marks, marks
            pad = sql(pg_url, "SELECT value FROM kv WHERE scope = 'scratchpad'")
            assert not any("A was here" in str(row[0]) for row in pad), pad
            assert len(llm.chat_requests) == 3  # A asked nothing after its batch
            contents = [content for role, content in history(pg_url, sid)]
            assert "answer from B" in contents and "A again, now the owner" in contents
            results = [content for role, content in history(pg_url, sid) if role == "tool"]
            assert results == [PLACEHOLDER_CONTENT] * 3, results
