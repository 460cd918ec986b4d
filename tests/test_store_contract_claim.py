"""The SessionStore contract on both stores: taking a queued message is a claim, and the
queue's cap is the store's.

- `append(dequeue=key)` is a compare and set: of two daemons holding one queued message
  (a hand-over read twice, a row adopted while its first owner still had it), one
  appends it and the other gets `NotQueuedError`, with nothing stored;
- `enqueue(keep=N)` keeps the session's newest N rows, whichever daemon queued them,
  and returns the ones it dropped;
- `release_queued` hands a process's rows to whoever runs the session next;
- `renew_lease(generation=G)` renews only the lease of that generation.

Every test runs on a real SQLite file and on a fresh PostgreSQL database (the `backend`
fixture, tests/store_backends.py); "two daemons" are two stores on one database. No
sleeps; every test under an absolute `trio.fail_after`.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
import trio
from builders import user
from pg_server import pg_url_with_schema as pg_url_with_schema
from store_backends import Backend

from navi_trio.errors import NotQueuedError, StoreError
from navi_trio.store.methods import SessionStore

TIMEOUT = 30
HOST = socket.gethostname() or "localhost"
ME = os.getpid()


def _row(text: str) -> dict[str, Any]:
    return {"text": text, "user_id": "local", "user_role": "user"}


async def _queued(backend: Backend) -> list[tuple[Any, ...]]:
    return await backend.query("SELECT session_id, key FROM queued ORDER BY id")


async def test_a_queued_message_is_appended_once_whichever_daemon_takes_it(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as a, backend.open() as b:
            for sid in ("s1", "s2"):
                await a.create_session(sid, profile_id="general")
            await a.enqueue("s1", "k1", _row("one"), pid=ME, host=HOST)
            await a.append("s1", messages=[user("one")], context=[user("one")], dequeue="k1")
            # The other daemon held it too: its append finds the row gone, stores nothing.
            with pytest.raises(NotQueuedError, match="no longer in the queue"):
                await b.append("s1", messages=[user("one")], context=[user("one")], dequeue="k1")
            assert await b.load_messages("s1") == [user("one")]
            assert await b.load_context("s1") == [user("one")]
            # A key is taken from its own session only.
            await a.enqueue("s2", "k2", _row("two"), pid=ME, host=HOST)
            with pytest.raises(NotQueuedError):
                await a.append("s1", messages=[user("two")], dequeue="k2")
            assert await _queued(backend) == [("s2", "k2")]
            assert await a.load_messages("s1") == [user("one")]


async def test_two_daemons_racing_for_the_same_queued_messages_append_each_once(
    backend: Backend,
) -> None:
    keys = [f"k{n}" for n in range(12)]
    won: list[tuple[str, str]] = []

    async def take_all(store: SessionStore, name: str) -> None:
        for key in keys:
            try:
                await store.append("s1", messages=[user(key)], dequeue=key)
            except NotQueuedError:
                continue
            won.append((name, key))

    with trio.fail_after(TIMEOUT):
        async with backend.open() as a, backend.open() as b:
            await a.create_session("s1", profile_id="general")
            for key in keys:
                await a.enqueue("s1", key, _row(key), pid=ME, host=HOST)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(take_all, a, "a")
                nursery.start_soon(take_all, b, "b")
            got = [m["content"] for m in await a.load_messages("s1")]
    assert sorted(got) == sorted(keys) and len(got) == len(keys), got
    assert sorted(k for _, k in won) == sorted(keys)
    assert got == keys  # each daemon took them in order: so did the history


async def test_the_queue_cap_keeps_the_newest_rows_whoever_queued_them(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as a, backend.open() as b:
            await a.create_session("s1", profile_id="general")
            await a.create_session("s2", profile_id="general")
            assert await a.enqueue("s1", "k1", _row("one"), pid=ME, host=HOST, keep=2) == []
            assert await b.enqueue("s1", "k2", _row("two"), pid=0, host="*", keep=2) == []
            await a.enqueue("s2", "other", _row("other session"), pid=ME, host=HOST, keep=2)
            # A third row: the oldest goes, whichever daemon queued it, and is named.
            dropped = await b.enqueue("s1", "k3", _row("three"), pid=0, host="*", keep=2)
            assert dropped == [("k1", _row("one"))]
            # Rows queued without a cap (a wake-up, a schedule) count at the next one.
            await a.enqueue("s1", "k4", _row("four"), pid=ME, host=HOST)
            dropped = await a.enqueue("s1", "k5", _row("five"), pid=ME, host=HOST, keep=2)
            assert dropped == [("k2", _row("two")), ("k3", _row("three"))]
            assert await _queued(backend) == [("s2", "other"), ("s1", "k4"), ("s1", "k5")]
            for bad in (0, -1, 1.5, True):
                with pytest.raises(StoreError, match="cap"):
                    await a.enqueue("s1", f"bad-{bad}", _row("x"), pid=ME, host=HOST, keep=bad)  # type: ignore[arg-type]
            assert len(await _queued(backend)) == 3


async def test_two_daemons_queueing_at_once_stay_under_the_cap_and_lose_nothing_silently(
    backend: Backend,
) -> None:
    dropped: list[str] = []

    async def queue(store: SessionStore, name: str) -> None:
        for n in range(8):
            gone = await store.enqueue("s1", f"{name}{n}", _row(f"{name}{n}"), pid=ME,
                                       host=HOST, keep=3)  # fmt: skip
            dropped.extend(k for k, _ in gone)

    with trio.fail_after(TIMEOUT):
        async with backend.open() as a, backend.open() as b:
            await a.create_session("s1", profile_id="general")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(queue, a, "a")
                nursery.start_soon(queue, b, "b")
            left = [k for _, k in await _queued(backend)]
    assert len(left) == 3, left
    assert sorted(left + dropped) == sorted(
        [f"a{n}" for n in range(8)] + [f"b{n}" for n in range(8)]
    )


async def test_released_rows_go_to_whoever_runs_the_session_next(backend: Backend) -> None:
    alive = os.getppid()  # another live process: its rows are its own to run
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s1", profile_id="general")
            await store.enqueue("s1", "a", _row("first"), pid=alive, host=HOST)
            await store.enqueue("s1", "b", _row("second"), pid=alive, host=HOST)
            await store.enqueue("s1", "c", _row("not theirs"), pid=ME, host=HOST)
            assert await store.adopt_queued("s1", pid=ME + 1_000_000, host=HOST) == []
            # The live process found its session taken over: it hands its rows on.
            released = await store.release_queued("s1", ["a", "b", "c"], pid=alive, host=HOST)
            assert released == 2  # "c" is not its row
            got = await store.adopt_queued("s1", pid=ME + 1_000_000, host=HOST)
            assert [k for k, _ in got] == ["a", "b"]
            # Adopted: the adopter's now; releasing them as the old owner does nothing.
            assert await store.release_queued("s1", ["a"], pid=alive, host=HOST) == 0
            with pytest.raises(StoreError, match="invalid session id"):
                await store.release_queued("../s", ["a"], pid=alive, host=HOST)


async def test_a_renewal_names_the_generation_it_holds(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            first = await store.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=-1)
            assert await store.renew_lease("s-1", owner="a", ttl=-1, generation=first.generation)
            # b takes it over, lets it go, and a takes it back: same owner, newer generation.
            await store.claim_lease("s-1", owner="b", pid=ME, host=HOST, ttl=-1)
            back = await store.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=60)
            assert back.generation == first.generation + 2
            # The first hold's renewal fails; the new one's, and one naming none, succeed.
            stale = await store.renew_lease("s-1", owner="a", ttl=60, generation=first.generation)
            assert stale is False
            assert await store.renew_lease("s-1", owner="a", ttl=60, generation=back.generation)
            assert await store.renew_lease("s-1", owner="a", ttl=60)


async def test_the_holder_of_the_lease_adopts_every_queued_row_in_order(backend: Backend) -> None:
    """Whoever holds the session's lease runs its queue: a new message it is about to run
    goes behind every row queued before it, whoever queued them."""
    alive = os.getppid()
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s1", profile_id="general")
            await store.enqueue("s1", "a", _row("live one's"), pid=alive, host=HOST)
            await store.enqueue("s1", "b", _row("far one's"), pid=alive, host="another-host")
            await store.enqueue("s1", "c", _row("handed"), pid=0, host="*")
            # Not holding the lease: only what nobody else runs.
            assert [k for k, _ in await store.adopt_queued("s1", pid=ME, host=HOST)] == ["c"]
            await store.claim_lease("s1", owner="me", pid=ME, host=HOST, ttl=60)
            got = await store.adopt_queued("s1", pid=ME, host=HOST)
            assert [k for k, _ in got] == ["a", "b", "c"]
            # Another process holding it adopts nothing (the rows are ours now anyway).
            assert await store.adopt_queued("s1", pid=alive, host=HOST) == []


async def test_an_expired_lease_runs_no_queue_but_what_nobody_else_runs(
    backend: Backend,
) -> None:
    """Its holder runs the whole queue only while the lease is live: once it expired, the
    rows of a live process stay that process's."""
    alive = os.getppid()
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s1", profile_id="general")
            await store.enqueue("s1", "a", _row("live one's"), pid=alive, host=HOST)
            await store.enqueue("s1", "b", _row("handed"), pid=0, host="*")
            await store.claim_lease("s1", owner="me", pid=ME, host=HOST, ttl=-1)
            assert [k for k, _ in await store.adopt_queued("s1", pid=ME, host=HOST)] == ["b"]
