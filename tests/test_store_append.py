"""An append serialises a message that goes to both lists once; both rows are right.

Real SQLite file under tmp_path."""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from navi_trio.store import _input
from navi_trio.store.fence import Fence, fenced
from navi_trio.store.sqlite import SQLiteStore


async def test_a_message_in_both_lists_is_serialised_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dumped: list[str] = []
    real_dump = _input._dump

    def counting_dump(value: Any, what: str) -> str:
        dumped.append(what)
        return real_dump(value, what)

    monkeypatch.setattr(_input, "_dump", counting_dump)
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        await store.create_session("s1", profile_id="p")
        shared = {"role": "assistant", "content": "hi", "tool_calls": [{"name": "echo"}]}
        note = {"role": "system", "content": "a note", "keep": True}  # context only
        shown = {"role": "assistant", "content": "shown only"}  # display only
        await store.append("s1", messages=[shared, shown], context=[note, shared])
        assert dumped == ["messages[0]", "messages[1]", "context[0]"]
        assert await store.load_messages("s1") == [shared, shown]
        assert await store.load_context("s1") == [note, shared]


def _level(db: Any) -> int:
    return int(db.execute("PRAGMA synchronous").fetchone()[0])


async def test_an_append_that_need_not_be_durable_commits_without_the_fsync(
    tmp_path: Path,
) -> None:
    full, normal = 2, 1
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        await store.create_session("s1", profile_id="p")
        # What a job sees of the connection's level: relaxed only for a non-durable job.
        assert await store.run_raw_for_tests("level", _level, durable=False) == normal
        assert await store.run_raw_for_tests("level", _level) == full
        msg = {"role": "assistant", "content": "calling", "tool_calls": [{"name": "echo"}]}
        await store.append("s1", messages=[msg], context=[msg], durable=False)
        assert await store.load_messages("s1") == [msg]  # committed all the same
        assert await store.run_raw_for_tests("level", _level) == full
    async with SQLiteStore.open(tmp_path / "n.db", synchronous="NORMAL") as store:
        assert await store.run_raw_for_tests("level", _level, durable=False) == normal
        assert (
            await store.run_raw_for_tests("level", _level) == normal
        )  # never raised above the setting


async def _batch_statements(tmp_path: Path, durables: list[bool]) -> list[str]:
    """The PRAGMA and COMMIT statements of one group commit of appends (`durables`)
    and of the load after it."""
    started, gate = threading.Event(), threading.Event()
    statements: list[str] = []

    def trace(db: Any) -> None:
        def keep(sql: str) -> None:
            if sql.startswith(("PRAGMA synchronous", "COMMIT")):
                statements.append(sql)

        db.set_trace_callback(keep)

    def hold(db: Any) -> bool:
        started.set()
        return gate.wait(5)

    with trio.fail_after(10):
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            await store.create_session("s1", profile_id="p")
            await store.run_raw_for_tests("trace", trace)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.run_raw_for_tests, "hold", hold)
                await trio.to_thread.run_sync(started.wait, 5)
                for i, durable in enumerate(durables):
                    msg = {"role": "user", "content": str(i)}
                    nursery.start_soon(partial(store.append, "s1", messages=[msg], durable=durable))
                    await trio.testing.wait_all_tasks_blocked()
                statements.clear()
                gate.set()
            assert len(await store.load_messages("s1")) == len(durables)
    return statements


async def test_a_group_commit_is_flushed_when_any_of_its_appends_must_be(tmp_path: Path) -> None:
    mixed = await _batch_statements(tmp_path / "mixed", [False, True, False])
    assert mixed == ["COMMIT"]  # one transaction, at the configured FULL
    relaxed = await _batch_statements(tmp_path / "relaxed", [False, False])
    # Relaxed for the batch, back to FULL for the next job (the load that follows).
    assert relaxed == ["PRAGMA synchronous=NORMAL", "COMMIT", "PRAGMA synchronous=FULL"]


async def test_a_rounds_two_fenced_appends_run_six_and_five_statements(tmp_path: Path) -> None:
    """The call message (renewing the lease) and the result, each one transaction: the
    renewal (the fence's check), the session's touch (fenced, when nothing was renewed)
    and one INSERT per row, its position read in it. Before, each read the fence, the
    session and both tables' last positions apart: 12 and 9 statements."""
    seen: list[str] = []

    def tracing(on: bool, db: Any) -> None:
        db.set_trace_callback(seen.append if on else None)

    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        await store.create_session("s1", profile_id="p")
        held = await store.claim_lease("s1", owner="a", pid=1, host="h", ttl=60)
        call = {"role": "assistant", "content": "", "tool_calls": [{"name": "echo"}]}
        result = {"role": "tool", "content": "ping", "name": "echo"}
        await store.run_raw_for_tests("trace", partial(tracing, True))
        with fenced(Fence("s1", "a", held.generation)):
            await store.append("s1", messages=[call], context=[call], renew=60, durable=False)
            first = list(seen)
            seen.clear()
            await store.append("s1", messages=[result], context=[result])
        await store.run_raw_for_tests("trace", partial(tracing, False))
        statements = [s for s in seen if not s.startswith("PRAGMA")]
        first = [s for s in first if not s.startswith("PRAGMA")]
        assert [s.split()[0] for s in first] == [
            "BEGIN",
            "UPDATE",
            "UPDATE",
            "INSERT",
            "INSERT",
            "COMMIT",
        ]
        assert [s.split()[0] for s in statements] == [
            "BEGIN",
            "UPDATE",
            "INSERT",
            "INSERT",
            "COMMIT",
        ]
        assert await store.load_messages("s1") == [call, result]
        assert await store.load_context("s1") == [call, result]
        positions = await store.run_raw_for_tests(
            "positions",
            lambda db: db.execute("SELECT position FROM context ORDER BY id").fetchall(),
        )
        assert [p[0] for p in positions] == [1.0, 2.0]
        lease = await store.claim_lease("s1", owner="b", pid=1, host="h", ttl=60)
        assert lease.owner == "a"  # renewed by the first append, still held
