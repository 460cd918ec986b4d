"""The agent takes the session lease around every run: a second runtime on the same
database (as a second process would) gets `session_busy`, and the first run's history
is never interleaved with the refused message.

Rules: the fake LLM on 127.0.0.1 (port 0), the store a real SQLite file in tmp_path,
an absolute timeout on each test, no sleeps but on the virtual clock.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import trio
import trio.testing
from realtime import paced

from navi_trio.store.base import LeaseRow
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import open_harness, virtual_wall

TIMEOUT = 30


async def test_a_second_runtime_gets_session_busy_while_the_first_runs(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "first answer", "stall": True}]) as a:
            first = await a.session("s1")
            first.send("hi")
            await first.until_type("text_delta")  # the run is live and holds the lease
            async with open_harness(tmp_path, replies=[{"text": "never"}]) as b:
                frames = await b.turn("s1", "me too")
                assert b.chat_requests == []
            errors = [f for f in frames if f["type"] == "error"]
            assert len(errors) == 1 and errors[0]["code"] == "session_busy"
            assert "'s1' is busy" in errors[0]["message"]
            assert "this process" in errors[0]["message"]
            assert frames[-1]["type"] == "stream_end" and frames[-1]["reason"] == "error"
            first.stop()
            await first.until_end()
            # Released at the end of the run: now the other runtime may run it.
            async with open_harness(tmp_path, replies=[{"text": "second answer"}]) as b:
                frames = await b.turn("s1", "now")
                assert frames[-1]["reason"] == "complete"
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            saved = await store.load_messages("s1")
    assert [(m["role"], m["content"]) for m in saved] == [
        ("user", "hi"), ("assistant", "first answer"),
        ("user", "now"), ("assistant", "second answer"),
    ]  # fmt: skip


async def test_a_run_through_the_session_actor_claims_the_lease_once(tmp_path: Path) -> None:
    # The lease is taken in one place (the agent's run), not again by the actor around it.
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "one"}, {"text": "two"}]) as h:
            store = h.runtime.store
            claim_lease = store.claim_lease
            claims: list[str] = []

            async def counted(session_id: str, **kw: Any) -> LeaseRow:
                claims.append(session_id)
                return await claim_lease(session_id, **kw)

            store.claim_lease = counted  # type: ignore[method-assign]
            assert (await h.turn("s1", "hi"))[-1]["reason"] == "complete"
            assert claims == ["s1"]
            assert (await h.turn("s1", "again"))[-1]["reason"] == "complete"
            assert claims == ["s1", "s1"]


async def test_a_lease_left_by_a_daemon_elsewhere_blocks_its_session_for_one_ttl_of_the_wall_clock(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A daemon on another host died holding a session's lease: the session is busy
    until the lease's TTL has passed on the runtime's wall clock, then it runs, one
    generation on. The store judges the lease by the runtime's one wall clock, here
    trio's virtual one: thirty virtual seconds take no real time."""
    ttl = 30.0
    async with paced(autojump_clock, TIMEOUT):
        wall = virtual_wall()
        async with open_harness(
            tmp_path,
            replies=[{"text": "mine now"}],
            loop=True,
            wall_clock=wall,
            db_path=tmp_path / "navi.db",  # SQLite's leases: judged by the store's clock
        ) as h:
            left = await h.runtime.store.claim_lease(
                "s1", owner="gone", pid=1, host="elsewhere.invalid", ttl=ttl
            )
            frames = await h.turn("s1", "too early")
            assert [f["code"] for f in frames if f["type"] == "error"] == ["session_busy"]
            assert h.chat_requests == []
            await trio.sleep(ttl + 1)
            frames = await h.turn("s1", "now")
            assert frames[-1]["reason"] == "complete", frames
    with closing(sqlite3.connect(tmp_path / "navi.db")) as db:
        took = db.execute("SELECT owner, generation FROM leases WHERE session_id = 's1'").fetchall()
    assert [(owner != "gone", gen) for owner, gen in took] == [(True, left.generation + 1)]
