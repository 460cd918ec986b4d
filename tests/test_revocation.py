"""A revoked token reaches what it opened (docs/pages/daemon.md, tools.md "Safety").

`navi users rotate` and `navi users remove`, run as an operator runs them (a process of
their own writing the database), close that user's open connections on every daemon,
with an ``unauthorized`` error frame saying why; nothing sent on such a connection
afterwards is read. A removed user's running turn stops, their schedules and queued
messages go with them, and their sessions stay. A rotated user is still a user: a new
connection with the new token goes on with their sessions.

Real `navi serve` processes on 127.0.0.1 port 0, users written to the store as `navi
users add` writes them (that command's own test is test_api_daemon's), their tokens on
real WebSocket clients, `navi users` forked from the warm fork server
(tests/navi_forks.py), the fake LLM over real HTTP. On SQLite one daemon (the CLI writes
the file from another process); on PostgreSQL two daemons with separate data folders.
No sleeps: every wait is for a frame (or a process), under an absolute limit.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import system_notes
from api_ws import Client
from daemons import connect_as, forked_users, no_plan_config, pg_daemons, store_user
from pg_server import sql
from reliability import Daemon, clean_env, navi_serve
from test_store_sharing import dead_pid
from trio_websocket import ConnectionClosed, open_websocket_url

from navi_trio.core.jobs import RUNNING_SCOPE
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow
LIMIT = 120  # real seconds for a whole test: daemons and CLI processes on 2 busy cores
STALL: dict[str, Any] = {"text": "never", "delay_first": 1e4}  # waits for its first chunk


@contextlib.asynccontextmanager
async def one_daemon(
    tmp_path: Path, replies: list[dict[str, Any]]
) -> AsyncIterator[tuple[Daemon, dict[str, str], Any]]:
    """The fake LLM and one `navi serve` on SQLite; the env the CLI shares with it."""
    env = clean_env(tmp_path, NAVI_CONFIG=str(no_plan_config(tmp_path)))
    async with open_fake_llm(replies) as llm:
        async with navi_serve(env, llm.url, tmp_path / "daemon.log", forked=True) as daemon:
            yield daemon, env, llm


async def rotate(env: dict[str, str], name: str) -> str:
    """`navi users rotate NAME`; the new token it printed."""
    return (await forked_users(env, "rotate", name)).strip().splitlines()[-1]


async def refused_for(c: Client, why: str) -> dict[str, Any]:
    """The error frame that ends a revoked connection (the connection's own: no seq; a
    session's events may come before it), and then its close (1008)."""
    err = await c.until(lambda f: f["type"] == "error" and "seq" not in f)
    assert err["code"] == "unauthorized" and why in err["message"], err
    with pytest.raises(ConnectionClosed):
        while True:
            await c.next()
    assert c.ws.closed is not None and c.ws.closed.code == 1008, c.ws.closed
    return err


async def hello_refused(url: str, token: str) -> dict[str, Any]:
    async with open_websocket_url(url) as ws:
        await ws.send_message(json.dumps({"type": "hello", "token": token}))
        err: dict[str, Any] = json.loads(await ws.get_message())
    assert (err["type"], err["code"]) == ("error", "unauthorized"), err
    return err


async def started(c: Client, content: str, **fields: Any) -> str:
    """A message's session id, once it is stored (its ok)."""
    reply = await c.request({"type": "message", "content": content, **fields})
    if reply["type"] == "session":
        reply = await c.until(lambda f: f.get("id") == reply["id"] and f["type"] != "session")
    assert reply["type"] == "ok", reply
    return str(reply["session_id"])


def schedules(db: Path) -> int:
    """How many schedules the database holds, read as a third process would."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM schedules").fetchone()[0])


async def test_rotate_closes_the_old_tokens_connection_and_the_new_token_goes_on(
    tmp_path: Path,
) -> None:
    replies = [{"text": "hi bob"}, {"text": "still yours"}]
    with trio.fail_after(LIMIT):
        async with one_daemon(tmp_path, replies) as (daemon, env, _llm):
            old_token = await store_user(env, "bob")
            async with connect_as(daemon.url, old_token) as old:
                sid = await started(old, "hello")
                await old.until_end(sid)
                new_token = await rotate(env, "bob")
                err = await refused_for(old, "the token of user bob was replaced")
                assert "navi users rotate" in err["message"]
                # The old connection reads nothing more: a message sent now is lost to it.
                with pytest.raises(ConnectionClosed):
                    await old.send({"type": "message", "session_id": sid, "content": "x"})
            await hello_refused(daemon.url, old_token)
            # Still a user: the new token reaches the same session and runs in it.
            async with connect_as(daemon.url, new_token) as new:
                again = await started(new, "and now?", session_id=sid)
                end = await new.until_end(again)
                assert end["text"] == "still yours"
                listed = await new.request({"type": "sessions", "action": "list"})
                assert [s["session_id"] for s in listed["sessions"]] == [sid]


async def test_remove_closes_the_connection_stops_the_run_and_drops_the_schedules(
    tmp_path: Path,
) -> None:
    replies = [{"text": "hi bob"}, STALL]
    with trio.fail_after(LIMIT):
        async with one_daemon(tmp_path, replies) as (daemon, env, llm):
            admin = await store_user(env, "alice", "admin")
            bob_token = await store_user(env, "bob")
            async with (
                connect_as(daemon.url, bob_token) as bob,
                connect_as(daemon.url, admin) as alice,
            ):
                sid = await started(bob, "hello")
                await bob.until_end(sid)
                for when in ({"every": "10m"}, {"cron": "0 9 * * *"}):
                    added = await bob.request(
                        {"type": "schedule", "action": "add", "session_id": sid,
                         "message": "check the inbox", **when}
                    )  # fmt: skip
                    assert added["type"] == "schedules", added
                await started(bob, "think long", session_id=sid)  # saved: its turn runs
                queued = await bob.request(
                    {"type": "message", "content": "and then", "session_id": sid}
                )
                assert (queued["type"], queued["queued"]) == ("ok", True), queued
                ok = await alice.request({"type": "subscribe", "session_id": sid})
                assert ok["type"] == "ok", ok
                assert schedules(tmp_path / "navi.db") == 2
                out = await forked_users(env, "remove", "bob")
                assert "removed" in out
                await refused_for(bob, "user bob was removed")
                # The turn bob started stops (the admin follows his session).
                end = await alice.until_end(sid)
                assert end["reason"] == "stopped", end
                # What he had queued never runs: refused when its turn comes.
                refused = await alice.until_type("error", session_id=sid)
                assert refused["code"] == "unauthorized" and "removed" in refused["message"]
                assert (await alice.until_end(sid))["reason"] == "error"
                # His schedules went with him; his session stays, with its history.
                listed = await alice.request({"type": "schedule", "action": "list"})
                assert listed["schedules"] == [], listed
                sessions = await alice.request({"type": "sessions", "action": "list"})
                assert [s["session_id"] for s in sessions["sessions"]] == [sid]
                history = await alice.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
                users = [m["content"] for m in history["messages"] if m["role"] == "user"]
                assert users == ["hello", "think long"], history
            await hello_refused(daemon.url, bob_token)
            assert len(llm.chat_requests) == 2  # nothing of bob's ran again
    assert schedules(tmp_path / "navi.db") == 0


async def test_on_postgresql_every_daemon_closes_the_revoked_tokens_connections(
    tmp_path: Path, pg_url: str
) -> None:
    replies = [{"text": "hi bob"}, STALL]
    env = {**clean_env(tmp_path), "NAVI_DB": pg_url}
    with trio.fail_after(LIMIT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 2, separate=True) as (a, b),
        ):
            assert a.data_dir != b.data_dir
            admin = await store_user(env, "alice", "admin")
            first = await store_user(env, "bob")
            async with connect_as(a.url, first) as on_a, connect_as(b.url, first) as on_b:
                sid = await started(on_b, "hello")
                await on_b.until_end(sid)
                token = await rotate(env, "bob")
                for c in (on_a, on_b):
                    await refused_for(c, "the token of user bob was replaced")
            async with (
                connect_as(a.url, token) as on_a,
                connect_as(b.url, token) as on_b,
                connect_as(a.url, admin) as alice,
            ):
                added = await on_a.request(
                    {"type": "schedule", "action": "add", "session_id": sid,
                     "message": "check the inbox", "every": "10m"}
                )  # fmt: skip
                assert added["type"] == "schedules", added
                await started(on_b, "think long", session_id=sid)  # B runs the turn
                ok = await alice.request({"type": "subscribe", "session_id": sid})
                assert ok["type"] == "ok", ok
                await forked_users(env, "remove", "bob")
                for c in (on_a, on_b):
                    await refused_for(c, "user bob was removed")
                # B stopped the turn; alice, on A, follows it there.
                end = await alice.until_end(sid)
                assert end["reason"] == "stopped", end
                rows = sql(pg_url, "SELECT session_id FROM schedules")
                assert rows == [], rows
                assert sql(pg_url, "SELECT id FROM sessions") == [(sid,)]
            await hello_refused(b.url, token)
            assert len(llm.chat_requests) == 2


async def test_a_removed_users_background_job_is_cancelled_at_the_removal(
    tmp_path: Path,
) -> None:
    # bob's job would run for ten minutes; his removal ends it at once, and the admin
    # following his session sees it end as cancelled.
    job = {"tool_calls": [{"name": "terminal", "arguments": {
        "action": "run", "command": "sleep 600", "background": True}}]}  # fmt: skip
    replies: list[dict[str, Any]] = [job, {"text": "started it"}]
    with trio.fail_after(LIMIT):
        async with one_daemon(tmp_path, replies) as (daemon, env, llm):
            admin = await store_user(env, "alice", "admin")
            bob_token = await store_user(env, "bob")
            async with (
                connect_as(daemon.url, bob_token) as bob,
                connect_as(daemon.url, admin) as alice,
            ):
                sid = await started(bob, "start the long job")
                await bob.until_end(sid)
                listed = await alice.request({"type": "tasks", "action": "list", "session_id": sid})
                (task,) = listed["tasks"]
                assert task["status"] == "running", task
                ok = await alice.request({"type": "subscribe", "session_id": sid})
                assert ok["type"] == "ok", ok
                await forked_users(env, "remove", "bob")
                ended = await alice.until_type("task_update", session_id=sid)
                assert ended["task_id"] == task["task_id"], json.dumps(ended)
                assert ended["status"] == "cancelled", json.dumps(ended)
            assert len(llm.chat_requests) == 2  # no turn woke for it


async def test_a_removed_users_session_is_never_woken_after_a_restart(tmp_path: Path) -> None:
    # bob's session wakes when a background job ends. The daemon dies with his job
    # running (its marker left, naming a dead process); bob is removed while it is down.
    # The next start finds the job lost: its note is kept for whoever writes there next,
    # and no turn runs for bob (before: one ran, woken as role `user`).
    config = no_plan_config(tmp_path, wake_on_task_done=True)
    env = clean_env(tmp_path, NAVI_CONFIG=str(config))
    replies = [{"text": "hi bob"}, {"text": "the admin is answered"}]
    with trio.fail_after(LIMIT):
        async with open_fake_llm(replies) as llm:
            admin = await store_user(env, "alice", "admin")
            bob_token = await store_user(env, "bob")
            async with (
                navi_serve(env, llm.url, tmp_path / "daemon.log", forked=True) as daemon,
                connect_as(daemon.url, bob_token) as bob,
            ):
                sid = await started(bob, "hello")
                await bob.until_end(sid)
            async with SQLiteStore.open(tmp_path / "navi.db") as store:
                marker = {"session_id": sid, "task_id": "bt-gone", "tool": "terminal",
                          "args_summary": "make test", "is_spawn": False, "pid": dead_pid(),
                          "host": socket.gethostname()}  # fmt: skip
                await store.kv_set(RUNNING_SCOPE, f"{sid}:bt-gone", marker)
            await forked_users(env, "remove", "bob")
            async with (
                navi_serve(env, llm.url, tmp_path / "daemon.log", forked=True) as daemon,
                connect_as(daemon.url, admin) as alice,
            ):
                ok = await alice.request({"type": "subscribe", "session_id": sid})
                assert ok["type"] == "ok", ok
                again = await started(alice, "what happened here?", session_id=sid)
                end = await alice.until_end(again)
                assert end["text"] == "the admin is answered", end
                assert not [f for f in alice.frames if f["type"] == "woken"], alice.frames
            # Two turns in all: bob's and the admin's, which got the lost job's note.
            assert len(llm.chat_requests) == 2
            notes = system_notes(llm.chat_requests[1]["body"])
            assert any("bt-gone" in n and "make test" in n for n in notes), notes


async def test_on_postgresql_the_daemon_running_a_removed_users_job_cancels_it(
    tmp_path: Path, pg_url: str
) -> None:
    # bob, on daemon B, starts a background sub-agent whose LLM call never answers (nor
    # does his turn's next one: whichever asks first, both wait). The admin follows his
    # session from daemon A. `navi users remove bob` on the shared database: B stops his
    # turn and cancels his job (no process of his to kill: only the cancel ends it), and
    # A relays both ends to the admin.
    spawn = {"tool_calls": [{"name": "spawn_agent", "arguments": {
        "task": "think for ever", "background": True}}]}  # fmt: skip
    replies: list[dict[str, Any]] = [spawn, STALL, STALL]
    env = {**clean_env(tmp_path), "NAVI_DB": pg_url}
    with trio.fail_after(LIMIT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 2, separate=True) as (a, b),
        ):
            admin = await store_user(env, "alice", "admin")
            bob_token = await store_user(env, "bob")
            async with connect_as(b.url, bob_token) as bob, connect_as(a.url, admin) as alice:
                sid = await started(bob, "start the helper")
                await bob.until_type("task_update", session_id=sid, status="running")
                ok = await alice.request({"type": "subscribe", "session_id": sid})
                assert ok["type"] == "ok", ok
                listed = await alice.request({"type": "tasks", "action": "list"})
                (task,) = listed["tasks"]
                assert (task["tool"], task["status"]) == ("spawn_agent", "running"), task
                await forked_users(env, "remove", "bob")
                with trio.fail_after(30):  # the job would run for hours without the cancel
                    ended = await alice.until_type("task_update", session_id=sid,
                                                   status="cancelled")  # fmt: skip
                assert ended["task_id"] == task["task_id"], ended
                end = await alice.until_end(sid)
                assert end["reason"] == "stopped", end
            # The turn's, the helper's and (if it came first) the turn's next: no more.
            assert len(llm.chat_requests) <= 3
