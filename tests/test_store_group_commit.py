"""Group commit: the store worker runs every already-queued job in ONE transaction.

Real SQLite files under tmp_path, no sleeps; waits on the worker thread are bounded by
an absolute `trio.fail_after` (real clock). Commits are counted with sqlite's trace
callback on the store's own connection, so the count is exact, never a timing.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from navi_trio.errors import StoreError
from navi_trio.store import SQLiteStore, open_store

TIMEOUT = 10


def _count_commits(store: SQLiteStore, commits: list[str]) -> Any:
    def install(db: Any) -> None:
        db.set_trace_callback(
            lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None
        )

    return store.run_raw_for_tests("trace commits", install)


def _durable_count(path: Path, sid: str, text: str) -> int:
    """Rows with `text` as a fresh connection sees them: only what is committed."""
    conn = sqlite3.connect(str(path))
    try:
        row = conn.execute(
            "SELECT COUNT(*) FROM messages WHERE session_id = ? AND content = ?", [sid, text]
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


async def test_queued_appends_share_one_commit_and_each_is_durable_when_it_returns(
    tmp_path: Path,
) -> None:
    path = tmp_path / "n.db"
    started, gate = threading.Event(), threading.Event()
    commits: list[str] = []
    seen: dict[str, int] = {}
    failures: list[str] = []

    def hold(db: Any) -> bool:
        started.set()
        return gate.wait(5)

    async def append(store: SQLiteStore, sid: str, text: str) -> None:
        await store.append(sid, messages=[{"role": "user", "content": text}])
        seen[text] = _durable_count(path, sid, text)

    async def bad_append(store: SQLiteStore) -> None:
        with pytest.raises(StoreError, match="no session 'nope'"):
            await store.append("nope", messages=[{"role": "user", "content": "lost"}])
        failures.append("nope")

    with trio.fail_after(TIMEOUT):
        async with open_store(path) as store:
            sids = [(await store.create_session(profile_id="p")).id for _ in range(3)]
            await _count_commits(store, commits)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.run_raw_for_tests, "hold", hold)
                await trio.to_thread.run_sync(started.wait, 5)
                for i in range(4):
                    for sid in sids:
                        nursery.start_soon(append, store, sid, f"{sid}-{i}")
                    if i == 1:  # a failing job in the middle of the batch
                        nursery.start_soon(bad_append, store)
                await trio.testing.wait_all_tasks_blocked()
                gate.set()
            # 12 appends and one failure, queued behind the held job: one commit.
            assert len(commits) == 1
            for sid in sids:
                assert sorted(m["content"] for m in await store.load_messages(sid)) == [
                    f"{sid}-{i}" for i in range(4)
                ]
    assert failures == ["nope"]
    assert seen == {f"{sid}-{i}": 1 for sid in sids for i in range(4)}


async def test_a_lone_job_keeps_its_own_transaction(tmp_path: Path) -> None:
    commits: list[str] = []
    with trio.fail_after(TIMEOUT):
        async with open_store(tmp_path / "n.db") as store:
            sid = (await store.create_session(profile_id="p")).id
            await _count_commits(store, commits)
            for i in range(3):
                await store.append(sid, messages=[{"role": "user", "content": str(i)}])
            assert len(commits) == 3
            assert len(await store.load_messages(sid)) == 3


async def test_a_write_does_not_ask_for_the_page_count_while_no_full_disk_is_reported(
    tmp_path: Path,
) -> None:
    # Whether a write needed new pages matters only to clear a reported full disk
    # (test_storage_full.py has that case): other writes skip the two pager queries.
    asked: list[str] = []

    def install(db: Any) -> None:
        db.set_trace_callback(
            lambda sql: asked.append(sql) if "page_count" in sql.lower() else None
        )

    with trio.fail_after(TIMEOUT):
        async with open_store(tmp_path / "n.db") as store:
            sid = (await store.create_session(profile_id="p")).id
            await store.run_raw_for_tests("trace page counts", install)
            await store.append(sid, messages=[{"role": "user", "content": "hi"}])
            await store.append(sid, messages=[{"role": "assistant", "content": "yo"}])
            assert [m["content"] for m in await store.load_messages(sid)] == ["hi", "yo"]
    assert asked == []
