"""A daemon that died holding a session's lease after its turn's last save: the daemon
that takes the session over says that turn's ``stream_end`` only if no other daemon had
it (docs/pages/scaling.md, "Failover"), so every client hears one end per turn, and none
for a hold that was no run (a compaction).

Real `navi serve` processes forked from the warm server, on one PostgreSQL, a fake LLM
over real HTTP. The moment of death is chosen, not waited for: a trigger holds A's write
of the lease row (its release once its frames are out, or the commit that sends its
turn's end) on an advisory lock the test holds, and ends the test's waiting connection
to say A is there; A is killed there and its connections ended, so that write never
lands. C, whose client
follows, is paused meanwhile (SIGSTOP), so B, which follows nothing, is the one that
takes the session over (as a daemon started later, or busy, would be). The lease TTL is
far above the tests' limit: B takes over because A's pid is gone. Every test under
`trio.fail_after`; every process is killed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from api_ws import Client
from daemons import connect_as, history, pg_daemons, store_user
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql
from reliability import Daemon

from navi_trio.testing import open_fake_llm
from navi_trio.testing.fake_llm import FakeLLMServer

pytestmark = pytest.mark.slow

TIMEOUT = 120
TTL = "600"  # far above TIMEOUT: nothing here may wait for a lease to run out
GATE = 0x64656164  # the advisory lock A's release waits for ("dead")
ONE, TWO = "the answer to one", "the answer to two"

# A's write of a lease row that `when` names waits for GATE, which the test holds: A dies
# there, its transaction never committed. Its arrival ends the test's waiting connection.
HOLD = """
CREATE TABLE hold_waiter (pid integer);
CREATE FUNCTION hold_a() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF position(':{pid}:' in OLD.owner) > 0 THEN
        PERFORM pg_terminate_backend(w.pid) FROM hold_waiter w;
        PERFORM pg_advisory_lock({gate});
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER hold_a BEFORE UPDATE ON leases FOR EACH ROW WHEN ({when})
    EXECUTE FUNCTION hold_a();
"""
RELEASE = "NEW.expires_at = 0 AND OLD.expires_at <> 0"  # A lets the lease go
END_SENT = "OLD.end_owed AND NOT NEW.end_owed"  # A's commit that sends its turn's end


@contextmanager
def a_held(url: str, a: Daemon, when: str) -> Iterator[Callable[[], Awaitable[None]]]:
    """A's writes of `when` wait, for as long as the block lasts; what it gives waits
    until A is there."""
    with (
        psycopg.connect(url, autocommit=True) as lock,
        psycopg.connect(url, autocommit=True) as waiter,
    ):
        lock.execute("SELECT pg_advisory_lock(%s)", [GATE])
        sql(url, HOLD.format(pid=a.pid, gate=GATE, when=when))
        sql(url, "INSERT INTO hold_waiter VALUES (%s)", (waiter.info.backend_pid,))

        def wait() -> None:
            try:
                waiter.execute("SELECT pg_sleep(%s)", [TIMEOUT])
            except psycopg.OperationalError:
                return  # ended by A's arrival
            raise AssertionError("A never came to the hold")

        async def arrived() -> None:
            await trio.to_thread.run_sync(wait, abandon_on_cancel=True)

        yield arrived


async def b_takes_over(url: str, llm: FakeLLMServer, a: Daemon, c: Daemon, requests: int) -> None:
    """A dies (held: the lease stays A's) while C is paused; B takes the
    session over and runs the message waiting there (the model's `requests`th request)."""
    os.kill(c.pid, signal.SIGSTOP)
    try:
        os.kill(a.pid, signal.SIGKILL)
        # Its connections end with it: what they hold never commits.
        sql(url, "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                 " WHERE application_name IN (%s, %s)",
            (f"navi {a.pid}", f"navi bus {a.pid}"))  # fmt: skip
        await llm.wait_requests(requests)
    finally:
        os.kill(c.pid, signal.SIGCONT)


@asynccontextmanager
async def three_daemons(
    tmp_path: Path, pg_url: str
) -> AsyncIterator[tuple[FakeLLMServer, Daemon, Daemon, Client, Client]]:
    """A, B and C on one database, the model answering "one" then "two": (the model, A,
    C, a client of alice's on A, one on C). B has no client: it follows nothing."""
    async with (
        open_fake_llm([{"text": ONE}, {"text": TWO}]) as llm,
        pg_daemons(tmp_path, pg_url, llm.url, 3, NAVI_LEASE_TTL_SEC=TTL, forked=True) as (
            a,
            _,
            c,
        ),
    ):
        token = await store_user(pg_url, "alice")
        async with connect_as(a.url, token) as on_a, connect_as(c.url, token) as on_c:
            yield llm, a, c, on_a, on_c


async def two_behind_one(llm: FakeLLMServer, on_a: Client, on_c: Client) -> tuple[str, trio.Event]:
    """A runs "one", its answer held half-way (until the event is set); C's client
    follows the session and queued "two" behind it (handed to A): (the session, the
    event)."""
    answer = llm.hold_after(1, reply=0)
    sid = (await on_a.request({"type": "message", "content": "one"}))["session_id"]
    await llm.wait_held(1)
    assert (await on_c.request({"type": "subscribe", "session_id": sid}))["type"] == "ok"
    ok = await on_c.request({"type": "message", "session_id": sid, "content": "two"})
    assert (ok["type"], ok["queued"]) == ("ok", True), ok  # handed to A
    queued = await on_c.until_type("message_queued", session_id=sid, text="two")
    assert queued["position"] == 1, queued  # behind A's run of "one"
    return sid, answer


async def ends_until(client: Client, sid: str, last: str) -> list[str]:
    """The texts of the session's turn ends the client gets, up to the one saying `last`."""
    ends: list[str] = []
    while not ends or ends[-1] != last:
        ends.append((await client.until_end(sid))["text"])
    return ends


def turns(url: str, sid: str) -> list[tuple[Any, ...]]:
    return [r for r in history(url, sid) if r[0] in ("user", "assistant")]


async def test_a_turns_end_heard_before_its_daemon_died_is_not_said_again_elsewhere(
    tmp_path: Path, pg_url: str
) -> None:
    """A runs "one"; C's client follows it and queued "two" behind it. A's end of "one"
    reaches C, then A dies before its release. B, which did not follow the session, takes
    it over: it says no second end of "one" (the end went out, and its commit cleared
    the lease's debt), and runs "two". C's client, counting the runs before its own,
    gets one end per turn (before, B said "one"'s end again, after a resync: a `navi
    run` waiting on C for "two" took it for its own run's end)."""
    with trio.fail_after(TIMEOUT):
        async with three_daemons(tmp_path, pg_url) as (llm, a, c, on_a, on_c):
            sid, answer = await two_behind_one(llm, on_a, on_c)
            with a_held(pg_url, a, RELEASE):
                answer.set()
                assert (await on_c.until_end(sid))["text"] == ONE  # A's end reached C
                await b_takes_over(pg_url, llm, a, c, 2)
                assert await ends_until(on_c, sid, TWO) == [TWO]
        assert turns(pg_url, sid) == [
            ("user", "one"), ("assistant", ONE), ("user", "two"), ("assistant", TWO)
        ]  # fmt: skip


async def test_a_compaction_whose_daemon_died_holding_the_lease_ends_no_turn(
    tmp_path: Path, pg_url: str
) -> None:
    """A compacts the session (nothing to compact: its hold says so); C's client follows
    and queued "two" behind the compaction, which is no run (position 0). A dies before
    its release; B, which did not follow, takes the session over: it says no turn's end
    (the compaction owed none; the last turn's end went out with it), and runs "two".
    C's client gets "two"'s end as the first (before, B said "one"'s end there: a `navi
    run` waiting on C for "two" took it for its own run's end)."""
    with trio.fail_after(TIMEOUT):
        async with three_daemons(tmp_path, pg_url) as (llm, a, c, on_a, on_c):
            sid = (await on_a.request({"type": "message", "content": "one"}))["session_id"]
            assert (await on_a.until_end(sid))["text"] == ONE
            await on_a.idle(sid)  # its lease released
            assert (await on_c.request({"type": "subscribe", "session_id": sid}))["type"] == "ok"
            with a_held(pg_url, a, RELEASE):
                assert (await on_a.request({"type": "compact", "session_id": sid}))["type"] == "ok"
                said = await on_c.until_type("error", session_id=sid)
                assert said["code"] == "nothing_to_compact", said  # said under A's hold
                ok = await on_c.request({"type": "message", "session_id": sid, "content": "two"})
                assert (ok["type"], ok["queued"]) == ("ok", True), ok  # handed to A
                queued = await on_c.until_type("message_queued", session_id=sid, text="two")
                assert queued["position"] == 0, queued  # a compaction is no run
                await b_takes_over(pg_url, llm, a, c, 2)
                assert await ends_until(on_c, sid, TWO) == [TWO]
        assert turns(pg_url, sid) == [
            ("user", "one"), ("assistant", ONE), ("user", "two"), ("assistant", TWO)
        ]  # fmt: skip


async def test_a_turns_end_its_daemon_died_before_sending_is_said_once_by_the_next(
    tmp_path: Path, pg_url: str
) -> None:
    """A runs "one" and saves its answer; the commit that would send its end to C (and
    clear the lease's debt) is held, and A dies there. B takes the session over: the
    lease still owes the end, so B says it, as saved, and runs "two". C's client gets
    each end once (the case the stop before this one fixed: without the debt, C's
    client would wait for "one"'s end for ever)."""
    with trio.fail_after(TIMEOUT):
        async with three_daemons(tmp_path, pg_url) as (llm, a, c, on_a, on_c):
            sid, answer = await two_behind_one(llm, on_a, on_c)
            with a_held(pg_url, a, END_SENT) as arrived:
                answer.set()
                await arrived()  # A's end is on its way, uncommitted
                await b_takes_over(pg_url, llm, a, c, 2)
                assert await ends_until(on_c, sid, TWO) == [ONE, TWO]
        assert turns(pg_url, sid) == [
            ("user", "one"), ("assistant", ONE), ("user", "two"), ("assistant", TWO)
        ]  # fmt: skip
