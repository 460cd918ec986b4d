"""Durable queued messages (issue 11): a message acknowledged as queued survives a crash.

The store keeps a queued message until the transaction that appends it to the history
takes it off the queue; a session actor adopts what a dead process left queued and
runs it first, in order. (The SIGKILL of a real `navi serve` is in
tests/test_reliability_crash.py.)

Rules: real SQLite files under tmp_path, no sleeps; every test under an absolute
`trio.fail_after` (real clock: the store's worker thread works in real time).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import GateTool, call, gated_harness, toolset, with_tools
from api_ws import open_daemon

from navi_trio.core.session.queued import DurableQueue, deliver
from navi_trio.core.turn import UserMessage
from navi_trio.core.turn.agent import DEAD_TURN
from navi_trio.errors import NaviError, StorageError, StoreError
from navi_trio.store import SessionStore, SQLiteStore
from navi_trio.store.base import HANDED_HOST, HANDED_PID
from navi_trio.testing import open_harness
from navi_trio.testing.harness import Harness

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 30
HOST = socket.gethostname() or "localhost"


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped): a crashed daemon's."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(proc.stdout)


def _queued(db: Path) -> list[tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return list(conn.execute("SELECT session_id, key FROM queued ORDER BY id"))


def _row(text: str) -> dict[str, Any]:
    return {"text": text, "user_id": "local", "user_role": "user"}


async def test_a_queued_row_leaves_exactly_when_its_history_row_arrives(tmp_path: Path) -> None:
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(db) as store:
            await store.create_session("s1", profile_id="general")
            await store.enqueue("s1", "k1", _row("B"), pid=os.getpid(), host=HOST)
            await store.enqueue("s1", "k2", _row("C"), pid=os.getpid(), host=HOST)
            assert _queued(db) == [("s1", "k1"), ("s1", "k2")]
            # The append fails inside its transaction: the queued row stays with it.
            with contextlib.closing(sqlite3.connect(db)) as conn:
                conn.execute("CREATE TRIGGER boom BEFORE INSERT ON messages"
                             " BEGIN SELECT RAISE(ABORT, 'disk on fire'); END")  # fmt: skip
                conn.commit()
            user = {"role": "user", "content": "B"}
            with pytest.raises(StoreError, match="disk on fire"):
                await store.append("s1", messages=[user], context=[user], dequeue="k1")
            assert await store.load_messages("s1") == []
            assert _queued(db) == [("s1", "k1"), ("s1", "k2")]
            with contextlib.closing(sqlite3.connect(db)) as conn:
                conn.execute("DROP TRIGGER boom")
                conn.commit()
            await store.append("s1", messages=[user], context=[user], dequeue="k1")
            assert await store.load_messages("s1") == [user]
            assert _queued(db) == [("s1", "k2")]
            # Dropped from a full queue: gone; a second time there is nothing to drop.
            assert await store.unqueue("k2") is True
            assert await store.unqueue("k2") is False
            assert _queued(db) == []


async def test_only_the_rows_of_a_dead_process_are_adopted_in_order(tmp_path: Path) -> None:
    db = tmp_path / "navi.db"
    dead, alive = _dead_pid(), os.getppid()
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(db) as store:
            for sid in ("s1", "s2"):
                await store.create_session(sid, profile_id="general")
            await store.enqueue("s1", "a", _row("first"), pid=dead, host=HOST)
            await store.enqueue("s1", "b", _row("live one's"), pid=alive, host=HOST)
            await store.enqueue("s1", "c", _row("elsewhere"), pid=dead, host="another-host")
            await store.enqueue("s1", "d", _row("second"), pid=dead, host=HOST)
            await store.enqueue("s2", "e", _row("other session"), pid=dead, host=HOST)
            assert await store.queued_sessions() == ["s1", "s2"]
            me = os.getpid()
            got = await store.adopt_queued("s1", pid=me, host=HOST)
            assert [(k, r["text"]) for k, r in got] == [("a", "first"), ("d", "second")]
            # Now ours (alive): another process adopts nothing; we get them again.
            assert await store.adopt_queued("s1", pid=dead + 1_000_000, host=HOST) == []
            assert [k for k, _ in await store.adopt_queued("s1", pid=me, host=HOST)] == ["a", "d"]
            # Deleting a session deletes what it had queued.
            assert await store.delete_session("s2") is True
            assert await store.queued_sessions() == ["s1"]
            with pytest.raises(StoreError, match="invalid session id"):
                await store.enqueue("../x", "f", _row("x"), pid=me, host=HOST)


async def _users(store: SessionStore, sid: str = "s1") -> list[str]:
    return [m["content"] for m in await store.load_messages(sid) if m["role"] == "user"]


async def test_a_message_is_stored_before_it_is_acknowledged_and_leaves_when_it_runs(
    tmp_path: Path,
) -> None:
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with gated_harness(tmp_path, gate, [{"text": "1"}, {"text": "2"}],
                          message_queue_max=1) as h:  # fmt: skip
            actor = await h.runtime.sessions.get("s1")
            actor.send_message("hi")
            await gate.entered.wait()
            actor.send_message("dropped")
            actor.send_message("kept")
            *_, kept = actor.pending
            await kept.accepted.wait()  # what the daemon's ok waits for
            # The store's cap (1) dropped the older one when the newer was queued.
            assert [m.text for m in actor.pending] == ["kept"]
            assert [k for _, k in _queued(db)] == [kept.queue_key]
            gate.gate.set()
            await actor.idle.wait()
            assert await _users(h.runtime.store) == ["hi", "kept"]
            assert _queued(db) == []


async def test_after_a_crash_two_queued_messages_run_in_order_before_a_new_one(
    tmp_path: Path,
) -> None:
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        # What a SIGKILLed daemon leaves: its queued rows, its pid gone.
        async with SQLiteStore.open(db) as store:
            await store.create_session("s1", profile_id="general")
            user = {"role": "user", "content": "A"}
            await store.append("s1", messages=[user], context=[user])
            dead = _dead_pid()
            await store.enqueue("s1", "kb", _row("B"), pid=dead, host=HOST)
            await store.enqueue("s1", "kc", _row("C"), pid=dead, host=HOST)
        replies = [{"text": f"answer {n}"} for n in "BCD"]
        async with open_harness(tmp_path, replies=replies) as h:
            # As the daemon does: its actors adopt, and it starts them at start-up.
            h.runtime.sessions.adopt = True
            assert await h.runtime.sessions.resume_queued() == 1
            s = await h.session("s1")
            assert s.actor.busy  # B runs already
            s.send("D")
            await s.idle()
            messages = await h.runtime.store.load_messages("s1")
            said = [(m["role"], m["content"]) for m in messages]
            assert said == [
                ("user", "A"), ("user", "B"), ("assistant", "answer B"),
                ("user", "C"), ("assistant", "answer C"), ("user", "D"), ("assistant", "answer D"),
            ]  # fmt: skip
            assert _queued(db) == []
            # Each run saw the ones before it, once.
            last_user = [
                [m["content"] for m in body["messages"] if m["role"] == "user"]
                for body in h.chat_requests
            ]
            assert last_user == [["A", "B"], ["A", "B", "C"], ["A", "B", "C", "D"]]


async def test_a_graceful_shutdown_keeps_the_queue_for_the_next_start(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with gated_harness(tmp_path, gate, [{"text": "never"}]) as h:
            s = await h.session("s1")
            s.send("hi")
            await gate.entered.wait()
            s.send("queued at shutdown")
            await s.actor.pending[0].accepted.wait()
        async with open_harness(tmp_path, replies=[{"text": "now"}]) as h2:
            h2.runtime.sessions.adopt = True
            s = await h2.session("s1")
            await s.idle()
            assert await _users(h2.runtime.store) == ["hi", "queued at shutdown"]


async def test_an_embedded_runtime_leaves_a_crash_queue_to_the_daemon(tmp_path: Path) -> None:
    # `navi run` follows its own message only: a leftover run first would answer for it.
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(db) as store:
            await store.create_session("s1", profile_id="general")
            await store.enqueue("s1", "kb", _row("B"), pid=_dead_pid(), host=HOST)
        async with open_harness(tmp_path, replies=[{"text": "mine"}]) as h:
            frames = await h.turn("s1", "mine")
            assert frames[-1]["type"] == "stream_end"
            assert await _users(h.runtime.store) == ["mine"]
            assert [k for _, k in _queued(db)] == ["kb"]


async def test_the_ok_of_a_queued_message_comes_after_it_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The queue write is held until every task is blocked: an ok sent before the row
    # is committed would have reached the client by then, and the row would be missing.
    entered, gate = trio.Event(), trio.Event()
    enqueue = SQLiteStore.enqueue

    async def held(self: SQLiteStore, *args: Any, **kwargs: Any) -> None:
        entered.set()
        await gate.wait()
        await enqueue(self, *args, **kwargs)

    monkeypatch.setattr(SQLiteStore, "enqueue", held)
    replies = [{"text": "slow", "delay_first": 3600}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies) as d, d.connect("alice") as c:
            first = await c.request({"type": "message", "content": "A runs"})
            sid = str((await c.until_type("ok", id=first["id"]))["session_id"])
            async with trio.open_nursery() as nursery:

                async def open_gate() -> None:
                    await entered.wait()
                    await trio.testing.wait_all_tasks_blocked(cushion=0.01)
                    gate.set()

                nursery.start_soon(open_gate)
                ok = await c.request({"type": "message", "session_id": sid, "content": "B"})
                assert ok["type"] == "ok" and ok["queued"] is True, ok
                assert len(_queued(tmp_path / "navi.db")) == 1  # read at once, in this thread


async def test_an_adopted_message_refused_by_another_owners_lease_keeps_its_place(
    tmp_path: Path,
) -> None:
    # A crash left B queued; another live process holds the session's lease when the
    # daemon adopts it: B was acknowledged, so its run's refusal (session_busy) does not
    # drop it: it is kept, says so, and runs once the session is free again, first.
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(db) as store:
            await store.create_session("s1", profile_id="general")
            await store.enqueue("s1", "kb", _row("B"), pid=_dead_pid(), host=HOST)
            await store.claim_lease("s1", owner="another-process", pid=os.getpid(), host=HOST,
                                    ttl=300)  # fmt: skip
        replies = [{"text": "B done"}, {"text": "C done"}]
        no_plan = {"general": {"planning_first_message": False}}
        async with open_harness(tmp_path, replies=replies, profiles=no_plan) as h:
            s = await h.session("s1")
            h.runtime.sessions.adopt = True
            await s.actor.adopt_handed()  # what the start-up does (resume_queued)
            kept = (await s.until_type("warning"))[-1]
            assert kept["code"] == "message_kept", kept
            assert "another process runs the session now" in kept["message"], kept
            assert h.chat_requests == [] and _queued(db) == [("s1", "kb")]
            # The other process is done; a new message makes the kept one try at once.
            await h.runtime.store.release_lease("s1", owner="another-process")
            s.actor.send_message("C")
            ends = [(await s.until_end())[-1]["text"] for _ in range(2)]
            assert ends == ["B done", "C done"]
            await s.idle()
            assert await _users(h.runtime.store) == ["B", "C"]
        assert _queued(db) == []


async def test_a_new_message_meeting_a_session_another_daemon_took_is_queued_for_it(
    tmp_path: Path,
) -> None:
    """With daemons to hand messages to (a cluster), a new message whose claim finds
    the session run elsewhere (taken between the daemon's look and its claim) is stored
    and handed to that daemon, acknowledged as queued, not refused with session_busy;
    when nobody runs it by the time it is handed, it runs here, next."""
    handed: list[list[str]] = []

    async def hand_over(session_id: str, keys: list[str]) -> None:
        handed.append(keys)
        if len(handed) == 2:  # the other daemon is done by now: nobody to hand it to
            await h.runtime.store.release_lease(session_id, owner="another-daemon")
            raise NaviError("no other daemon runs it now")

    no_plan = {"general": {"planning_first_message": False}}
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "ran here"}], profiles=no_plan) as h:
            h.runtime.sessions.hand_over = hand_over
            await h.runtime.store.create_session("s1", profile_id="general")
            await h.runtime.store.claim_lease("s1", owner="another-daemon", pid=os.getpid(),
                                              host=HOST, ttl=300)  # fmt: skip
            s = await h.session("s1")
            first = UserMessage("for the other daemon")
            s.actor.send_message(first)
            await first.accepted.wait()  # stored: acknowledged (as queued)
            await s.actor.idle.wait()  # and handed over: nothing more runs here
            assert first.accepted.queued and handed and len(handed[0]) == 1
            assert [k for _, k in _queued(tmp_path / "navi.db")] == handed[0]
            second = UserMessage("runs here")
            s.actor.send_message(second)
            await second.accepted.wait()
            frames = await s.until_end()
            assert frames[-1]["text"] == "ran here", frames[-1]
            assert [f for f in frames if f["type"] in ("error", "warning")] == []
            assert await _users(h.runtime.store) == ["runs here"]
            assert len(handed) == 2 and len(h.chat_requests) == 1


class DyingOwner:
    """The daemon that took the session: it dies (SIGKILL: its lease row stays, its pid
    gone) when asked to take a message over (nobody to hand it to), and the cluster's
    look at the session (`Cluster.dead_turn`) then takes its lease over."""

    def __init__(self, store: SQLiteStore, owner: str, host: str) -> None:
        self.store, self.owner, self.host = store, owner, host
        self.dead = _dead_pid()
        self.taken: list[int] = []  # the generations the looks took over

    async def hand_over(self, session_id: str, keys: list[str]) -> None:
        def die(conn: Any) -> None:
            conn.execute("UPDATE leases SET pid = ? WHERE session_id = ?", [self.dead, session_id])

        await self.store.run_raw_for_tests("the owner dies", die)
        raise NaviError(f"session {session_id!r}: no other daemon runs it now")

    async def dead_turn(self, session_id: str) -> int | None:
        def take(conn: Any) -> int | None:
            row = conn.execute(
                "SELECT pid, generation FROM leases WHERE session_id = ? AND owner != ?",
                [session_id, self.owner],
            ).fetchone()
            if row is None or row[0] != self.dead:
                return None
            conn.execute(
                "UPDATE leases SET owner = ?, pid = ?, host = ?, generation = ?"
                " WHERE session_id = ?",
                [self.owner, os.getpid(), self.host, row[1] + 1, session_id],
            )
            return int(row[1]) + 1

        generation = await self.store.run_raw_for_tests("take the dead lease", take)
        if generation is not None:
            self.taken.append(generation)
        return generation


@contextlib.asynccontextmanager
async def owner_dies_when_handed(
    tmp_path: Path, replies: list[dict[str, Any]]
) -> AsyncIterator[tuple[Harness, DyingOwner]]:
    """Session s1, its lease held by another live daemon whose turn has saved its message
    "A"; a harness whose cluster hooks are a `DyingOwner`'s."""
    async with SQLiteStore.open(tmp_path / "navi.db") as seed:
        await seed.create_session("s1", profile_id="general")
        await seed.append("s1", messages=[{"role": "user", "content": "A"}])
        await seed.claim_lease("s1", owner="another-daemon", pid=os.getpid(), host=HOST,
                               ttl=300)  # fmt: skip
    no_plan = {"general": {"planning_first_message": False}}
    async with open_harness(tmp_path, replies=replies, profiles=no_plan) as h:
        store = h.runtime.store
        assert isinstance(store, SQLiteStore)
        leases = h.runtime.agent.leases
        owner = DyingOwner(store, leases.owner, leases.host)
        h.runtime.sessions.hand_over = owner.hand_over
        h.runtime.sessions.dead_turn = owner.dead_turn
        yield h, owner


def ended_dead(frames: list[dict[str, Any]]) -> bool:
    """The frames end as the turn of a dead daemon does."""
    ends = [(f["type"], f.get("code")) for f in frames[-2:]]
    return ends == [("error", "daemon_died"), ("stream_end", None)]


async def test_a_kept_message_whose_new_owner_died_ends_the_dead_turn_before_it_runs(
    tmp_path: Path,
) -> None:
    """In a cluster: B's run finds the session taken by another daemon, which dies
    before B can be handed to it (B is kept here). The turn that daemon left is ended
    (the history and the frames say it died) before B runs again."""
    replies = [{"text": "B done"}, {"text": "C done"}]
    with trio.fail_after(TIMEOUT):
        async with owner_dies_when_handed(tmp_path, replies) as (h, owner):
            await h.runtime.store.enqueue("s1", "kb", _row("B"), pid=_dead_pid(), host=HOST)
            h.runtime.sessions.adopt = True
            s = await h.session("s1")
            await s.actor.adopt_handed()
            kept = (await s.until_type("warning"))[-1]
            assert kept["code"] == "message_kept", kept
            s.actor.send_message("C")  # the kept one tries again at once
            assert ended_dead(await s.until_end())
            assert (await s.until_end())[-1]["text"] == "B done"
            assert len(owner.taken) == 1
            saved = await h.runtime.store.load_messages("s1")
            assert [(m["role"], m.get("error"), m["content"]) for m in saved[:4]] == [
                ("user", None, "A"), ("assistant", DEAD_TURN, ""),
                ("user", None, "B"), ("assistant", None, "B done"),
            ]  # fmt: skip


async def test_a_new_message_whose_owner_died_before_the_hand_over_ends_the_dead_turn_first(
    tmp_path: Path,
) -> None:
    """A new message's claim finds the session taken; the daemon that took it dies
    before the message can be handed to it, so it runs here, next: after the turn the
    dead daemon left is ended."""
    with trio.fail_after(TIMEOUT):
        async with owner_dies_when_handed(tmp_path, [{"text": "ran here"}]) as (h, owner):
            s = await h.session("s1")
            msg = UserMessage("runs here")
            s.actor.send_message(msg)
            await msg.accepted.wait()
            assert msg.accepted.error is None and msg.accepted.queued
            assert ended_dead(await s.until_end())
            assert (await s.until_end())[-1]["text"] == "ran here"
            assert len(owner.taken) == 1
            saved = await h.runtime.store.load_messages("s1")
            assert [(m["role"], m.get("error")) for m in saved] == [
                ("user", None), ("assistant", DEAD_TURN), ("user", None), ("assistant", None)
            ]  # fmt: skip


@contextlib.asynccontextmanager
async def _adopting(
    tmp_path: Path, gate: GateTool, replies: list[dict[str, Any]]
) -> AsyncIterator[tuple[Harness, Any]]:
    """A harness whose actors take in the store's queue (as a daemon's do), the gate
    tool offered and no first-message plan; the actor of session s1."""
    profiles = {"general": with_tools(["gate"], planning_first_message=False)}
    async with open_harness(tmp_path, replies=replies, tools=toolset(gate), profiles=profiles) as h:
        h.runtime.sessions.adopt = True
        yield h, await h.runtime.sessions.get("s1")


async def test_a_row_queued_before_a_local_one_runs_first_though_taken_in_after_it(
    tmp_path: Path,
) -> None:
    """A message another daemon handed over (its row first in the store's queue) that
    this daemon takes in only after one of its own was queued behind the same run:
    the lease holder runs the store's queue in its order, so the handed one runs first.
    (In a cluster: the owner paused before it took the handed message in, another
    daemon took the session over meanwhile and queued a message of its own.)"""
    gate = GateTool()
    replies = [call("gate"), {"text": "A done"}, {"text": "handed done"}, {"text": "local done"}]
    with trio.fail_after(TIMEOUT):
        async with _adopting(tmp_path, gate, replies) as (h, actor):
            actor.send_message("A")
            await gate.entered.wait()  # A's run holds the lease
            handed = _row("handed")
            await h.runtime.store.enqueue("s1", "h-1", handed, pid=HANDED_PID, host=HANDED_HOST)
            actor.send_message("local")  # queued here, its row behind the handed one
            await actor.queue.written(actor.pending[-1])
            await actor.adopt_handed()  # the hand-over's note, late
            gate.gate.set()
            await actor.idle.wait()
            assert await _users(h.runtime.store) == ["A", "handed", "local"]
        assert _queued(tmp_path / "navi.db") == []


async def test_an_interrupting_message_still_runs_before_those_queued_here(
    tmp_path: Path,
) -> None:
    """On a daemon (its actors take in the store's queue), a message sent with
    ``on_busy: interrupt`` stops the turn and runs next, ahead of a message queued
    before it here: the store's order does not put it back behind."""
    gate = GateTool()
    replies = [call("gate"), {"text": "C done"}, {"text": "B done"}]
    with trio.fail_after(TIMEOUT):
        async with _adopting(tmp_path, gate, replies) as (h, actor):
            actor.send_message("A")
            await gate.entered.wait()
            actor.send_message(UserMessage("B", on_busy="enqueue"))
            assert actor.send_message(UserMessage("C", on_busy="interrupt")) == "interrupt"
            await actor.idle.wait()
            assert await _users(h.runtime.store) == ["A", "C", "B"]
        assert _queued(tmp_path / "navi.db") == []


async def test_the_rows_an_actor_holds_are_not_adopted_again(tmp_path: Path) -> None:
    """A hand-over note makes the actor read the queue while its own messages wait in it:
    their rows are the process's own, and adoptable, but it holds them already."""
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with gated_harness(tmp_path, gate, [{"text": "1"}, {"text": "2"}]) as h:
            actor = await h.runtime.sessions.get("s1")
            actor.send_message("hi")
            await gate.entered.wait()
            actor.send_message("queued")
            (queued,) = actor.pending
            await queued.accepted.wait()  # its row is in, under this process's pid
            assert await actor.adopt_handed() == 0
            assert [m.text for m in actor.pending] == ["queued"]
            gate.gate.set()
            await actor.idle.wait()
            assert await _users(h.runtime.store) == ["hi", "queued"]


async def test_a_message_whose_queue_write_failed_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueue = SQLiteStore.enqueue

    async def failing(self: SQLiteStore, sid: str, key: str, row: Any, **kw: Any) -> Any:
        if row["text"] == "refused":
            raise StorageError("the disk is full")
        return await enqueue(self, sid, key, row, **kw)

    monkeypatch.setattr(SQLiteStore, "enqueue", failing)
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with gated_harness(tmp_path, gate, [{"text": "1"}, {"text": "2"}]) as h:
            s = await h.session("s1")
            s.send("hi")
            await gate.entered.wait()
            s.send("refused")
            s.send("kept")
            refused, kept = s.actor.pending
            await kept.accepted.wait()
            assert refused.accepted.failed  # its sender got the error
            gate.gate.set()
            ends = [(await s.until_end())[-1]["text"] for _ in range(2)]
            assert ends == ["1", "2"]  # no run of its own, not even one that fails
            await s.idle()
            assert not [f for f in s.frames if f["type"] == "error"]
            assert await _users(h.runtime.store) == ["hi", "kept"]
            assert len(h.chat_requests) == 3  # hi (two rounds), kept


async def test_queue_writes_go_out_one_at_a_time_in_the_order_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks started in one tick run in no fixed order: each row's write waits for the
    one before it to land, so the rows' order is the messages'."""
    enqueue = SQLiteStore.enqueue
    writing: list[str] = []
    most = 0

    async def counted(self: SQLiteStore, sid: str, key: str, row: Any, **kw: Any) -> Any:
        nonlocal most
        writing.append(key)
        most = max(most, len(writing))
        try:
            return await enqueue(self, sid, key, row, **kw)
        finally:
            writing.remove(key)

    monkeypatch.setattr(SQLiteStore, "enqueue", counted)
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with gated_harness(tmp_path, gate, [{"text": "1"}] * 6) as h:
            actor = await h.runtime.sessions.get("s1")
            actor.send_message("hi")
            await gate.entered.wait()
            for n in range(5):
                actor.send_message(f"m{n}")
            for msg in list(actor.pending):
                await msg.accepted.wait()
            assert most == 1
            assert [k for _, k in _queued(db)] == [m.queue_key for m in actor.pending]
            gate.gate.set()
            await actor.idle.wait()
            assert await _users(h.runtime.store) == ["hi", "m0", "m1", "m2", "m3", "m4"]


async def test_a_queued_message_refused_when_its_turn_comes_leaves_no_row(tmp_path: Path) -> None:
    """Refused before its save (here: its profile is unknown), an acknowledged message's
    row goes with it: a restart must not run it."""
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with gated_harness(tmp_path, gate, [{"text": "1"}]) as h:
            actor = await h.runtime.sessions.get("s1")
            sub = actor.subscribe()
            actor.send_message("hi")
            await gate.entered.wait()
            actor.send_message(UserMessage("nope", profile_id="no-such-profile"))
            (queued,) = actor.pending
            await queued.accepted.wait()
            assert len(_queued(db)) == 1
            gate.gate.set()
            await actor.idle.wait()
            assert _queued(db) == []
            assert await _users(h.runtime.store) == ["hi"]
            frames = []
            while True:
                try:
                    frames.append(sub.frames.receive_nowait())
                except trio.WouldBlock:
                    break
            assert [f["type"] for f in frames][-2:] == ["error", "stream_end"]
            sub.close()


async def test_a_message_the_store_queued_reaches_a_live_actor(tmp_path: Path) -> None:
    """`deliver` (a wake-up, a scheduled run) on a daemon whose actors adopt at start: an
    actor already there is handed the message, not merely looked up."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "1"}, {"text": "2"}]) as h:
            await h.turn("s1", "hi")
            sessions = h.runtime.sessions
            actor = sessions.actor("s1")
            assert actor is not None
            await actor.idle.wait()
            sessions.adopt = True
            row = _row("woken")
            await h.runtime.store.enqueue("s1", "w-1", row, pid=os.getpid(), host=HOST)
            await deliver(sessions, "s1", "w-1", row)
            assert actor.busy
            await actor.idle.wait()
            assert await _users(h.runtime.store) == ["hi", "woken"]


async def test_a_queue_write_cancelled_before_it_started_refuses_its_message(
    tmp_path: Path,
) -> None:
    """A shutdown while a message's row waits for the write before it: that message was
    never stored, and its sender hears so (not silence); the write under way lands."""
    entered, gate = trio.Event(), trio.Event()
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            await store.create_session("s1", profile_id="general")
            enqueue = store.enqueue

            async def held(*args: Any, **kwargs: Any) -> Any:
                entered.set()
                await gate.wait()
                return await enqueue(*args, **kwargs)

            store.enqueue = held  # type: ignore[method-assign]
            queue = DurableQueue("s1", store, pid=os.getpid(), host=HOST)
            async with trio.open_nursery() as nursery:
                first = queue.keep(nursery, UserMessage("first"))
                second = queue.keep(nursery, UserMessage("second"))
                await entered.wait()  # the first row's write is in the store's hands
                nursery.cancel_scope.cancel()
                gate.set()
            assert first.accepted.settled and not first.accepted.failed
            assert second.accepted.failed
            assert "not saved" in str(second.accepted.error)
            assert [k for _, k in _queued(tmp_path / "navi.db")] == [first.queue_key]
