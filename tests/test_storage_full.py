"""A full disk is an error, not a loss (issue 17, item 5).

`ok` goes out only once a message is committed; a message the disk has no room for gets
an error `storage_full` and nothing of it is kept (not in the history, not after a
restart, not by the next save once space is back). The daemon says so in one log line,
goes on serving reads, and takes messages again when space returns.

Two ways to fill the disk, both on a real SQLite file and real WebSocket connections:
- deterministic: ``PRAGMA max_page_count`` on the store's own connection caps the file
  at its current size, so SQLite itself answers SQLITE_FULL ("database or disk is
  full") to any write that needs a new page (a 90 KB message does);
- real: the database on a 2 MB tmpfs filled up by another file (skipped, saying why,
  where mounting is refused).

Rules: loopback only, port 0; the fake LLM over real HTTP; no sleeps; every test under
an absolute `trio.fail_after`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import GateTool, call, toolset, with_tools
from api_ws import Client, Daemon, open_daemon

from navi_trio.store import SessionStore, SQLiteStore

TIMEOUT = 60
BIG = 90_000  # characters: a message that needs new pages of its own
NO_PLAN = {"general": {"planning_first_message": False}}  # one LLM call per message
UNCAPPED = 1_073_741_823
BIG_WINDOW = 131_072  # tokens: a 90 KB message fits the model's window


async def _cap(d: Daemon, *, full: bool) -> None:
    """Cap the database at its size now (full) or lift the cap, on the store's thread."""

    def cap(db: Any) -> None:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count={pages if full else UNCAPPED}")

    store = d.harness.runtime.store
    assert isinstance(store, SQLiteStore)
    await store.run_raw_for_tests("cap the file", cap)


async def _users(store: SessionStore, sid: str = "alice.S") -> list[str]:
    return [m["content"][:20] for m in await store.load_messages(sid) if m["role"] == "user"]


def _full_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.levelno >= logging.WARNING and "full" in r.getMessage()
    ]  # fmt: skip


async def _queued(store: SessionStore, sid: str = "alice.S") -> list[str]:
    """The session's queued messages (oldest first), as `_users` gives the history's."""
    assert isinstance(store, SQLiteStore)
    return await store.run_raw_for_tests("queued messages", lambda db: [
        json.loads(row[0])["text"][:20] for row in db.execute(
            "SELECT data FROM queued WHERE session_id = ? ORDER BY id", [sid]
        ).fetchall()
    ])  # fmt: skip


async def _send(c: Client, rid: str, text: str) -> dict[str, Any]:
    await c.send({"type": "message", "content": text, "session_id": "alice.S", "id": rid})
    return await c.until(lambda f: f.get("id") == rid)


async def test_a_full_disk_refuses_each_message_and_keeps_nothing_of_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, profiles=NO_PLAN, replies=[{"text": "noted"}], num_ctx=BIG_WINDOW
        ) as d:
            async with d.connect("alice") as c:
                await c.request({"type": "sessions", "action": "create", "session_id": "alice.S"})
                await _cap(d, full=True)
                for n in range(3):
                    refused = await _send(c, f"big{n}", f"big {n} " + "x" * BIG)
                    assert (refused["type"], refused["code"], refused["session_id"]) == (
                        "error",
                        "storage_full",
                        "alice.S",
                    )
                    assert "full" in refused["message"] and "'alice.S'" in refused["message"]
                    event = await c.until(lambda f: f["type"] == "error" and "seq" in f)
                    assert event["code"] == "storage_full"
                    await c.until(lambda f: f["type"] == "stream_end")
                # One line in the log for the condition, not one per message.
                assert len(_full_lines(caplog)) == 1, _full_lines(caplog)
                # Reads go on while the disk is full.
                listed = await c.request({"type": "sessions", "action": "list"})
                assert [s["session_id"] for s in listed["sessions"]] == ["alice.S"]
                history = await c.request(
                    {"type": "sessions", "action": "history", "session_id": "alice.S"}
                )
                assert history["messages"] == []
                # Space is back: the next message is stored, and only it.
                await _cap(d, full=False)
                ok = await _send(c, "after", "after the space came back " + "x" * BIG)
                assert ok["type"] == "ok"
                end = await c.until(lambda f: f["type"] == "stream_end" and "seq" in f)
                assert end["reason"] == "complete"
                # The model saw it alone: the refused ones left no trace in memory either.
                (body,) = d.harness.chat_requests
                users = [m["content"] for m in body["messages"] if m["role"] == "user"]
                assert [u[:20] for u in users] == ["after the space came"]
            assert any("writes succeed again" in r.getMessage() for r in caplog.records)
        async with SQLiteStore.open(tmp_path / "navi.db") as reopened:
            assert await _users(reopened) == ["after the space came"]


async def test_a_message_queued_on_a_full_disk_is_refused_and_never_runs(
    tmp_path: Path,
) -> None:
    gate = GateTool()
    replies = [call("gate"), {"text": "first done"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate),
            profiles={"general": with_tools(["gate"], planning_first_message=False)},
        ) as d:  # fmt: skip
            async with d.connect("alice") as c:
                await c.request({"type": "sessions", "action": "create", "session_id": "alice.S"})
                ok = await _send(c, "first", "first")
                assert ok["type"] == "ok"
                await gate.entered.wait()
                await _cap(d, full=True)
                refused = await _send(c, "queued", "queued " + "y" * BIG)
                assert (refused["type"], refused["code"]) == ("error", "storage_full")
                await _cap(d, full=False)
                gate.gate.set()
                end = await c.until(lambda f: f["type"] == "stream_end" and "seq" in f)
                assert end["text"] == "first done"
                actor = d.harness.runtime.sessions.actor("alice.S")
                assert actor is not None
                await actor.idle.wait()
                # It never ran: one run, one user message.
                assert await _users(d.harness.runtime.store) == ["first"]
                assert len(d.harness.chat_requests) == 2  # the gate call and the answer
        with contextlib.closing(sqlite3.connect(tmp_path / "navi.db")) as conn:
            assert conn.execute("SELECT COUNT(*) FROM queued").fetchone()[0] == 0


# --- a real full disk: the database on a 2 MB tmpfs ------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 2 MB tmpfs here: {mounted.stderr.strip() or 'refused'}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(where: Path, leave: int) -> Path:
    """A file that takes the free blocks of the small disk but `leave` bytes (it writes
    4 MB at most)."""
    filler = where / "filler"
    chunk = b"\0" * 16384
    with filler.open("wb", buffering=0) as f:
        for _ in range(256):
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        f.truncate(max(0, f.tell() - leave))
    return filler


async def test_on_a_real_full_disk_every_ok_is_stored_and_every_refusal_is_gone(
    tmp_path: Path, small_disk: Path
) -> None:
    db = small_disk / "navi.db"
    outcome: dict[str, str] = {}
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, db_path=db, profiles=NO_PLAN, replies=[{"text": "noted"}], loop=True,
            num_ctx=BIG_WINDOW,
        ) as d:  # fmt: skip
            async with d.connect("alice") as c:
                await c.request({"type": "sessions", "action": "create", "session_id": "alice.S"})
                # Room for a few of the messages below, not for all twelve.
                filler = await trio.to_thread.run_sync(_fill, small_disk, 600_000)
                for n in range(12):
                    text = f"message {n:02} " + "z" * BIG
                    got = await _send(c, f"m{n}", text)
                    outcome[text[:20]] = got["type"] if got["type"] == "ok" else got["code"]
                    if got["type"] == "ok":
                        await c.until(lambda f: f["type"] == "stream_end" and "seq" in f)
                assert set(outcome.values()) <= {"ok", "storage_full"}, outcome
                assert "storage_full" in outcome.values(), outcome
                assert "ok" in outcome.values(), outcome
                kept = [t for t, o in outcome.items() if o == "ok"]
                history = await c.request(
                    {"type": "sessions", "action": "history", "session_id": "alice.S"}
                )
                said = [m["content"][:20] for m in history["messages"] if m["role"] == "user"]
                # An ok'd message whose run then found no room for its save keeps its
                # row in the session's durable queue (committed before the ok; it runs
                # when the session's actor next starts): stored, in the queue.
                queued = await _queued(d.harness.runtime.store)
                assert said + queued == kept
                # Space returns: the daemon takes messages again.
                filler.unlink()
                ok = await _send(c, "after", "after the space came back")
                assert ok["type"] == "ok"
                await c.until(lambda f: f["type"] == "stream_end" and f.get("reason") == "complete")
        async with SQLiteStore.open(db) as reopened:
            assert await _users(reopened) == [*said, "after the space came"]
            assert await _queued(reopened) == queued  # still there, to run at the next start
