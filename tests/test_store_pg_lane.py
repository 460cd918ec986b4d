"""The PostgreSQL store's lane (store/postgres/_lane.py): an append with no worker thread.

On the session's throwaway server (tests/pg_server.py; skipped, saying why, where none
can start):

- an append, a kv read or write goes through while every worker thread is busy: none
  needs one;
- a caller that gives up is free at once, and its append still lands; closing the store
  waits for an append begun;
- text with the array syntax's own characters reaches the query columns as it was; text
  with a NUL (libpq would cut it there) or a lone surrogate is refused;
- the lane opens no more than its connections, however many appends come at once;
- a caller in another trio run than the store's still appends (on a worker thread).

Rules: real server, real connections, no sleeps; every test under an absolute timeout.
"""

from __future__ import annotations

import functools
import threading

import psycopg
import pytest
import trio
import trio.testing
from builders import user
from pg_server import sql

from navi_trio.errors import StoreError
from navi_trio.store.postgres import PostgresStore
from navi_trio.store.postgres._lane import LANE_SIZE

TIMEOUT = 30


def stored(url: str, sid: str) -> list[tuple[object, ...]]:
    return sql(url, "SELECT role, content, is_plan FROM messages WHERE session_id = %s"
                    " ORDER BY position", (sid,))  # fmt: skip


async def test_an_append_goes_through_while_every_worker_thread_is_busy(pg_url: str) -> None:
    release = threading.Event()
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url, pool_size=2) as store:
            await store.create_session("s1", profile_id="p")
            async with trio.open_nursery() as nursery:
                for n in range(2):  # both workers wait on a thread event
                    busy = functools.partial(
                        store.run_raw_for_tests, f"busy {n}", lambda c: release.wait(TIMEOUT)
                    )
                    nursery.start_soon(busy)
                await trio.testing.wait_all_tasks_blocked()
                await store.append("s1", messages=[user("through")])
                rows = await trio.to_thread.run_sync(stored, pg_url, "s1")
                await store.kv_set("todo", "s1", {"items": ["a"]})  # kv: one statement each
                await store.kv_set("todo", "s1:x", [1])
                got = await store.kv_get("todo", "s1"), await store.kv_list("todo", "s1")
                await store.kv_delete("todo", "s1")
                gone = await store.kv_get("todo", "s1")
                release.set()
            assert rows == [("user", "through", False)]
            assert got == ({"items": ["a"]}, [("s1", {"items": ["a"]}), ("s1:x", [1])])
            assert gone is None


async def waiting_for_a_row_lock(url: str) -> None:
    """Until a connection waits for a row lock (bounded by the caller's timeout)."""
    query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    while (await trio.to_thread.run_sync(sql, url, query))[0][0] == 0:
        pass  # one round trip per look, no sleep


async def test_a_caller_that_gives_up_is_free_at_once_and_closing_waits_for_its_append(
    pg_url: str,
) -> None:
    with trio.fail_after(TIMEOUT), psycopg.connect(pg_url) as other:
        async with trio.open_nursery() as outer:
            closing, closed = trio.Event(), trio.Event()

            async def use_then_close() -> None:
                async with PostgresStore.open(pg_url) as store:
                    await store.create_session("s1", profile_id="p")
                    other.execute("SELECT 1 FROM sessions WHERE id = 's1' FOR UPDATE")
                    with trio.CancelScope() as scope:
                        save = functools.partial(store.append, "s1", messages=[user("late")])
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(save)
                            await waiting_for_a_row_lock(pg_url)  # the append is sent
                            scope.cancel()  # the caller gives up while the row is locked
                    assert scope.cancelled_caught
                    assert await trio.to_thread.run_sync(stored, pg_url, "s1") == []
                    closing.set()
                closed.set()  # after the close, which waited for the append

            outer.start_soon(use_then_close)
            await closing.wait()
            await trio.testing.wait_all_tasks_blocked()  # the close waits for the append
            assert not closed.is_set()
            await trio.to_thread.run_sync(other.commit)
        assert closed.is_set()
    assert stored(pg_url, "s1") == [("user", "late", False)]


async def test_text_with_the_array_syntax_in_it_reaches_the_query_columns_as_it_was(
    pg_url: str,
) -> None:
    texts = ['say "hi"', "a\\b", "{}", "a,b", "NULL", "null", "", " x ", "line\nnext",
             "é ☃ 𝄞", "\\\"{,}\\"]  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="p")
            messages = [{"role": t, "content": t, "is_plan": i % 2 == 0}
                        for i, t in enumerate(texts)] + [{"content": "no role"}]  # fmt: skip
            await store.append("s1", messages=messages)
            assert await store.load_messages("s1") == messages
    expected = [(t, t, i % 2 == 0) for i, t in enumerate(texts)] + [(None, "no role", False)]
    assert stored(pg_url, "s1") == expected


async def test_text_with_a_nul_is_refused_not_cut_short(pg_url: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            with pytest.raises(StoreError, match="kv set t/a.*NUL"):
                await store.kv_set("t", "a\x00b", 1)  # libpq would end the text at the NUL
            assert await store.kv_get("t", "a") is None
            with pytest.raises(StoreError, match="UTF-8"):
                await store.kv_set("t", "a\ud800", 1)
            assert await store.kv_list("t") == []


async def test_the_lane_opens_no_more_than_its_connections(pg_url: str) -> None:
    sessions = [f"s{n}" for n in range(30)]
    assert LANE_SIZE < len(sessions)  # more appends at once than the lane has connections
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url, pool_size=1) as store:
            for sid in sessions:
                await store.create_session(sid, profile_id="p")
            async with trio.open_nursery() as nursery:
                for sid in sessions:
                    nursery.start_soon(functools.partial(store.append, sid, messages=[user(sid)]))
            rows = await trio.to_thread.run_sync(
                sql, pg_url, "SELECT count(*) FROM pg_stat_activity WHERE datname ="
                " current_database() AND application_name = 'navi'"
            )  # fmt: skip
            for sid in sessions:
                assert await store.load_messages(sid) == [user(sid)]
    lane = rows[0][0] - 1  # the pool's one connection, the lane's the rest
    assert 2 <= lane <= LANE_SIZE, rows


async def test_a_caller_in_another_trio_run_appends_on_a_worker_thread(pg_url: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="p")
            save = functools.partial(store.append, "s1", messages=[user("from elsewhere")])
            await trio.to_thread.run_sync(trio.run, save)
            assert await store.load_messages("s1") == [user("from elsewhere")]
