"""A full disk is an error, not a loss (issue 17, item 5).

`ok` goes out only once a message is committed; a message the disk has no room for gets
an error `storage_full` and nothing of it is kept (not in the history, not after a
restart, not by the next save once space is back). The daemon says so in one log line,
goes on serving reads, and takes messages again when space returns. A queued message,
acknowledged before its run found no room for its save, keeps its place: it runs again
(after a backoff, or when another message arrives) before the messages after it, and a
stop drops it.

Two ways to fill the disk, both on a real SQLite file and real WebSocket connections:
- deterministic: ``PRAGMA max_page_count`` on the store's own connection caps the file
  at its current size, so SQLite itself answers SQLITE_FULL ("database or disk is
  full") to any write that needs a new page (a 90 KB message does);
- real: the database on a 4 MB tmpfs filled up by another file (skipped, saying why,
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
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import EchoTool, GateTool, call, toolset, with_tools
from api_ws import Client, Daemon, open_daemon
from realtime import held, real_time_limit

from navi_trio.core.session.session_actor import KEPT_RETRY_FIRST_SEC
from navi_trio.core.turn import UserMessage
from navi_trio.store import SessionStore, SQLiteStore
from navi_trio.testing import open_harness
from navi_trio.testing.harness import Harness, SessionDriver

TIMEOUT = 60
BIG = 90_000  # characters: a message that needs new pages of its own
NO_PLAN = {"general": {"planning_first_message": False}}  # one LLM call per message
UNCAPPED = 1_073_741_823
BIG_WINDOW = 131_072  # tokens: a 90 KB message fits the model's window


async def _cap(d: Daemon | Harness, *, full: bool) -> None:
    """Cap the database at its size now (full) or lift the cap, on the store's thread."""

    def cap(db: Any) -> None:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count={pages if full else UNCAPPED}")

    store = (d.harness if isinstance(d, Daemon) else d).runtime.store
    assert isinstance(store, SQLiteStore)
    await store.run_raw_for_tests("cap the file", cap)


async def _users(store: SessionStore, sid: str = "alice.S") -> list[str]:
    return [m["content"][:20] for m in await store.load_messages(sid) if m["role"] == "user"]


def _full_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.levelno >= logging.WARNING and "full" in r.getMessage()
    ]  # fmt: skip


async def _stored(store: SessionStore, sid: str = "alice.S") -> tuple[list[str], list[str]]:
    """The session's user messages in the history and in its queue (oldest first), read
    in one job on the store's thread: nothing moves from one to the other in between."""
    assert isinstance(store, SQLiteStore)

    def read(db: Any) -> tuple[list[str], list[str]]:
        rows = db.execute(
            "SELECT data FROM messages WHERE session_id = ? ORDER BY position", [sid]
        ).fetchall()
        said = [m["content"][:20] for m in map(json.loads, (r[0] for r in rows))
                if m["role"] == "user"]  # fmt: skip
        queued = db.execute("SELECT data FROM queued WHERE session_id = ? ORDER BY id", [sid])
        return said, [json.loads(row[0])["text"][:20] for row in queued.fetchall()]

    return await store.run_raw_for_tests("history and queue", read)


GATED = {"general": with_tools(["gate"], planning_first_message=False)}


async def _ends(c: Client, after: int, count: int) -> list[str]:
    """The texts of the session's next `count` stream_end frames after seq `after`."""
    texts: list[str] = []
    for _ in range(count):
        end = await c.until(_end_after(after))
        after = end["seq"]
        texts.append(end["text"])
    return texts


def _end_after(seq: int) -> Callable[[dict[str, Any]], bool]:
    return lambda f: f["type"] == "stream_end" and f.get("seq", 0) > seq


def _warning(code: str, after: int = 0) -> Any:
    return lambda f: f["type"] == "warning" and f.get("code") == code and f["seq"] > after


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


@contextlib.asynccontextmanager
async def _run_at_the_gate_on_a_full_disk(
    tmp_path: Path,
) -> AsyncIterator[tuple[Daemon, Client, GateTool]]:
    """A daemon and alice's connection: "first" runs and waits at the gate (its answer
    "first done" comes once the gate opens); then the disk is full."""
    gate = GateTool()
    replies = [call("gate"), {"text": "first done"}]
    async with open_daemon(
        tmp_path, replies=replies, tools=toolset(gate), profiles=GATED, num_ctx=BIG_WINDOW,
        steer_max_chars=2 * BIG,
    ) as d, d.connect("alice") as c:  # fmt: skip
        await c.request({"type": "sessions", "action": "create", "session_id": "alice.S"})
        assert (await _send(c, "first", "first"))["type"] == "ok"
        await gate.entered.wait()
        await _cap(d, full=True)
        yield d, c, gate


async def _first_ends_alone(d: Daemon, c: Client, gate: GateTool) -> None:
    """Room again, the gate opens: the run ends with "first done", and nothing else of
    the session was stored or asked of the model."""
    await _cap(d, full=False)
    gate.gate.set()
    end = await c.until(lambda f: f["type"] == "stream_end" and "seq" in f)
    assert end["text"] == "first done"
    actor = d.harness.runtime.sessions.actor("alice.S")
    assert actor is not None
    await actor.idle.wait()
    last = d.harness.chat_requests[-1]["messages"]
    assert [m["content"][:5] for m in last if m["role"] == "user"] == ["first"]
    assert await _stored(d.harness.runtime.store) == (["first"], [])
    assert len(d.harness.chat_requests) == 2  # the gate call and the answer


async def test_a_message_queued_on_a_full_disk_is_refused_and_never_runs(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with _run_at_the_gate_on_a_full_disk(tmp_path) as (d, c, gate):
            refused = await _send(c, "queued", "queued " + "y" * BIG)
            assert (refused["type"], refused["code"]) == ("error", "storage_full")
            await _first_ends_alone(d, c, gate)
        with contextlib.closing(sqlite3.connect(tmp_path / "navi.db")) as conn:
            assert conn.execute("SELECT COUNT(*) FROM queued").fetchone()[0] == 0


async def test_a_steered_message_whose_queue_write_failed_never_joins_the_running_turn(
    tmp_path: Path,
) -> None:
    # Its sender was told storage_full: the turn must not take it in afterwards, even
    # once the disk has room again (it would be saved then, as if it had been accepted).
    with trio.fail_after(TIMEOUT):
        async with _run_at_the_gate_on_a_full_disk(tmp_path) as (d, c, gate):
            steer = {"type": "message", "content": "steer " + "s" * BIG, "session_id": "alice.S",
                     "on_busy": "steer", "id": "steer"}  # fmt: skip
            await c.send(steer)
            refused = await c.until(lambda f: f.get("id") == "steer")
            assert (refused["type"], refused["code"]) == ("error", "storage_full"), refused
            await _first_ends_alone(d, c, gate)
            assert not [f for f in c.frames if f["type"] in ("steered", "message_queued")]


@contextlib.asynccontextmanager
async def _kept_on_a_full_disk(
    tmp_path: Path, *answers: str
) -> AsyncIterator[tuple[Daemon, Client, dict[str, Any]]]:
    """A daemon and alice's connection: a run held at the gate; "kept" (big) and "third"
    queued behind it, both ok'd (their rows are in); then the disk is full when the gate
    opens, and the kept message's run finds no room for its save. Yields its
    message_kept warning too. `answers`: the model's texts, "first done" first."""
    gate = GateTool()
    replies = [call("gate"), *({"text": text} for text in answers)]
    async with open_daemon(
        tmp_path, replies=replies, tools=toolset(gate), profiles=GATED, num_ctx=BIG_WINDOW
    ) as d, d.connect("alice") as c:  # fmt: skip
        await c.request({"type": "sessions", "action": "create", "session_id": "alice.S"})
        assert (await _send(c, "first", "first"))["type"] == "ok"
        await gate.entered.wait()
        for rid, text in (("kept", "kept " + "k" * BIG), ("third", "third")):
            got = await _send(c, rid, text)
            assert got["type"] == "ok", got  # queued: its row is committed
        await _cap(d, full=True)
        gate.gate.set()
        first = await c.until(lambda f: f["type"] == "stream_end" and "seq" in f)
        assert first["text"] == "first done"
        refused = await c.until(lambda f: f["type"] == "error" and f.get("seq", 0) > first["seq"])
        assert refused["code"] == "storage_full", refused
        kept = await c.until(_warning("message_kept"))
        assert "runs again in 1 s or when another message comes" in kept["message"], kept
        assert "full" in kept["message"]
        yield d, c, kept


async def test_a_queued_message_whose_save_meets_a_full_disk_keeps_its_place(
    tmp_path: Path,
) -> None:
    # Acknowledged, so never dropped by the disk: it runs again, first, once there is
    # room, and the messages after it wait behind it.
    answers = ("first done", "kept done", "third done", "4th done")
    with trio.fail_after(TIMEOUT):
        async with _kept_on_a_full_disk(tmp_path, *answers) as (d, c, kept):
            store = d.harness.runtime.store
            assert await _stored(store) == (["first"], ["kept " + "k" * 15, "third"])
            await _cap(d, full=False)
            # Another message: the kept one tries again at once, and now has room.
            assert (await _send(c, "4th", "4th"))["type"] == "ok"
            assert await _ends(c, kept["seq"], 3) == ["kept done", "third done", "4th done"]
            assert await _stored(store) == (["first", "kept " + "k" * 15, "third", "4th"], [])
            assert not [f for f in c.frames if f["type"] == "warning"
                        and f.get("code") == "message_dropped"]  # fmt: skip


async def test_a_kept_message_tries_again_when_another_comes_while_the_disk_is_full(
    tmp_path: Path,
) -> None:
    answers = ("first done", "kept done", "third done", "4th done", "5th done")
    with trio.fail_after(TIMEOUT):
        async with _kept_on_a_full_disk(tmp_path, *answers) as (d, c, kept):
            # Still full: the arrival makes it try again, it fails again, and it waits
            # longer; the new message (small: its row fits) queues behind it.
            assert (await _send(c, "4th", "4th"))["type"] == "ok"
            again = await c.until(_warning("message_kept", kept["seq"]))
            delay = float(again["message"].split("runs again in ")[1].split()[0])
            assert delay >= 2, again
            store = d.harness.runtime.store
            assert await _stored(store) == (["first"], ["kept " + "k" * 15, "third", "4th"])
            await _cap(d, full=False)
            actor = d.harness.runtime.sessions.actor("alice.S")
            assert actor is not None
            actor.send_message("5th")  # any arrival: the kept one goes first
            await actor.idle.wait()
            said, queued = await _stored(store)
            assert said == ["first", "kept " + "k" * 15, "third", "4th", "5th"] and queued == []


async def test_a_stop_drops_the_kept_message_and_the_next_one_runs(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with _kept_on_a_full_disk(tmp_path, "first done", "third done") as (d, c, kept):
            await _cap(d, full=False)
            ok = await c.request({"type": "stop", "session_id": "alice.S"})
            assert ok["stopped"] is True
            dropped = await c.until(_warning("message_dropped", kept["seq"]))
            assert "dropped (stopped)" in dropped["message"]
            end = await c.until(lambda f: f["type"] == "stream_end" and f["seq"] > dropped["seq"])
            assert end["text"] == "third done"
            actor = d.harness.runtime.sessions.actor("alice.S")
            assert actor is not None
            await actor.idle.wait()
            assert await _stored(d.harness.runtime.store) == (["first", "third"], [])


@contextlib.asynccontextmanager
async def _kept_in_harness(
    tmp_path: Path, clock: trio.testing.MockClock, *answers: str
) -> AsyncIterator[tuple[Harness, SessionDriver, float]]:
    """As `_kept_on_a_full_disk`, in a harness on the autojump clock (it jumps only once
    every task has waited 10 ms of real time, and never while the store's thread works:
    tests/realtime.py `held`): the kept message's first message_kept warning has come;
    yields the virtual time it came at. `answers`: the model's texts, "first done"
    first."""
    gate = GateTool()
    replies = [call("gate"), *({"text": text} for text in answers)]
    far = 1e5  # every other deadline: out of the way
    with held(clock):
        async with open_harness(
            tmp_path, replies=replies, tools=toolset(gate), profiles=GATED,
            num_ctx=BIG_WINDOW, first_chunk_timeout=far, chunk_timeout=far,
            session_idle_sec=far, llm_connect_timeout=far,
        ) as h:  # fmt: skip
            s = await h.session("alice.S")
            s.send("first")
            await gate.entered.wait()
            s.actor.send_message("kept " + "k" * BIG)
            (kept,) = s.actor.pending
            await kept.accepted.wait()  # its row is in: acknowledged
            await _cap(h, full=True)
            gate.gate.set()
            warning = await _next_warning(s)
            assert f"runs again in {KEPT_RETRY_FIRST_SEC:g} s" in warning["message"], warning
            yield h, s, trio.current_time()


async def _next_warning(s: SessionDriver) -> dict[str, Any]:
    (warning,) = (await s.until_type("warning"))[-1:]
    assert warning["code"] == "message_kept", warning
    return warning


async def test_a_kept_message_tries_again_by_itself_after_a_backoff_that_doubles(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # No other message comes: the kept one tries again after 1 s, then 2 s (virtual
    # time), and runs once there is room.
    with real_time_limit(TIMEOUT):
        async with _kept_in_harness(tmp_path, autojump_clock, "first done", "kept done") as (
            h,
            s,
            t1,
        ):
            said2 = (await _next_warning(s))["message"]
            t2 = trio.current_time()
            assert f"runs again in {2 * KEPT_RETRY_FIRST_SEC:g} s" in said2
            assert KEPT_RETRY_FIRST_SEC <= t2 - t1 < 2 * KEPT_RETRY_FIRST_SEC, (t1, t2)
            await _cap(h, full=False)
            end = (await s.until_end())[-1]
            assert end["text"] == "kept done"
            assert trio.current_time() - t2 >= 2 * KEPT_RETRY_FIRST_SEC
            await s.idle()
            assert await _stored(h.runtime.store) == (["first", "kept " + "k" * 15], [])


async def test_a_steered_message_makes_the_kept_one_try_again_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # A message sent to steer is a message arriving too: the kept one tries again then,
    # not at the end of its backoff; the steered one runs next, after it.
    answers = ("first done", "kept done", "steered done")
    with real_time_limit(TIMEOUT):
        async with _kept_in_harness(tmp_path, autojump_clock, *answers) as (h, s, t1):
            s.actor.send_message(UserMessage("steered", on_busy="steer"))
            said2 = (await _next_warning(s))["message"]
            assert trio.current_time() - t1 < KEPT_RETRY_FIRST_SEC  # not the backoff's
            assert f"runs again in {2 * KEPT_RETRY_FIRST_SEC:g} s" in said2
            await _cap(h, full=False)
            await s.idle()
            assert await _stored(h.runtime.store) == (
                ["first", "kept " + "k" * 15, "steered"],
                [],
            )


# --- a real full disk: the database on a 4 MB tmpfs ------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 4 MB tmpfs here: {mounted.stderr.strip() or 'refused'}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(where: Path, leave: int) -> Path:
    """A file that takes the free blocks of the small disk but `leave` bytes (it writes
    8 MB at most). The disk is 4 MB: once the file goes, the kept messages (each in the
    history and the context, with their WAL frames) and the store's reopening have room."""
    filler = where / "filler"
    chunk = b"\0" * 16384
    with filler.open("wb", buffering=0) as f:
        for _ in range(512):
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        f.truncate(max(0, f.tell() - leave))
    return filler


@pytest.mark.slow
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
                # An ok'd message whose run then found no room for its save keeps its
                # row in the session's durable queue (committed before the ok), and its
                # place: it waits to run again, with the ok'd ones after it.
                said, queued = await _stored(d.harness.runtime.store)
                assert said + queued == kept
                # Space returns: the daemon takes messages again, the kept ones first.
                filler.unlink()
                ok = await _send(c, "after", "after the space came back")
                assert ok["type"] == "ok"
                actor = d.harness.runtime.sessions.actor("alice.S")
                assert actor is not None
                await actor.idle.wait()
        async with SQLiteStore.open(db) as reopened:
            assert await _stored(reopened) == ([*kept, "after the space came"], [])


async def test_a_turn_cut_short_by_a_full_disk_after_its_save_runs_again(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The message was saved (acknowledged), then a save of its turn found the disk
    full: the message is kept, as one refused before its save is. It says so, and once
    there is room its turn runs again from what the store holds (the unsaved call
    paired on load), without a second copy of the message: it gets its answer."""
    gate = GateTool()
    replies = [call("gate"), call("echo", size=20_000), {"text": "done after all"}]
    far = 1e5
    with held(autojump_clock), real_time_limit(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, tools=toolset(gate, EchoTool()),
            profiles={"general": with_tools(["gate", "echo"], planning_first_message=False)},
            num_ctx=BIG_WINDOW, first_chunk_timeout=far, chunk_timeout=far,
            session_idle_sec=far, llm_connect_timeout=far,
        ) as h:  # fmt: skip
            s = await h.session("alice.S")
            s.send("go")
            await gate.entered.wait()  # the message is saved: acknowledged
            await _cap(h, full=True)
            gate.gate.set()  # the next round's results (100 KB) find no room
            kept = await _next_warning(s)
            assert "its turn was cut short" in kept["message"], kept
            assert "runs again in 1 s" in kept["message"], kept
            await _cap(h, full=False)
            end = (await s.until_end())[-1]
            assert (end["reason"], end["text"]) == ("complete", "done after all"), end
            await s.idle()
            saved = await h.runtime.store.load_messages("alice.S")
            assert [m["content"] for m in saved if m["role"] == "user"] == ["go"]
            assert saved[-1]["content"] == "done after all"
            assert h.chat_requests and len(h.chat_requests) == 3
            asked = [m["role"] for m in h.chat_requests[-1]["messages"]]
            assert asked.count("user") == 1 and asked.count("tool") == 2, asked
