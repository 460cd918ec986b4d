"""A message kept after a storage failure still runs exactly once, on whichever daemon.

Through real `navi serve` processes on PostgreSQL (data folders of their own, a user made
as ``navi users add`` writes one):

- a write whose commit landed but whose answer was lost (the connection cut as the
  commit came back: tests/pg_cut.py) is not done again: a turn whose answer was saved
  so is not asked for again, and a queued message whose save landed so runs (it is not
  taken for one another daemon ran);
- while a kept message waits to run again, its session stays its daemon's: a message
  sent through another daemon is handed to it and runs behind it, not before it there;
- a kept turn that another daemon ended meanwhile (its daemon paused past its lease)
  is not run again by its daemon when it comes back.

The waits are for frames, the fake LLM's requests and the cut itself. Each test under
`trio.fail_after`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client
from daemons import connect_as, lease, pg_daemons, store_user
from pg_cut import CutProxy, cut_proxy
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql

from navi_trio.core.turn.agent import DEAD_TURN
from navi_trio.testing import open_fake_llm
from navi_trio.testing.fake_llm import FakeLLMServer

pytestmark = pytest.mark.slow

TIMEOUT = 120


async def say(client: Client, sid: str, text: str) -> dict[str, Any]:
    return await client.request({"type": "message", "session_id": sid, "content": text})


async def kept(client: Client, sid: str) -> None:
    """Until the session says a message of it is kept (to run again)."""
    await client.until_type("warning", code="message_kept", session_id=sid)


def asked(llm: FakeLLMServer) -> list[str]:
    """The last user message of each chat request, in order."""
    out = []
    for request in llm.chat_requests:
        users = [m["content"] for m in request["body"]["messages"] if m["role"] == "user"]
        out.append(users[-1])
    return out


def rows(url: str, sid: str) -> list[tuple[Any, Any]]:
    """(role, content) of the session's history; an error notice as ("error", text)."""
    found = sql(url, "SELECT role, content, data::json->>'error' FROM messages"
                     " WHERE session_id = %s ORDER BY position", (sid,))  # fmt: skip
    return [("error", error) if error else (role, content) for role, content, error in found]


@asynccontextmanager
async def behind_a_cut(
    tmp_path: Path, pg_url: str, replies: list[dict[str, Any]]
) -> AsyncIterator[tuple[FakeLLMServer, CutProxy, Client]]:
    """The fake LLM playing `replies`, one daemon reaching PostgreSQL through a cut
    proxy, and a client of alice (a user written to the database) on it."""
    async with (
        open_fake_llm(replies) as llm,
        cut_proxy(pg_url) as proxy,
        pg_daemons(tmp_path, proxy.url, llm.url, 1, separate=True, forked=True) as (a,),
    ):
        token = await store_user(pg_url, "alice")
        async with connect_as(a.url, token) as client:
            yield llm, proxy, client


async def test_an_answer_whose_commit_answer_was_lost_is_not_asked_for_again(
    tmp_path: Path, pg_url: str
) -> None:
    """The save of q1's answer commits and its connection is cut before the daemon
    hears so: the store says it failed, and the message is kept to run again. Its next
    try finds the answer in the history and runs nothing: the model was asked once for
    q1, and q1 has one answer."""
    replies = [{"text": "the answer CUT"}, {"text": "answer two"}, {"text": "answer three"}]
    sid = "alice.cut"
    with trio.fail_after(TIMEOUT):
        async with behind_a_cut(tmp_path, pg_url, replies) as (llm, proxy, client):
            proxy.arm(b"the answer CUT")
            assert (await say(client, sid, "q1"))["type"] == "session"
            await proxy.cut.wait()
            await kept(client, sid)
            # q2 nudges the kept message's next try, then runs behind it.
            assert (await say(client, sid, "q2"))["type"] == "ok"
            end = await client.until(
                lambda f: f["type"] == "stream_end" and f.get("text") == "answer two"
            )
            assert end["reason"] == "complete", end
    assert rows(pg_url, sid) == [
        ("user", "q1"), ("assistant", "the answer CUT"), ("user", "q2"),
        ("assistant", "answer two"),
    ]  # fmt: skip
    assert asked(llm) == ["q1", "q2"]


async def test_a_queued_message_whose_save_landed_unheard_runs_once(
    tmp_path: Path, pg_url: str
) -> None:
    """m2 waits behind m1's turn; when its turn comes, the save that takes it off the
    queue commits and the daemon never hears so. Its next try finds it in the history
    (its row off the queue: not another daemon's doing) and runs its turn: m2 is
    stored once and answered once, before m3."""
    replies: list[dict[str, Any]] = [
        {"text": "first", "stall": True},
        {"text": "answer two"},
        {"text": "answer three"},
    ]
    sid = "alice.landed"
    with trio.fail_after(TIMEOUT):
        async with behind_a_cut(tmp_path, pg_url, replies) as (llm, proxy, client):
            assert (await say(client, sid, "m1"))["type"] == "session"
            await llm.wait_requests(1)
            proxy.arm(b"m2 CUT")
            ok = await say(client, sid, "m2 CUT")
            assert (ok["type"], ok["queued"]) == ("ok", True), ok
            assert (await client.request({"type": "stop", "session_id": sid}))["stopped"]
            await proxy.cut.wait()
            await kept(client, sid)
            assert (await say(client, sid, "m3"))["type"] == "ok"
            end = await client.until(
                lambda f: f["type"] == "stream_end" and f.get("text") == "answer three"
            )
            assert end["reason"] == "complete", end
    users = [c for role, c in rows(pg_url, sid) if role == "user"]
    answers = [c for role, c in rows(pg_url, sid) if role == "assistant"]
    assert users == ["m1", "m2 CUT", "m3"]
    assert answers[1:] == ["answer two", "answer three"], answers  # m1's stopped first
    assert asked(llm) == ["m1", "m2 CUT", "m3"]
    assert sql(pg_url, "SELECT count(*) FROM queued") == [(0,)]


# The first time the answer "answer one" is saved, the disk is full: nothing is stored.
FAIL_ONCE = """
CREATE SEQUENCE fail_once;
CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.role = 'assistant' AND NEW.content = 'answer one' THEN
        IF nextval('fail_once') = 1 THEN
            RAISE EXCEPTION 'could not extend file: No space left on device'
                USING ERRCODE = '53100';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_once BEFORE INSERT ON messages FOR EACH ROW EXECUTE FUNCTION fail_once();
"""


async def test_a_kept_turn_keeps_its_session_and_the_messages_of_other_daemons_wait(
    tmp_path: Path, pg_url: str
) -> None:
    """A's save of m1's answer fails (a full disk): m1 is kept, to run again on A. A
    message sent through B meanwhile is handed to A (``queued``), and runs there after
    m1's turn, which gets its answer: the order is the order they were acknowledged."""
    replies = [{"text": "answer one"}, {"text": "answer one"}, {"text": "answer two"}]
    sid = "alice.kept"
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 2, separate=True, forked=True) as (a, b),
        ):
            token = await store_user(pg_url, "alice")
            sql(pg_url, FAIL_ONCE)
            async with connect_as(a.url, token) as on_a, connect_as(b.url, token) as on_b:
                assert (await say(on_a, sid, "m1"))["type"] == "session"
                await kept(on_a, sid)
                ok = await say(on_b, sid, "m2")
                assert (ok["type"], ok["queued"]) == ("ok", True), ok  # handed to A
                end = await on_a.until(
                    lambda f: f["type"] == "stream_end" and f.get("text") == "answer two"
                )
                assert end["reason"] == "complete", end
    assert rows(pg_url, sid) == [
        ("user", "m1"), ("assistant", "answer one"), ("user", "m2"), ("assistant", "answer two"),
    ]  # fmt: skip
    assert asked(llm) == ["m1", "m1", "m2"]  # m1's first answer was not stored


async def test_a_kept_turn_another_daemon_ended_is_not_run_again_by_its_daemon(
    tmp_path: Path, pg_url: str
) -> None:
    """m1's answer cannot be saved on A (a full disk, once): m1 is kept. A is paused
    past its lease; B's look for dead daemons' sessions takes the session over and ends
    m1's turn (A's looks dead), and a message through B then runs there, queued behind
    nothing. When A comes back, its next try of m1 finds that turn ended: it asks
    nothing and stores nothing."""
    replies = [{"text": "answer one"}, {"text": "answer two"}, {"text": "asked again"}]
    sid = "alice.ended"
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 2, separate=True,
                       NAVI_LEASE_TTL_SEC="1.5", forked=True) as (a, b),
        ):  # fmt: skip
            token = await store_user(pg_url, "alice")
            sql(pg_url, FAIL_ONCE)
            async with connect_as(a.url, token) as on_a, connect_as(b.url, token) as on_b:
                assert (await say(on_a, sid, "m1"))["type"] == "session"
                await kept(on_a, sid)
                row = lease(pg_url, sid)
                assert row is not None and row[1] == a.pid, row  # kept: still A's
                sub = await on_b.request({"type": "subscribe", "session_id": sid})
                assert sub["type"] == "ok", sub
                os.kill(a.pid, signal.SIGSTOP)
                try:
                    # B ends m1's turn once A's lease and daemon row ran out (its scan,
                    # every half TTL). Not before m2 comes: a message that arrives while
                    # the turn is being ended waits behind that (queued). Its end is
                    # said while B still holds the lease it took: m2 goes once B's
                    # session is idle again.
                    died = await on_b.until_type("error", code="daemon_died", session_id=sid)
                    assert died["message"] == DEAD_TURN, died
                    await on_b.idle(sid)
                    ok = await say(on_b, sid, "m2")
                    assert (ok["type"], ok["queued"]) == ("ok", False), ok
                    end = await on_b.until(
                        lambda f: f["type"] == "stream_end" and f.get("text") == "answer two"
                    )
                    assert end["reason"] == "complete", end
                finally:
                    os.kill(a.pid, signal.SIGCONT)
                # A's next try (within 2 s of its first): a third message through A
                # nudges it now, and runs after it.
                assert (await say(on_a, sid, "m3"))["type"] == "ok"
                end = await on_a.until(
                    lambda f: f["type"] == "stream_end" and f.get("text") == "asked again"
                )
    assert rows(pg_url, sid) == [
        ("user", "m1"), ("error", DEAD_TURN), ("user", "m2"), ("assistant", "answer two"),
        ("user", "m3"), ("assistant", "asked again"),
    ]  # fmt: skip
    assert asked(llm) == ["m1", "m2", "m3"]
