"""A session's queued messages keep their order when the store's queue cannot be read.

The run holding the lease reads the store's queue before its turn, so that rows queued
before its message run first (a message another daemon handed over, one a paused daemon
left). When that read fails (the database cut the connection of a daemon paused in the
middle of it), the run must not go ahead as if nothing were queued: a client's second
acknowledged message would be stored before its first. A new message then waits in the
queue behind them; an acknowledged one keeps its place and tries again.

A real store (SQLite; PostgreSQL too where no read fails) and the fake LLM over HTTP;
the failed read is injected once.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from test_queue_durable import HOST, _row, _users

from navi_trio.core.session.queued import from_row
from navi_trio.core.turn import UserMessage
from navi_trio.errors import StorageError
from navi_trio.store.base import HANDED_HOST, HANDED_PID
from navi_trio.testing import open_harness
from navi_trio.testing.harness import Harness, SessionDriver

pytestmark = pytest.mark.slow  # as test_queue_durable: a harness per test

TIMEOUT = 30
REPLIES = [{"text": "first done"}, {"text": "second done"}, {"text": "third done"}]


@asynccontextmanager
async def _next_read_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Harness, SessionDriver]]:
    """A harness whose actors take in the store's queue (as a daemon's do), session s1
    with two rows handed over in its queue ("first", "second"); the next read of the
    queue fails, as one whose connection the database cut does."""
    no_plan = {"general": {"planning_first_message": False}}
    async with open_harness(tmp_path, replies=REPLIES, profiles=no_plan) as h:
        h.runtime.sessions.adopt = True
        s = await h.session("s1")
        store = s.actor.queue.store
        await store.create_session("s1", profile_id="general")
        for key, text in (("h-1", "first"), ("h-2", "second")):
            await store.enqueue("s1", key, _row(text), pid=HANDED_PID, host=HANDED_HOST)
        real: Callable[..., Awaitable[Any]] = store.adopt_queued
        failed = False

        async def adopt_queued(session_id: str, *, pid: int, host: str) -> Any:
            nonlocal failed
            if not failed:
                failed = True
                raise StorageError("adopt queued messages: cannot reach the database")
            return await real(session_id, pid=pid, host=host)

        monkeypatch.setattr(store, "adopt_queued", adopt_queued)
        yield h, s


async def test_a_new_message_waits_behind_the_rows_queued_before_it_when_they_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new message runs while the queue cannot be read: it is queued (and acknowledged)
    behind the rows handed over before it, which run first, in order."""
    with trio.fail_after(TIMEOUT):
        async with _next_read_fails(tmp_path, monkeypatch) as (h, s):
            third = UserMessage("third")
            s.actor.send_message(third)
            await s.actor.idle.wait()
            assert third.accepted.error is None, third.accepted.error
            assert await _users(h.runtime.store) == ["first", "second", "third"]
            assert await h.runtime.store.queued_sessions() == []


async def test_an_acknowledged_message_keeps_its_place_when_the_rows_before_it_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second of two acknowledged rows is taken in here alone (the first was still
    another daemon's): its run cannot read the queue, so it keeps its place and tries
    again (at once when a message arrives), and the first runs before it."""
    with trio.fail_after(TIMEOUT):
        async with _next_read_fails(tmp_path, monkeypatch) as (h, s):
            s.actor.send_message(from_row("h-2", _row("second")))
            # It keeps its place (said), instead of running ahead of the first.
            kept = (await s.until(_kept_or_ran))[-1]
            assert kept.get("code") == "message_kept", kept
            s.actor.send_message(UserMessage("third"))  # it tries again now
            await s.actor.idle.wait()
            assert await _users(h.runtime.store) == ["first", "second", "third"]
            assert await h.runtime.store.queued_sessions() == []


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_a_message_kept_for_a_taken_session_tries_again_behind_the_rows_before_it(
    tmp_path: Path, request: pytest.FixtureRequest, engine: str
) -> None:
    """An acknowledged message held here finds the session run by another process, which
    nobody can hand it to (it let the session go meanwhile): it keeps its place and tries
    again; by then a row queued before it (another live daemon's) is there to take in, and
    runs first. (The cluster: a paused owner came back, the message's daemon could not
    leave it to anyone, and its client's earlier message was still queued.)"""
    no_plan = {"general": {"planning_first_message": False}}
    db = {"db_url": request.getfixturevalue("pg_url")} if engine == "postgres" else {}
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=REPLIES, profiles=no_plan, **db) as h:
            h.runtime.sessions.adopt = True
            s = await h.session("s1")
            store = h.runtime.store
            await store.create_session("s1", profile_id="general")
            await store.claim_lease("s1", owner="another-process", pid=os.getpid(), host=HOST,
                                    ttl=300)  # fmt: skip
            # "first" is a live process's (pid 1 never ends), "second" was handed here.
            await store.enqueue("s1", "q-1", _row("first"), pid=1, host=HOST)
            await store.enqueue("s1", "h-2", _row("second"), pid=HANDED_PID, host=HANDED_HOST)
            s.actor.send_message(from_row("h-2", _row("second")))
            kept = (await s.until(_kept_or_ran))[-1]
            assert kept.get("code") == "message_kept", kept
            await store.release_lease("s1", owner="another-process")
            s.actor.send_message(UserMessage("third"))  # it tries again now
            await s.actor.idle.wait()
            assert await _users(store) == ["first", "second", "third"]
            assert await store.queued_sessions() == []


def _kept_or_ran(frame: dict[str, Any]) -> bool:
    """A warning (the message kept), or the end of a turn that ran."""
    ran: bool = frame["type"] == "stream_end" and frame["reason"] != "error"
    return ran or frame["type"] == "warning"
