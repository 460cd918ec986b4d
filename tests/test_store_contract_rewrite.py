"""The SessionStore contract of `rewrite_history` (a rewind, a branch brought back), on
both stores: it keeps the first messages, appends others, swaps the context and writes the
kv rows that keep what was cut, in one transaction; what it refuses changes nothing.

Every test runs twice through the `backend` fixture (tests/store_backends.py): a real
SQLite file and a fresh PostgreSQL database (skipped, saying why, where none can start).
No sleeps; every test under an absolute `trio.fail_after`.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from builders import user
from pg_server import pg_url_with_schema as pg_url_with_schema
from store_backends import Backend

from navi_trio.errors import StoreError

TIMEOUT = 20


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


async def test_a_rewrite_keeps_the_head_appends_swaps_the_context_and_writes_kv(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p")).id
            history = [user("a"), answer("A"), user("b"), answer("B"), user("c"), answer("C")]
            await store.append(sid, messages=history, context=history)
            await store.kv_set("branches", f"{sid}:old", {"n": 1})
            tail = [user("x"), answer("X")]
            await store.rewrite_history(
                sid,
                keep=2,
                messages=tail,
                context=[*history[:2], *tail],
                kv_set=[("branches", f"{sid}:b1", {"messages": history[2:]})],
                kv_delete=[("branches", f"{sid}:old")],
            )
            assert await store.load_messages(sid) == [*history[:2], *tail]
            assert await store.load_context(sid) == [*history[:2], *tail]
            assert await store.kv_list("branches", f"{sid}:") == [
                (f"{sid}:b1", {"messages": history[2:]})
            ]
            # Appends go on after the rewritten tail, and a reopened store sees the same.
            await store.append(sid, messages=[user("y")], context=[user("y")])
        async with backend.open() as store:
            assert await store.load_messages(sid) == [*history[:2], *tail, user("y")]
            assert (await store.load_session(sid)) is not None
            # keep=0 with nothing appended: an empty history and context.
            await store.rewrite_history(sid, keep=0, context=[])
            assert await store.load_messages(sid) == []
            assert await store.load_context(sid) == []
            # Deleting the session deletes the kv rows keyed by it, branches included.
            await store.delete_session(sid)
            assert await store.kv_list("branches", f"{sid}:") == []


async def test_a_rewrite_past_the_history_or_of_no_session_is_refused_and_changes_nothing(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p")).id
            history = [user("a"), answer("A")]
            await store.append(sid, messages=history, context=history)
            with pytest.raises(StoreError, match="has 2 messages, not 3 to keep"):
                await store.rewrite_history(
                    sid, keep=3, context=[], kv_set=[("branches", f"{sid}:b", 1)]
                )
            for keep in (-1, True, "1"):
                with pytest.raises(StoreError, match="keep must be a whole number"):
                    await store.rewrite_history(sid, keep=keep, context=[])  # type: ignore[arg-type]
            with pytest.raises(StoreError, match="not JSON-serialisable"):
                await store.rewrite_history(
                    sid, keep=1, context=[], kv_set=[("branches", f"{sid}:b", {1, 2})]
                )
            with pytest.raises(StoreError, match="no session 'ghost'"):
                await store.rewrite_history("ghost", keep=0, context=[])
            assert await store.load_messages(sid) == history
            assert await store.load_context(sid) == history
            assert await store.kv_list("branches", f"{sid}:") == []


async def test_a_rewrite_that_fails_midway_stores_nothing_of_it(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p")).id
            history = [user("a"), answer("A"), user("b"), answer("B")]
            await store.append(sid, messages=history, context=history)
            # The context's insert comes after the messages were cut and the tail added.
            await backend.fail_inserts("context", "context is frozen")
            with pytest.raises(StoreError, match="rewrite history.*context is frozen"):
                await store.rewrite_history(
                    sid,
                    keep=2,
                    messages=[user("x")],
                    context=[user("x")],
                    kv_set=[("branches", f"{sid}:b1", {"cut": 2})],
                )
            await backend.allow_inserts("context")
            assert await store.load_messages(sid) == history
            assert await store.load_context(sid) == history
            assert await store.kv_list("branches", f"{sid}:") == []
