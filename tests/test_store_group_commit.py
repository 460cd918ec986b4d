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
from navi_trio.store._schema import _write_tx

TIMEOUT = 10


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


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


async def test_a_batched_append_that_fails_leaves_nothing_and_the_others_land(
    tmp_path: Path,
) -> None:
    """In a group commit each job runs under its own savepoint: an append that fails
    after a first insert (the context refuses its row) leaves neither row, and the
    batch's other appends land, in one commit."""
    started, gate = threading.Event(), threading.Event()
    seen: list[str] = []

    def hold(db: Any) -> bool:
        started.set()
        return gate.wait(5)

    def trace(db: Any) -> None:
        db.set_trace_callback(seen.append)

    async def both(store: SQLiteStore, sid: str, text: str) -> None:
        await store.append(sid, messages=[user(text)], context=[user(text)])

    async def refused(store: SQLiteStore, sid: str) -> None:
        with pytest.raises(StoreError, match="context is frozen"):
            await store.append(sid, messages=[user("lost")], context=[user("lost")])

    with trio.fail_after(TIMEOUT):
        async with open_store(tmp_path / "n.db") as store:
            a, b = [(await store.create_session(profile_id="p")).id for _ in range(2)]
            await store.run_raw_for_tests(
                "freeze b",
                lambda db: db.execute(
                    "CREATE TRIGGER navi_frozen BEFORE INSERT ON context WHEN"
                    f" NEW.session_id = '{b}' BEGIN SELECT RAISE(ABORT, 'context is frozen'); END"
                ),
            )
            await store.run_raw_for_tests("trace", trace)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.run_raw_for_tests, "hold", hold)
                await trio.to_thread.run_sync(started.wait, 5)
                nursery.start_soon(both, store, a, "a1")
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(refused, store, b)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(both, store, a, "a2")
                await trio.testing.wait_all_tasks_blocked()
                gate.set()
            assert [m["content"] for m in await store.load_messages(a)] == ["a1", "a2"]
            assert [m["content"] for m in await store.load_context(a)] == ["a1", "a2"]
            assert await store.load_messages(b) == []
            assert await store.load_context(b) == []
    batch = seen[seen.index("BEGIN IMMEDIATE") :]
    assert batch.count("SAVEPOINT navi_job") == 3
    assert batch.count("COMMIT") == 1


async def test_a_batched_job_that_survives_its_failed_write_keeps_only_what_came_after(
    tmp_path: Path,
) -> None:
    """A job of a group commit whose first write fails, and which goes on (it caught the
    error), keeps only what it wrote after: the failed write is undone by itself."""
    started, gate = threading.Event(), threading.Event()

    def hold(db: Any) -> bool:
        started.set()
        return gate.wait(5)

    def job(db: Any) -> None:
        try:
            with _write_tx(db):
                db.execute("INSERT INTO kv VALUES ('t', 'undone', '1', 0)")
                raise ValueError("the write fails after its first statement")
        except ValueError:
            pass
        db.execute("INSERT INTO kv VALUES ('t', 'kept', '2', 0)")

    def keys(db: Any) -> list[str]:
        return [r[0] for r in db.execute("SELECT key FROM kv WHERE scope = 't' ORDER BY key")]

    with trio.fail_after(TIMEOUT):
        async with open_store(tmp_path / "n.db") as store:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.run_raw_for_tests, "hold", hold)
                await trio.to_thread.run_sync(started.wait, 5)
                nursery.start_soon(store.run_raw_for_tests, "job", job)
                nursery.start_soon(store.run_raw_for_tests, "job", keys)
                await trio.testing.wait_all_tasks_blocked()
                gate.set()
            assert await store.run_raw_for_tests("keys", keys) == ["kept"]
