"""The SessionStore contract for history pages (`load_messages_page`), on both stores.

A page is the display messages after a position, oldest first: at most `limit` of them
and at most `max_bytes` of stored JSON in all, except that a page always holds its first
message, however big; `next_after` chains the pages to the end (None on the last).
Following the chain gives exactly `load_messages`, placeholders that repair inserted
between two rows included.

Rules: as tests/test_store_contract.py (both stores through `backend`; no sleeps; an
absolute `trio.fail_after` on every test).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from builders import assistant, call, result, user
from pg_server import pg_url_with_schema as pg_url_with_schema
from store_backends import Backend

from navi_trio.errors import StoreError
from navi_trio.store.base import HistoryPage
from navi_trio.store.methods import SessionStore

TIMEOUT = 20


def _stored(message: dict[str, Any]) -> int:
    """The size of a message as the store keeps it (ASCII JSON, store/_input.py)."""
    return len(json.dumps(message, ensure_ascii=True, separators=(",", ":")))


async def _pages(store: SessionStore, sid: str, limit: int, max_bytes: int) -> list[HistoryPage]:
    pages = [await store.load_messages_page(sid, limit=limit, max_bytes=max_bytes)]
    while pages[-1].next_after is not None:
        after = pages[-1].next_after
        pages.append(
            await store.load_messages_page(sid, after=after, limit=limit, max_bytes=max_bytes)
        )
        assert len(pages) < 50, "the pages do not come to an end"
    return pages


async def test_pages_hold_at_most_limit_and_max_bytes_and_a_big_message_alone(
    backend: Backend,
) -> None:
    small = [user(f"m{i}") for i in range(8)]
    history = [*small[:2], user("b" * 3000), *small[3:6], assistant(text="c" * 5000), small[7]]
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p")).id
            await store.append(sid, messages=history)
            pages = await _pages(store, sid, limit=3, max_bytes=1000)
            assert (
                [p.messages for p in pages]
                == [
                    history[0:2],  # the big one next would pass 1000 bytes
                    history[2:3],  # bigger than a page: alone
                    history[3:6],  # three: the limit
                    history[6:7],
                    history[7:8],
                ]
            )
            assert [p.next_after is None for p in pages] == [False] * 4 + [True]
            for page in pages:
                if len(page.messages) > 1:
                    assert sum(_stored(m) for m in page.messages) <= 1000
            one = await store.load_messages_page(sid, limit=1000, max_bytes=1 << 20)
            assert one == HistoryPage(messages=history, next_after=None)


async def test_pages_chain_through_repaired_placeholders_to_exactly_the_history(
    backend: Backend,
) -> None:
    history = [user("go"), assistant(call("c1"), call("c2", "grep")), result("c1"),
               user("and?"), assistant(text="done")]  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p")).id
            await store.append(sid, messages=history)
            loaded = await store.load_session(sid)  # a placeholder between two rows
            assert loaded is not None and loaded.repaired == 1
            await store.append(sid, messages=[user("later")])
            whole = await store.load_messages(sid)
            assert len(whole) == 7
            for limit in (1, 2, 3):
                pages = await _pages(store, sid, limit=limit, max_bytes=1 << 20)
                assert [m for p in pages for m in p.messages] == whole
                assert all(len(p.messages) == limit for p in pages[:-1])


async def test_a_page_of_an_empty_or_missing_session_and_bad_bounds(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p")).id
            empty = await store.load_messages_page(sid, limit=10, max_bytes=100)
            assert empty == HistoryPage(messages=[], next_after=None)
            await store.append(sid, messages=[user("one")])
            page = await store.load_messages_page(sid, limit=10, max_bytes=100)
            assert page == HistoryPage(messages=[user("one")], next_after=None)
            assert page.next_after is None
            last = await store.load_messages_page(sid, after=1e9, limit=10, max_bytes=100)
            assert last == HistoryPage(messages=[], next_after=None)
            with pytest.raises(StoreError, match="no session 'nope'"):
                await store.load_messages_page("nope", limit=10, max_bytes=100)
            with pytest.raises(StoreError, match="limit must be a whole number of 1 or more"):
                await store.load_messages_page(sid, limit=0, max_bytes=100)
            with pytest.raises(StoreError, match="max_bytes must be a whole number"):
                await store.load_messages_page(sid, limit=1, max_bytes=-1)
