"""The SessionStore contract on both stores: lease generations and fenced writes.

Two "daemons" are two stores opened on one SQLite file or one PostgreSQL database
(the `backend` fixture, tests/store_backends.py). Daemon A holds a session's lease and
is then replaced (its lease expired and B took it over): every write A makes inside
its fence (an append, a compression, a rewind's rewrite, a title, a load's repair) is
refused with LeaseLostError and nothing of it is stored, while B's writes
and A's unfenced reads go on. No sleeps; every test under an absolute `trio.fail_after`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable

import pytest
import trio
from pg_server import pg_url_with_schema as pg_url_with_schema
from store_backends import Backend
from store_backends import backend as backend

from navi_trio.errors import LeaseLostError, SessionBusyError, StoreError
from navi_trio.store.base import LeaseRow
from navi_trio.store.fence import Fence, fenced, takeover, unfenced

TIMEOUT = 30
HOST = socket.gethostname() or "localhost"
ME = os.getpid()


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def test_generations_go_up_at_each_takeover_and_never_back(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            first = await store.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=60)
            assert first.generation == 1
            # The same owner again: the same generation (nested holds, renewals).
            again = await store.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=60)
            assert again.generation == 1
            await store.release_lease("s-1", owner="a")
            taken = await store.claim_lease("s-1", owner="b", pid=ME, host=HOST, ttl=-1)
            assert (taken.owner, taken.generation) == ("b", 2)
            # b's lease ran out: a takes it back, one generation on (not 1 again).
            back = await store.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=60)
            assert (back.owner, back.generation) == ("a", 3)
            # A refused claim reports the holder's generation and changes nothing.
            refused = await store.claim_lease("s-1", owner="b", pid=ME, host=HOST, ttl=60)
            assert (refused.owner, refused.generation) == ("a", 3)


async def test_a_replaced_owners_fenced_writes_are_refused_and_store_nothing(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as a, backend.open() as b:
            await a.create_session("s-1", profile_id="general")
            held = await a.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=-1)
            fence_a = Fence("s-1", "a", held.generation)
            with fenced(fence_a):
                await a.append("s-1", messages=[user("one")], context=[user("one")])
            # a's lease ran out (it was paused) and b took the session over.
            took = await b.claim_lease("s-1", owner="b", pid=ME, host=HOST, ttl=60)
            assert (took.owner, took.generation) == ("b", held.generation + 1)
            with fenced(Fence("s-1", "b", took.generation)):
                await b.append("s-1", messages=[user("two")], context=[user("two")])
            with fenced(fence_a):
                writes: list[Callable[[], Awaitable[object]]] = [
                    lambda: a.append("s-1", messages=[user("late")], context=[user("late")]),
                    lambda: a.replace_context("s-1", [user("squashed")]),
                    # A rewind (keep one message, the context swapped, a kv row set).
                    lambda: a.rewrite_history(
                        "s-1",
                        keep=1,
                        messages=[user("rewound")],
                        context=[user("rewound")],
                        kv_set=[("checkpoints", "s-1", {"pruned_until": 1.0})],
                    ),  # fmt: skip
                    lambda: a.update_session("s-1", title="stale"),
                    lambda: a.load_session("s-1"),
                ]
                for write in writes:
                    with pytest.raises(LeaseLostError, match="taken over") as caught:
                        await write()
                    # A client sees session_busy; the store's callers see a StoreError.
                    assert isinstance(caught.value, SessionBusyError)
                    assert isinstance(caught.value, StoreError)
                # A fence names one session: writes to another are not checked.
                await a.create_session("s-2", profile_id="general")
                await a.append("s-2", messages=[user("elsewhere")])
            assert await b.load_messages("s-1") == [user("one"), user("two")]
            assert await b.load_context("s-1") == [user("one"), user("two")]
            assert await b.kv_get("checkpoints", "s-1") is None
            row = await b.get_session("s-1")
            assert row is not None and row.title == ""
            assert await b.load_messages("s-2") == [user("elsewhere")]
            # Released leases keep their generation: a's fence still fails after b lets go.
            await b.release_lease("s-1", owner="b")
            with fenced(fence_a), pytest.raises(LeaseLostError):
                await a.append("s-1", messages=[user("later still")])
            assert await b.load_messages("s-1") == [user("one"), user("two")]


async def test_a_fenced_append_can_renew_its_lease_in_its_own_transaction(
    backend: Backend,
) -> None:
    """`append(renew=)`: the write extends the fence's lease as a renewal would; a
    lease that is not the fence's is refused with the write and left as it was."""
    with trio.fail_after(TIMEOUT):
        async with backend.open() as a, backend.open() as b:
            await a.create_session("s-1", profile_id="general")
            held = await a.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=-1)
            fence_a = Fence("s-1", "a", held.generation)
            with fenced(fence_a):  # run out, untaken: the append renews it for 60 s
                await a.append("s-1", messages=[user("one")], context=[user("one")],
                               renew=60, durable=False)  # fmt: skip
            refused = await b.claim_lease("s-1", owner="b", pid=ME, host=HOST, ttl=60)
            assert (refused.owner, refused.generation) == ("a", held.generation)
            await a.release_lease("s-1", owner="a")
            took = await b.claim_lease("s-1", owner="b", pid=ME, host=HOST, ttl=-1)
            assert (took.owner, took.generation) == ("b", held.generation + 1)
            with fenced(fence_a), pytest.raises(LeaseLostError):
                await a.append("s-1", messages=[user("late")], context=[user("late")],
                               renew=60)  # fmt: skip
            # b's lease was not extended by a's refused write: it stays run out.
            again = await a.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=60)
            assert (again.owner, again.generation) == ("a", held.generation + 2)
            with unfenced():  # no fence: a plain append, nothing to renew
                await a.append("s-1", messages=[user("two")], context=[user("two")], renew=60)
            assert [m["content"] for m in await a.load_messages("s-1")] == ["one", "two"]
            assert [m["content"] for m in await a.load_context("s-1")] == ["one", "two"]


async def test_a_turns_start_leaves_its_lease_owing_the_end_past_a_takeover_to_the_release(
    backend: Backend,
) -> None:
    """`append(owes_end=True)`, fenced: from its commit the lease owes the session a turn's
    end (`end_owed`); a claim by its holder and a takeover by another owner keep the debt
    (the new holder says that end), a fence no longer the lease's adds none, a release
    clears it, and a plain save or one outside a fence owes nothing."""
    with trio.fail_after(TIMEOUT):
        async with backend.open() as a, backend.open() as b:
            await a.create_session("s-1", profile_id="general")
            assert not await a.end_owed("s-1")  # no lease yet
            held = await a.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=-1)
            fence_a = Fence("s-1", "a", held.generation)
            with fenced(fence_a):
                await a.append("s-1", messages=[user("zero")])
                assert not await a.end_owed("s-1")  # a save that starts no turn
                await a.append("s-1", messages=[user("one")], owes_end=True)
            assert await a.end_owed("s-1")
            await a.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=-1)  # a nested hold
            assert await b.end_owed("s-1")
            took = await b.claim_lease("s-1", owner="b", pid=ME, host=HOST, ttl=60)
            assert (took.owner, took.generation) == ("b", held.generation + 1)
            assert await b.end_owed("s-1")  # a's debt is b's now
            await b.release_lease("s-1", owner="b")
            assert not await a.end_owed("s-1")
            with fenced(fence_a), pytest.raises(LeaseLostError):
                await a.append("s-1", messages=[user("late")], owes_end=True)
            with unfenced():
                await a.append("s-1", messages=[user("two")], owes_end=True)
            assert not await a.end_owed("s-1")
            assert [m["content"] for m in await a.load_messages("s-1")] == ["zero", "one", "two"]


async def test_a_turn_started_again_with_nothing_to_append_owes_its_end(
    backend: Backend,
) -> None:
    """A turn run again on a message stored already (its first try's end sent, which paid
    that debt) appends nothing, yet starts a turn: `append(owes_end=True)` with no rows,
    fenced, marks the lease owing its end, in its own commit, and adds no row; refused
    when the fence is no longer the lease's, a no-op without a fence or without the debt."""
    with trio.fail_after(TIMEOUT):
        async with backend.open() as a, backend.open() as b:
            await a.create_session("s-1", profile_id="general")
            held = await a.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=-1)
            fence_a = Fence("s-1", "a", held.generation)
            with fenced(fence_a):
                await a.append("s-1", messages=[user("one")])  # the turn's first try's
                await a.append("s-1")  # nothing to write
                assert not await a.end_owed("s-1")
                await a.append("s-1", owes_end=True)
            assert await b.end_owed("s-1")
            with unfenced():
                await b.release_lease("s-1", owner="a")
                before = await a.get_session("s-1")
                await a.append("s-1", owes_end=True)  # no fence: no lease to owe, no write
                after = await a.get_session("s-1")
            assert not await a.end_owed("s-1")
            assert before is not None and after is not None
            assert after.updated_at == before.updated_at  # the session was not touched
            await b.claim_lease("s-1", owner="b", pid=ME, host=HOST, ttl=60)
            with fenced(fence_a), pytest.raises(LeaseLostError):
                await a.append("s-1", owes_end=True)
            assert not await b.end_owed("s-1")
            assert [m["content"] for m in await a.load_messages("s-1")] == ["one"]
            assert await a.load_context("s-1") == []


async def test_a_turns_start_that_renews_its_lease_owes_its_end_too(backend: Backend) -> None:
    """`owes_end` with `renew`: the renewal is the fence's check, and the debt is marked
    in the same transaction all the same (the two options are independent)."""
    with trio.fail_after(TIMEOUT):
        async with backend.open() as a:
            await a.create_session("s-1", profile_id="general")
            held = await a.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=60)
            with fenced(Fence("s-1", "a", held.generation)):
                await a.append("s-1", messages=[user("one")], renew=60)
                assert not await a.end_owed("s-1")
                await a.append("s-1", messages=[user("two")], renew=60, owes_end=True)
            assert await a.end_owed("s-1")


async def test_a_fence_whose_lease_expired_untaken_still_writes(backend: Backend) -> None:
    """Expiry alone takes nothing away: no other owner wrote, so nothing can collide."""
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            await store.create_session("s-1", profile_id="general")
            held = await store.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=-1)
            with fenced(Fence("s-1", "a", held.generation)):
                await store.append("s-1", messages=[user("still mine")])
            assert await store.load_messages("s-1") == [user("still mine")]


async def test_a_replaced_owners_kv_writes_are_refused_whatever_their_key(
    backend: Backend,
) -> None:
    """The run's side effects in the kv table (todo, scratchpad, memory, notes) carry its
    fence as its history does; a job of the daemon's own (`unfenced`) carries none."""
    with trio.fail_after(TIMEOUT):
        async with backend.open() as a, backend.open() as b:
            await a.create_session("s-1", profile_id="general")
            held = await a.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=-1)
            fence_a = Fence("s-1", "a", held.generation)
            with fenced(fence_a):
                await a.kv_set("scratchpad", "s-1", {"text": "while it was mine"})
            took = await b.claim_lease("s-1", owner="b", pid=ME, host=HOST, ttl=60)
            with fenced(Fence("s-1", "b", took.generation)):
                await b.kv_set("todo", "s-1", ["b's step"])
            with fenced(fence_a):
                writes: list[Callable[[], Awaitable[object]]] = [
                    lambda: a.kv_set("scratchpad", "s-1", {"text": "late"}),
                    lambda: a.kv_set("memory", "u-someone", {"items": ["late"]}),
                    lambda: a.kv_delete("todo", "s-1"),
                ]
                for write in writes:
                    with pytest.raises(LeaseLostError, match="taken over"):
                        await write()
                with unfenced():  # a background job of a's: its note still lands
                    await a.kv_set("task_notes", "s-1:1:bt-1", {"status": "completed"})
            assert await b.kv_get("scratchpad", "s-1") == {"text": "while it was mine"}
            assert await b.kv_get("memory", "u-someone") is None
            assert await b.kv_get("todo", "s-1") == ["b's step"]
            assert await b.kv_get("task_notes", "s-1:1:bt-1") == {"status": "completed"}
            # Outside any run, nothing is checked.
            await a.kv_delete("scratchpad", "s-1")
            assert await b.kv_get("scratchpad", "s-1") is None


def test_a_lease_that_expires_this_instant_is_taken_over() -> None:
    """Live means unexpired: at its `expires_at` the lease is another owner's to take (the
    cluster's `lease_state` and PostgreSQL's live-holder check count it so too)."""
    held = LeaseRow("s-1", "a", ME, HOST, 100.0, 3)
    assert takeover(held, "b", HOST, 99.5) is None
    assert takeover(held, "b", HOST, 100.0) == 4
    assert takeover(held, "a", HOST, 99.5) == 3  # its own: the same generation


async def test_an_older_generation_of_the_same_owner_is_refused(backend: Backend) -> None:
    """A daemon whose session was taken over and then taken back by itself has a new
    generation: a write of its first hold (a run paused past its lease) is refused, with
    or without a renewal in its transaction, though the owner is the same."""
    with trio.fail_after(TIMEOUT):
        async with backend.open() as a, backend.open() as b:
            await a.create_session("s-1", profile_id="general")
            first = await a.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=-1)
            await b.claim_lease("s-1", owner="b", pid=ME, host=HOST, ttl=-1)
            back = await a.claim_lease("s-1", owner="a", pid=ME, host=HOST, ttl=60)
            assert back.generation == first.generation + 2
            with fenced(Fence("s-1", "a", first.generation)):
                with pytest.raises(LeaseLostError, match="taken over"):
                    await a.append("s-1", messages=[user("stale")], context=[user("stale")])
                with pytest.raises(LeaseLostError, match="taken over"):
                    await a.append("s-1", messages=[user("stale")], renew=60)
                with pytest.raises(LeaseLostError, match="taken over"):
                    await a.kv_set("scratchpad", "s-1", {"text": "stale"})
            with fenced(Fence("s-1", "a", back.generation)):
                await a.append("s-1", messages=[user("mine")], renew=60)
            assert await a.load_messages("s-1") == [user("mine")]
            assert await a.kv_get("scratchpad", "s-1") is None
