"""A queued message leaves the queue and enters the history in ONE commit (issue 17,
"Missing tests"): when taking it off the queue fails, its append to the history is
rolled back too, so it is never in both places and cannot run twice.

The failure is SQLite's own: a trigger refuses the DELETE from `queued`. Rules: real
SQLite files under tmp_path, the fake LLM over real HTTP, no sleeps; every test under an
absolute `trio.fail_after`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
from pathlib import Path

import pytest
import trio
from agent_tools import GateTool, call, toolset, with_tools

from navi_trio.errors import StoreError
from navi_trio.store import SQLiteStore
from navi_trio.testing import open_harness

TIMEOUT = 30
HOST = socket.gethostname() or "localhost"
REFUSE_DEQUEUE = (
    "CREATE TRIGGER no_dequeue BEFORE DELETE ON queued"
    " BEGIN SELECT RAISE(ABORT, 'dequeue refused'); END"
)


def _sql(db: Path, *statements: str) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        for statement in statements:
            conn.execute(statement)
        conn.commit()


def _queued(db: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [r[0] for r in conn.execute("SELECT key FROM queued ORDER BY id")]


async def test_a_failed_dequeue_rolls_the_append_back(tmp_path: Path) -> None:
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(db) as store:
            await store.create_session("s1", profile_id="general")
            row = {"text": "B", "user_id": "local", "user_role": "user"}
            await store.enqueue("s1", "kb", row, pid=os.getpid(), host=HOST)
            _sql(db, REFUSE_DEQUEUE)
            user = {"role": "user", "content": "B"}
            with pytest.raises(StoreError, match="dequeue refused"):
                await store.append("s1", messages=[user], context=[user], dequeue="kb")
            # Neither half landed: not in the history, still (only) in the queue.
            assert await store.load_messages("s1") == []
            assert await store.load_context("s1") == []
            assert _queued(db) == ["kb"]


async def test_a_queued_message_whose_dequeue_fails_runs_once_after_all(tmp_path: Path) -> None:
    db = tmp_path / "navi.db"
    gate = GateTool()
    replies = [call("gate"), {"text": "first done"}]
    profiles = {"general": with_tools(["gate"], planning_first_message=False)}
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, tools=toolset(gate), profiles=profiles
        ) as h:
            s = await h.session("s1")
            s.send("first")
            await gate.entered.wait()
            s.send("queued")
            await s.actor.pending[0].accepted.wait()  # stored in the queue: acknowledged
            _sql(db, REFUSE_DEQUEUE)
            gate.gate.set()
            await s.until_end()
            second = await s.until_end()  # its save failed: the run says so
            assert second[-1]["reason"] == "error"
            await s.idle()
            users = [m["content"] for m in await h.runtime.store.load_messages("s1")
                     if m["role"] == "user"]  # fmt: skip
            assert users == ["first"]
            assert len(_queued(db)) == 1  # kept: it was acknowledged, it runs later
        _sql(db, "DROP TRIGGER no_dequeue")
        # The next start adopts it and runs it: once, since the failed save left nothing.
        async with open_harness(tmp_path, replies=[{"text": "queued done"}]) as h2:
            h2.runtime.sessions.adopt = True
            s2 = await h2.session("s1")
            await s2.idle()
            said = [(m["role"], m["content"]) for m in await h2.runtime.store.load_messages("s1")
                    if m["role"] in ("user", "assistant") and m.get("content")]  # fmt: skip
            assert said.count(("user", "queued")) == 1
            assert said[-2:] == [("user", "queued"), ("assistant", "queued done")]
        assert _queued(db) == []
