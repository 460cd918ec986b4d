"""Every message gets exactly one reply, `ok` or an `error` with its code, and the
connection goes on (issue 17, item 4).

Refused messages: the session's lease held by another process (`session_busy`), a
database that refuses writes (`storage`), a store that does not answer within
NAVI_MESSAGE_ACCEPT_TIMEOUT_SEC (`storage`, and the message never runs, queued or not).
While a message waits to be stored, the frames behind it on the same connection are
answered.

Rules: real WebSocket connections on 127.0.0.1 (port 0), the store a real SQLite file
in tmp_path, the fake LLM over real HTTP; no sleeps; every test under an absolute
`trio.fail_after`. The timeout test runs on a MockClock at real rate (rate=1) that the
test jumps past the timeout, so the store's thread works in real time and the guard
still holds.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import GateTool, call, toolset, with_tools
from api_ws import Client, Daemon, open_daemon

from navi_trio.store import LoadedSession, SQLiteStore

TIMEOUT = 30
HOST = socket.gethostname() or "localhost"
NO_PLAN = {"general": {"planning_first_message": False}}  # one LLM call per message


@pytest.fixture
def live_clock() -> trio.testing.MockClock:
    """Real time that a test may also jump (pytest-trio runs the test on it)."""
    return trio.testing.MockClock(rate=1.0)


def _queued_keys(tmp_path: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(tmp_path / "navi.db")) as conn:
        return [r[0] for r in conn.execute("SELECT key FROM queued")]


def _replies_to(c: Client, rid: Any) -> list[dict[str, Any]]:
    return [f for f in c.frames if f.get("id") == rid]


async def _history(d: Daemon, sid: str) -> list[tuple[str, str]]:
    messages = await d.harness.runtime.store.load_messages(sid)
    return [(m["role"], m["content"]) for m in messages]


def _hold_loading(d: Daemon, sid: str) -> tuple[trio.Event, trio.Event]:
    """Hold the load of session `sid` (the first store read of its run) until `gate`."""
    store = d.harness.runtime.store
    load_session = store.load_session
    entered, gate = trio.Event(), trio.Event()

    async def held(session_id: str) -> LoadedSession | None:
        if session_id == sid:
            entered.set()
            await gate.wait()
        return await load_session(session_id)

    store.load_session = held  # type: ignore[method-assign]
    return entered, gate


async def test_a_message_to_a_session_leased_elsewhere_gets_one_error_and_the_connection_goes_on(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, profiles=NO_PLAN, replies=[{"text": "ran at last"}]) as d:
            async with d.connect("alice") as c:
                await c.request({"type": "sessions", "action": "create", "session_id": "alice.S"})
                # Another process holds the lease (its own connection to the same file).
                async with SQLiteStore.open(tmp_path / "navi.db") as other:
                    await other.claim_lease(
                        "alice.S", owner="another-process", pid=os.getpid(), host=HOST, ttl=300
                    )
                    await c.send(
                        {"type": "message", "content": "x", "session_id": "alice.S", "id": 7}
                    )
                    await c.send({"type": "sessions", "action": "list", "id": 8})
                    refused = await c.until(lambda f: f.get("id") == 7)
                    listed = await c.until(lambda f: f.get("id") == 8)
                    await other.release_lease("alice.S", owner="another-process")
                assert (refused["type"], refused["code"], refused["session_id"]) == (
                    "error",
                    "session_busy",
                    "alice.S",
                )
                assert "'alice.S' is busy" in refused["message"]
                assert listed["type"] == "sessions"
                assert [s["session_id"] for s in listed["sessions"]] == ["alice.S"]
                # The lease is free again: the same connection goes on.
                ok = await c.request({"type": "message", "content": "now", "session_id": "alice.S"})
                assert ok["type"] == "ok"
                end = await c.until(
                    lambda f: f["type"] == "stream_end" and f.get("reason") == "complete"
                )
                assert end["text"] == "ran at last"
                assert len(_replies_to(c, 7)) == 1 and len(_replies_to(c, 8)) == 1
            assert await _history(d, "alice.S") == [("user", "now"), ("assistant", "ran at last")]


async def test_a_database_that_refuses_writes_refuses_the_message_with_storage(
    tmp_path: Path,
) -> None:
    # `query_only` makes SQLite refuse every write as a read-only file does
    # (SQLITE_READONLY): the same error a `chattr +i` database gives.
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, profiles=NO_PLAN, replies=[{"text": "stored now"}]) as d:
            store = d.harness.runtime.store
            assert isinstance(store, SQLiteStore)
            async with d.connect("alice") as c:
                await c.request({"type": "sessions", "action": "create", "session_id": "alice.S"})
                await store.run_raw_for_tests(
                    "read-only", lambda db: db.execute("PRAGMA query_only=1")
                )
                refused = await c.request(
                    {"type": "message", "content": "x", "session_id": "alice.S"}
                )
                assert (refused["type"], refused["code"]) == ("error", "storage")
                assert (
                    "cannot be written" in refused["message"] and "'alice.S'" in refused["message"]
                )
                # Reads go on.
                history = await c.request(
                    {"type": "sessions", "action": "history", "session_id": "alice.S"}
                )
                assert history["messages"] == []
                await store.run_raw_for_tests(
                    "writable", lambda db: db.execute("PRAGMA query_only=0")
                )
                ok = await c.request({"type": "message", "content": "y", "session_id": "alice.S"})
                assert ok["type"] == "ok"
                await c.until(lambda f: f["type"] == "stream_end" and f["reason"] == "complete")
            assert await _history(d, "alice.S") == [("user", "y"), ("assistant", "stored now")]


async def test_the_frames_behind_a_message_waiting_to_be_stored_are_answered(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, profiles=NO_PLAN, replies=[{"text": "done"}]) as d:
            async with d.connect("alice") as c:
                await c.request({"type": "sessions", "action": "create", "session_id": "alice.S"})
                entered, gate = _hold_loading(d, "alice.S")
                await c.send({"type": "message", "content": "x", "session_id": "alice.S", "id": 1})
                await entered.wait()
                # The message is not stored yet: its reply waits, the reader does not.
                listed = await c.request({"type": "sessions", "action": "list"})
                assert listed["type"] == "sessions" and _replies_to(c, 1) == []
                gate.set()
                ok = await c.until(lambda f: f.get("id") == 1)
                assert ok["type"] == "ok"
                await c.until(lambda f: f["type"] == "stream_end" and f["reason"] == "complete")
            assert await _history(d, "alice.S") == [("user", "x"), ("assistant", "done")]


async def test_a_message_not_stored_in_time_is_refused_and_never_runs(
    tmp_path: Path, live_clock: trio.testing.MockClock
) -> None:
    accept_sec = 60.0
    # The guard: TIMEOUT real seconds beyond the one jump the test makes.
    with trio.fail_after(TIMEOUT + accept_sec):
        async with open_daemon(
            tmp_path, profiles=NO_PLAN, replies=[{"text": "only the second"}],
            message_accept_timeout_sec=accept_sec,
        ) as d:  # fmt: skip
            async with d.connect("alice") as c:
                await c.request({"type": "sessions", "action": "create", "session_id": "alice.S"})
                entered, gate = _hold_loading(d, "alice.S")
                await c.send(
                    {"type": "message", "content": "late", "session_id": "alice.S", "id": 1}
                )
                await entered.wait()
                live_clock.jump(accept_sec + 1)
                refused = await c.until(lambda f: f.get("id") == 1)
                assert (refused["type"], refused["code"], refused["session_id"]) == (
                    "error",
                    "storage",
                    "alice.S",
                )
                assert "NAVI_MESSAGE_ACCEPT_TIMEOUT_SEC" in refused["message"]
                # The store answers after all: the refused message is not saved, not run.
                gate.set()
                end = await c.until(lambda f: f["type"] == "stream_end")
                assert end["reason"] == "error"
                assert await _history(d, "alice.S") == [] and d.harness.chat_requests == []
                ok = await c.request(
                    {"type": "message", "content": "again", "session_id": "alice.S"}
                )
                assert ok["type"] == "ok"
                await c.until(lambda f: f["type"] == "stream_end" and f["reason"] == "complete")
                assert len(_replies_to(c, 1)) == 1
            assert await _history(d, "alice.S") == [
                ("user", "again"),
                ("assistant", "only the second"),
            ]


async def test_a_queued_message_refused_for_a_late_store_leaves_no_row_and_never_runs(
    tmp_path: Path, live_clock: trio.testing.MockClock
) -> None:
    accept_sec = 60.0
    gate = GateTool()
    profiles = {"general": with_tools(["gate"], planning_first_message=False)}
    with trio.fail_after(TIMEOUT + accept_sec):
        async with open_daemon(
            tmp_path, replies=[call("gate"), {"text": "first done"}], tools=toolset(gate),
            profiles=profiles, message_accept_timeout_sec=accept_sec,
        ) as d:  # fmt: skip
            store = d.harness.runtime.store
            enqueue = store.enqueue
            entered = trio.Event()

            async def late(*args: Any, **kwargs: Any) -> list[tuple[str, dict[str, Any]]]:
                await enqueue(*args, **kwargs)  # the row lands...
                entered.set()
                await trio.sleep_forever()  # ...but the store's answer never comes

            async with d.connect("alice") as c:
                await c.request({"type": "sessions", "action": "create", "session_id": "alice.S"})
                assert (await c.request({"type": "message", "content": "first",
                                         "session_id": "alice.S"}))["type"] == "ok"  # fmt: skip
                await gate.entered.wait()
                store.enqueue = late  # type: ignore[method-assign]
                await c.send(
                    {"type": "message", "content": "late", "session_id": "alice.S", "id": 2}
                )
                await entered.wait()
                assert _queued_keys(tmp_path) != []
                live_clock.jump(accept_sec + 1)
                refused = await c.until(lambda f: f.get("id") == 2)
                assert (refused["type"], refused["code"]) == ("error", "storage")
                gate.gate.set()
                await c.until(lambda f: f["type"] == "stream_end" and f["reason"] == "complete")
                actor = d.harness.runtime.sessions.actor("alice.S")
                assert actor is not None
                await actor.idle.wait()
            # Refused: it did not run, and its row is gone, so a restart cannot run it.
            users = [u for u, _ in await _history(d, "alice.S") if u == "user"]
            assert len(users) == 1 and len(d.harness.chat_requests) == 2
            assert _queued_keys(tmp_path) == []
