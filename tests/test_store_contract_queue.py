"""The SessionStore contract on both stores: the durable queue, leases, durability, waiting.

Every test runs on a real SQLite file and on a fresh PostgreSQL database (the `backend`
fixture, tests/store_backends.py). "Two daemons" are two stores opened on the same
file or database. Rules: no sleeps; every test under an absolute `trio.fail_after`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import pytest
import trio
import trio.testing
from builders import user
from pg_server import pg_url_with_schema as pg_url_with_schema
from store_backends import Backend

from navi_trio.errors import DuplicateMessageError, LeaseLostError, StoreError
from navi_trio.store import statements
from navi_trio.store.base import KeyClaim
from navi_trio.store.fence import Fence, fenced

TIMEOUT = 30
HOST = socket.gethostname() or "localhost"


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped): a crashed daemon's."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(proc.stdout)


def _row(text: str) -> dict[str, Any]:
    return {"text": text, "user_id": "local", "user_role": "user"}


# -- the durable queue ------------------------------------------------------------------


async def test_a_queued_row_leaves_exactly_when_its_history_row_arrives(backend: Backend) -> None:
    queued = "SELECT session_id, key FROM queued ORDER BY id"
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s1", profile_id="general")
            await store.enqueue("s1", "k1", _row("B"), pid=os.getpid(), host=HOST)
            await store.enqueue("s1", "k2", _row("C"), pid=os.getpid(), host=HOST)
            assert await backend.query(queued) == [("s1", "k1"), ("s1", "k2")]
            # The append fails inside its transaction: the queued row stays with it.
            await backend.fail_inserts("messages", "disk on fire")
            with pytest.raises(StoreError, match="disk on fire"):
                await store.append("s1", messages=[user("B")], context=[user("B")], dequeue="k1")
            assert await store.load_messages("s1") == []
            assert await backend.query(queued) == [("s1", "k1"), ("s1", "k2")]
            await backend.allow_inserts("messages")
            await store.append("s1", messages=[user("B")], context=[user("B")], dequeue="k1")
            assert await store.load_messages("s1") == [user("B")]
            assert await backend.query(queued) == [("s1", "k2")]
            # Dropped from a full queue: gone; a second time there is nothing to drop.
            assert await store.unqueue("k2") is True
            assert await store.unqueue("k2") is False
            assert await backend.query(queued) == []
            with pytest.raises(StoreError):
                await store.enqueue("ghost", "k3", _row("x"), pid=1, host=HOST)
            with pytest.raises(StoreError, match="invalid session id"):
                await store.enqueue("../x", "f", _row("x"), pid=1, host=HOST)


@pytest.mark.slow
async def test_only_the_rows_of_a_dead_process_are_adopted_in_order(backend: Backend) -> None:
    dead, alive = _dead_pid(), os.getppid()
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            for sid in ("s1", "s2"):
                await store.create_session(sid, profile_id="general")
            await store.enqueue("s1", "a", _row("first"), pid=dead, host=HOST)
            await store.enqueue("s1", "b", _row("live one's"), pid=alive, host=HOST)
            await store.enqueue("s1", "c", _row("elsewhere"), pid=dead, host="another-host")
            await store.enqueue("s1", "d", _row("second"), pid=dead, host=HOST)
            await store.enqueue("s2", "e", _row("other session"), pid=dead, host=HOST)
            assert await store.queued_sessions() == ["s1", "s2"]
        async with backend.open() as store:  # what a restarted daemon finds
            me = os.getpid()
            got = await store.adopt_queued("s1", pid=me, host=HOST)
            assert [(k, r["text"]) for k, r in got] == [("a", "first"), ("d", "second")]
            # Now ours (alive): another process adopts nothing; we get them again.
            assert await store.adopt_queued("s1", pid=dead + 1_000_000, host=HOST) == []
            assert [k for k, _ in await store.adopt_queued("s1", pid=me, host=HOST)] == ["a", "d"]
            assert await store.delete_session("s2") is True
            assert await store.queued_sessions() == ["s1"]


# -- durability -------------------------------------------------------------------------


async def test_a_non_durable_append_is_committed_when_it_returns(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s1", profile_id="p")
            await store.enqueue("s1", "k1", _row("x"), pid=1, host=HOST)
            await store.append("s1", messages=[user("x")], durable=False, dequeue="k1")
            # Another connection (another process) sees it at once: committed.
            rows = await backend.query("SELECT role, content FROM messages")
            assert rows == [("user", "x")]
            assert await backend.query("SELECT key FROM queued") == []
            await store.append("s1", messages=[user("y")])
            assert await store.load_messages("s1") == [user("x"), user("y")]


# -- leases -----------------------------------------------------------------------------


async def test_a_live_lease_is_refused_to_another_owner_and_released_by_its_own(
    backend: Backend,
) -> None:
    me = os.getpid()
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            mine = await store.claim_lease("s-1", owner="a", pid=me, host=HOST, ttl=60)
            assert (mine.owner, mine.pid, mine.session_id) == ("a", me, "s-1")
            theirs = await store.claim_lease("s-1", owner="b", pid=me, host=HOST, ttl=60)
            assert (theirs.owner, theirs.pid) == ("a", me)
            assert (
                await store.claim_lease("s-2", owner="b", pid=1, host=HOST, ttl=60)
            ).owner == "b"
            again = await store.claim_lease("s-1", owner="a", pid=me, host=HOST, ttl=120)
            assert again.owner == "a" and again.expires_at > mine.expires_at
            assert await store.renew_lease("s-1", owner="a", ttl=60) is True
            assert await store.renew_lease("s-1", owner="b", ttl=60) is False
            await store.release_lease("s-1", owner="b")  # not b's: nothing happens
            assert (
                await store.claim_lease("s-1", owner="b", pid=1, host=HOST, ttl=60)
            ).owner == "a"
            await store.release_lease("s-1", owner="a")
            assert (
                await store.claim_lease("s-1", owner="b", pid=1, host=HOST, ttl=60)
            ).owner == "b"
            assert await store.renew_lease("s-1", owner="a", ttl=60) is False


@pytest.mark.slow
async def test_a_dead_or_expired_owners_lease_is_taken_over(backend: Backend) -> None:
    gone = _dead_pid()
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            # Same host, process gone: taken over at once, long TTL or not.
            await store.claim_lease("s-1", owner="crashed", pid=gone, host=HOST, ttl=3600)
            got = await store.claim_lease("s-1", owner="new", pid=os.getpid(), host=HOST, ttl=60)
            assert got.owner == "new"
            # Another host: its pid means nothing here; only expiry frees the lease.
            await store.claim_lease("s-2", owner="far", pid=gone, host="elsewhere", ttl=3600)
            got = await store.claim_lease("s-2", owner="new", pid=os.getpid(), host=HOST, ttl=60)
            assert (got.owner, got.host) == ("far", "elsewhere")
            await store.claim_lease("s-3", owner="far", pid=gone, host="elsewhere", ttl=-1)
            got = await store.claim_lease("s-3", owner="new", pid=os.getpid(), host=HOST, ttl=60)
            assert got.owner == "new"


async def test_two_daemons_claiming_one_lease_at_once_get_one_owner(backend: Backend) -> None:
    me = os.getpid()
    winners: dict[str, set[str]] = {}

    async def claim(store: Any, sid: str, owner: str) -> None:
        held = await store.claim_lease(sid, owner=owner, pid=me, host=HOST, ttl=60)
        winners.setdefault(sid, set()).add(held.owner)

    with trio.fail_after(TIMEOUT):
        async with backend.open() as one, backend.open() as two:
            async with trio.open_nursery() as nursery:
                for n in range(20):
                    nursery.start_soon(claim, one, f"race-{n}", "one")
                    nursery.start_soon(claim, two, f"race-{n}", "two")
    # Each claimer was told the same holder: one owner per session, never two.
    assert len(winners) == 20 and all(len(owners) == 1 for owners in winners.values())


# -- writers that wait ----------------------------------------------------------------------


async def test_two_daemons_appending_to_one_session_interleave_without_loss(
    backend: Backend,
) -> None:
    async def writer(store: Any, name: str) -> None:
        for n in range(15):
            await store.append("s1", messages=[user(f"{name}{n}")], context=[user(f"{name}{n}")])

    with trio.fail_after(TIMEOUT):
        async with backend.open() as one, backend.open() as two:
            await one.create_session("s1", profile_id="p")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer, one, "a")
                nursery.start_soon(writer, two, "b")
            got = [m["content"] for m in await two.load_messages("s1")]
    assert sorted(got) == sorted([f"a{n}" for n in range(15)] + [f"b{n}" for n in range(15)])
    for name in "ab":  # each writer's own messages in its order
        assert [m for m in got if m[0] == name] == [f"{name}{n}" for n in range(15)]


async def test_a_write_waiting_for_a_lock_keeps_trio_running_and_lands_though_cancelled(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s1", profile_id="p")
            async with backend.holding("s1"), trio.open_nursery() as nursery:
                nursery.start_soon(_append_expecting_cancel, store, "s1")
                await trio.testing.wait_all_tasks_blocked()  # the append waits for the lock
                # Trio is not blocked meanwhile: other tasks and threads get answers.
                assert await trio.to_thread.run_sync(lambda: "answered") == "answered"
                # The caller gives up; its write is not withdrawn.
                nursery.cancel_scope.cancel()
            # The lock is gone now. Leave at once: closing must let the write finish.
        async with backend.open() as store:
            assert await store.load_messages("s1") == [user("queued")]


async def _append_expecting_cancel(store: Any, sid: str) -> None:
    await store.append(sid, messages=[user("queued")])
    pytest.fail("the append should have been cancelled while it waited")


# -- client message keys ----------------------------------------------------------------


async def test_a_message_key_is_taken_once_with_its_message_and_kept_across_stores(
    backend: Backend,
) -> None:
    """The key goes in with the message that takes it (saved or queued): another message
    with it is refused, nothing of it stored; the same message saved again passes; a
    second store on the same database (a restarted daemon, another daemon) sees it."""
    first = KeyClaim("k-1", "m-1", {"seq": 4, "epoch": "e", "queued": False})
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s1", profile_id="general")
            assert await store.message_key("s1", "k-1") is None
            await store.append("s1", messages=[user("A")], context=[user("A")], claim=first)
            other = KeyClaim("k-1", "m-2", {"seq": 9})
            with pytest.raises(DuplicateMessageError, match="'k-1'"):
                await store.enqueue("s1", "q1", _row("again"), pid=1, host=HOST, claim=other)
            with pytest.raises(DuplicateMessageError):
                await store.append("s1", messages=[user("again")], claim=other)
            assert await store.load_messages("s1") == [user("A")]
            assert await backend.query("SELECT key FROM queued") == []
            # The same message again (a queued one's save, a retried one): it is its own.
            await store.append("s1", messages=[user("B")], claim=first)
            # Keys are per session: another session's k-1 is free.
            await store.create_session("s2", profile_id="general")
            await store.enqueue("s2", "q2", _row("C"), pid=1, host=HOST, claim=other)
        async with backend.open() as again:
            assert await again.message_key("s1", "k-1") == first.reply
            assert await again.message_key("s2", "k-1") == {"seq": 9}
            assert await again.message_key("s1", "k-2") is None
            assert await again.delete_session("s1")
            assert await again.message_key("s1", "k-1") is None


async def test_a_session_keeps_its_newest_message_keys_only(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(statements, "KEYS_KEPT", 3)
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s1", profile_id="general")
            for n in range(5):
                claim = KeyClaim(f"k{n}", f"m{n}", {"seq": n})
                await store.append("s1", messages=[user(str(n))], claim=claim)
            kept = [n for n in range(5) if await store.message_key("s1", f"k{n}") is not None]
    assert kept == [2, 3, 4]


async def test_a_key_goes_in_only_with_its_message_an_append_its_fence_refuses_takes_none(
    backend: Backend,
) -> None:
    """The key is taken in the append's transaction: a replaced owner's late save of a
    message with a key stores nothing, the key neither (on PostgreSQL an append without
    a claim may be one statement, its own transaction: with a claim it may not)."""
    late = KeyClaim("k-1", "m-late", {"seq": 1})
    with trio.fail_after(TIMEOUT):
        async with backend.open() as a, backend.open() as b:
            await a.create_session("s1", profile_id="general")
            held = await a.claim_lease("s1", owner="a", pid=os.getpid(), host=HOST, ttl=-1)
            took = await b.claim_lease("s1", owner="b", pid=os.getpid(), host=HOST, ttl=60)
            assert took.owner == "b"
            with fenced(Fence("s1", "a", held.generation)), pytest.raises(LeaseLostError):
                await a.append("s1", messages=[user("late")], claim=late)
            assert await b.message_key("s1", "k-1") is None
            ours = KeyClaim("k-1", "m-b", {"seq": 2})
            with fenced(Fence("s1", "b", took.generation)):
                await b.append("s1", messages=[user("taken over")], claim=ours)
            assert await b.message_key("s1", "k-1") == {"seq": 2}
            assert await b.load_messages("s1") == [user("taken over")]
