"""The SQLite store's own details: schema and pragmas, the one worker thread, repair.

What both stores promise (sessions, history, kv, users...) is tested once, on both, in
tests/test_store_contract*.py.

Rules for this module: real SQLite files under tmp_path, no sleeps, every test that
waits on the worker thread under an absolute `trio.fail_after` (real clock: the
autojump clock would jump while the thread works).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from builders import assistant, call, result, user
from hypothesis import given
from hypothesis import strategies as st

from navi_trio.errors import StoreError
from navi_trio.store import (
    SQLiteStore,
    open_store,
    repair_dangling_tool_calls,
)
from navi_trio.store._worker import _Job, _Worker

TIMEOUT = 10


async def raw(store: SQLiteStore, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """A query on the store's own connection (its worker thread)."""
    return await store.run_raw_for_tests(
        "test query", lambda db: db.execute(sql, params).fetchall()
    )


# -- opening, pragmas, the worker thread -----------------------------------------------


async def test_open_creates_parent_folders_wal_schema_and_pragmas(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "navi.db"
    with trio.fail_after(TIMEOUT):
        async with open_store(path) as store:
            assert store.path == path
            assert path.exists()
            assert (await raw(store, "PRAGMA journal_mode"))[0][0] == "wal"
            assert (await raw(store, "PRAGMA synchronous"))[0][0] == 2  # FULL
            assert (await raw(store, "PRAGMA foreign_keys"))[0][0] == 1
            assert (await raw(store, "PRAGMA busy_timeout"))[0][0] > 0
            tables = {r[0] for r in await raw(store, "SELECT name FROM sqlite_master")}
            assert {"sessions", "messages", "context", "kv", "users"} <= tables
            assert await store.stats() == dict.fromkeys(
                ["sessions", "messages", "context", "kv", "users"], 0
            )


async def test_a_new_database_has_every_name_the_current_check_asks_for(tmp_path: Path) -> None:
    # `_SCHEMA_NAMES` and `_ADDED_COLUMNS` must be what `_create` makes: a name missing
    # from the list would let a database without it pass as current.
    from navi_trio.store._schema import _ADDED_COLUMNS, _SCHEMA_NAMES, _current

    with trio.fail_after(TIMEOUT):
        async with open_store(tmp_path / "navi.db") as store:
            names = await raw(
                store, "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
            )
            columns = {
                (table, r[1])
                for table in {t for t, _ in _ADDED_COLUMNS}
                for r in await raw(store, f"PRAGMA table_info({table})")
            }
            assert await store.run_raw_for_tests("current", _current)
    assert {r[0] for r in names} == _SCHEMA_NAMES
    assert set(_ADDED_COLUMNS) <= columns


@pytest.mark.parametrize(
    "loss",
    [
        "DROP TABLE run_usage",
        "DROP INDEX wakes_session",
        "ALTER TABLE schedules DROP COLUMN last_skip_at",
    ],
)
async def test_a_database_that_lacks_a_part_of_the_schema_gains_it_on_open(
    tmp_path: Path, loss: str
) -> None:
    # What an older navi made, at the same version: the open makes what is missing.
    path = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        async with open_store(path) as store:
            before = await raw(store, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
            await raw(store, loss)
            assert await raw(store, "SELECT type, name, sql FROM sqlite_master") != before
        async with open_store(path) as store:
            after = await raw(store, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    assert after == before


async def test_a_statement_outside_a_write_transaction_commits_by_itself(tmp_path: Path) -> None:
    # No transaction is left open behind a job: another connection sees the row at once.
    path = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        async with open_store(path) as store:
            await raw(
                store, "INSERT INTO kv (scope, key, value, updated_at) VALUES ('a','b','1',1)"
            )
            assert await raw(store, "SELECT 1 WHERE 0") == []  # the connection's next job
            other = sqlite3.connect(str(path), timeout=0)
            try:
                assert other.execute("SELECT value FROM kv").fetchall() == [("1",)]
                other.execute("UPDATE kv SET value = '2'")  # the write lock is free
                other.commit()
            finally:
                other.close()


def test_a_write_transaction_inside_another_is_a_savepoint_of_it(tmp_path: Path) -> None:
    # A group commit's job: its write undone alone when it fails, the group's kept.
    from navi_trio.store._schema import _connect, _init_schema, _write_tx

    db = _connect(tmp_path / "navi.db", "FULL", 1.0)
    try:
        _init_schema(db)
        insert = "INSERT INTO kv (scope, key, value, updated_at) VALUES ('s', ?, '1', 1)"
        with _write_tx(db):
            db.execute(insert, ["kept"])
            with pytest.raises(ValueError), _write_tx(db):
                db.execute(insert, ["undone"])
                raise ValueError("the job failed")
            with _write_tx(db):
                db.execute(insert, ["nested"])
            assert db.in_transaction
        assert not db.in_transaction
        assert db.execute("SELECT key FROM kv ORDER BY key").fetchall() == [("kept",), ("nested",)]
    finally:
        db.close()


def test_store_package_exports_what_it_promises() -> None:
    import navi_trio.store as pkg

    assert sorted(pkg.__all__) == sorted(
        ["LeaseRow", "LoadedSession", "SQLiteStore", "SessionRow", "SessionStore", "open_store",
         "repair_dangling_tool_calls"]
    )  # fmt: skip
    assert all(hasattr(pkg, name) for name in pkg.__all__)
    assert pkg.open_store == SQLiteStore.open


async def test_open_on_an_unusable_path_raises_store_error_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with trio.fail_after(TIMEOUT), pytest.raises(StoreError, match="open store .*file"):
        async with open_store(blocker / "navi.db"):
            pass


async def test_every_call_runs_on_one_worker_thread_not_trios(tmp_path: Path) -> None:
    idents: list[int] = []

    async def whoami(store: SQLiteStore) -> None:
        idents.append(await store.run_raw_for_tests("ident", lambda db: threading.get_ident()))

    with trio.fail_after(TIMEOUT):
        async with open_store(tmp_path / "n.db") as store, trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(whoami, store)
    assert len(idents) == 10 and len(set(idents)) == 1
    assert idents[0] != threading.get_ident()


async def test_trio_keeps_running_while_the_worker_is_busy(tmp_path: Path) -> None:
    # The job can only finish if a trio task sets the gate while the job runs.
    gate = threading.Event()
    outcome: list[bool] = []

    async def busy(store: SQLiteStore) -> None:
        outcome.append(await store.run_raw_for_tests("wait for trio", lambda db: gate.wait(5)))

    with trio.fail_after(TIMEOUT):
        async with open_store(tmp_path / "n.db") as store, trio.open_nursery() as nursery:
            nursery.start_soon(busy, store)
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
    assert outcome == [True]


async def test_a_cancelled_write_still_lands_and_close_drains_it(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    gate = threading.Event()
    with trio.fail_after(TIMEOUT):
        async with open_store(path) as store:
            row = await store.create_session(profile_id="p")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.run_raw_for_tests, "hold", lambda db: gate.wait(5))
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(_append_expecting_cancel, store, row.id)
                await trio.testing.wait_all_tasks_blocked()
                # Both callers give up; their jobs stay queued behind the held one.
                nursery.cancel_scope.cancel()
            gate.set()
            # Leave at once: close must drain the queued append before closing.
        async with open_store(path) as store:
            assert await store.load_messages(row.id) == [user("queued")]


async def _append_expecting_cancel(store: SQLiteStore, sid: str) -> None:
    await store.append(sid, messages=[user("queued")])
    pytest.fail("the append should have been cancelled while queued")


async def test_the_worker_refuses_a_job_before_it_started_and_after_it_ended(
    tmp_path: Path,
) -> None:
    # A job queued to a worker that will never take it would leave its caller waiting.
    worker = _Worker(tmp_path / "w.db", "NORMAL")
    with pytest.raises(StoreError, match="not running"):
        worker.submit(_Job("early", lambda db: None))
    worker.thread.start()
    ran = _Job("ran", lambda db: db.execute("SELECT 1").fetchone()[0])
    worker.submit(ran)
    worker.submit(_Job("close", lambda db: None, stop=True))
    with trio.fail_after(TIMEOUT):
        await ran.wait()
        await trio.to_thread.run_sync(worker.thread.join, TIMEOUT)
    assert ran.result == 1
    with pytest.raises(StoreError, match="not running"):
        worker.submit(_Job("late", lambda db: None))


async def test_closed_or_never_opened_store_raises_instead_of_hanging(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        with pytest.raises(StoreError, match="not open"):
            await SQLiteStore(tmp_path / "n.db").stats()
        async with open_store(tmp_path / "n.db") as store:
            pass
        with pytest.raises(StoreError, match="closed"):
            await store.create_session(profile_id="p")


# -- repairing dangling tool calls (pure) ------------------------------------------------


def test_repair_leaves_a_complete_history_alone() -> None:
    history = [user("a"), assistant(call("c1")), result("c1"), assistant(text="ok")]
    fixed, inserted = repair_dangling_tool_calls(history)
    assert fixed == history and inserted == []


def test_repair_puts_placeholders_after_existing_results_before_the_next_turn() -> None:
    history = [
        assistant(call("c1"), call("c2"), call("c3")),
        result("c2"),
        {"role": "system", "content": "task note"},
        user("next"),
        result("c1"),  # too late: after the next user message it answers nothing
    ]
    fixed, inserted = repair_dangling_tool_calls(history)
    assert [i for i, _ in inserted] == [2, 3]
    assert [ph["tool_call_id"] for _, ph in inserted] == ["c1", "c3"]
    assert fixed[:2] == history[:2] and fixed[4:] == history[2:]
    assert all(fixed[i] is ph for i, ph in inserted)


def test_repair_handles_a_dangling_call_at_the_end_and_openai_shaped_calls() -> None:
    openai_call = {"id": "c9", "type": "function", "function": {"name": "web", "arguments": "{}"}}
    fixed, inserted = repair_dangling_tool_calls([user("a"), assistant(openai_call)])
    assert inserted == [(2, fixed[2])] and fixed[2]["name"] == "web"


def test_repair_pairs_id_less_calls_by_position_and_gives_the_rest_an_id() -> None:
    history = [assistant(call(None, "a"), call(None, "b")), result(None)]
    fixed, inserted = repair_dangling_tool_calls(history)
    assert len(inserted) == 1 and inserted[0][0] == 2
    assert inserted[0][1]["name"] == "b" and inserted[0][1]["tool_call_id"]
    assert repair_dangling_tool_calls(fixed)[1] == []


message_shapes = st.one_of(
    st.builds(user, st.text(max_size=3)),
    st.builds(
        lambda ids: assistant(*[call(i) for i in ids]),
        st.lists(st.sampled_from(["c1", "c2", "c3", None]), max_size=3),
    ),
    st.builds(result, st.sampled_from(["c1", "c2", "c3", "zz", None])),
    st.just({"role": "system", "content": "note"}),
)


@given(st.lists(message_shapes, max_size=12))
def test_repair_is_idempotent_pure_and_only_inserts(history: list[dict[str, Any]]) -> None:
    snapshot = json.dumps(history)
    fixed, inserted = repair_dangling_tool_calls(history)
    assert json.dumps(history) == snapshot  # input untouched
    assert len(fixed) == len(history) + len(inserted)
    inserted_at = {i for i, _ in inserted}
    assert [m for i, m in enumerate(fixed) if i not in inserted_at] == history
    assert all(ph["repaired"] is True and ph["role"] == "tool" for _, ph in inserted)
    again, none = repair_dangling_tool_calls(fixed)
    assert none == [] and again == fixed
