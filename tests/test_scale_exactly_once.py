"""An ``ok`` means the message is stored and runs exactly once, on whichever daemon:
real `navi serve` processes on one PostgreSQL, each with a data folder of its own (as
machines have), clients connected as a user written to the database as ``navi users add``
writes one.

- Sends interleaved by hypothesis over two and over three daemons (the two clusters at
  once, each on a database of its own), several clients on each:
  every acknowledged message is in the history once, was sent to the model once (or,
  paused between its save and its model call, had its turn ended by the daemon that
  took the session over, as a dead turn is), and
  each client's messages are in the order it sent them; a refused one is nowhere. What
  the plans vary is which client sends when, what the test waits for in between
  (nothing, the reply, the runs to start), and whether the daemon running the session
  is paused past its lease meanwhile (SIGSTOP, its lease and its row expired in the
  database rather than waited out: `run_out`) while a message through another daemon
  takes it over: the checks hold whatever the timing. Its own clock has not run out, so
  what it does on resuming is stopped by the database's fence alone (test_scale_fencing.py
  pauses a daemon for a whole TTL, for what it publishes and calls after a takeover).
- A daemon that finds its session taken by another one leaves its acknowledged queued
  messages to that daemon, which runs them: none is dropped.

The waits are for frames, replies and the fake LLM's requests; the one wait for time is
for a lease to run out (by the database's clock), in the test of a paused daemon's
queue. Every test under `trio.fail_after`; every process is killed on the way out.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.lowlevel
from api_ws import Client
from daemons import connect_as, history, lease, pg_daemons, run_out, store_user
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql
from reliability import Daemon
from test_scale_fencing import end_of, wait_lease_expired

from navi_trio.core.turn.agent import DEAD_TURN
from navi_trio.testing import open_fake_llm
from navi_trio.testing.fake_llm import FakeLLMServer
from navi_trio.testing.postgres import PgServer

pytestmark = pytest.mark.slow

TIMEOUT = 300
EXAMPLES = 25  # plans per topology (each a fresh session)
CLIENTS_PER_DAEMON = 2
# A run lasts a little (its model waits 20 ms before answering): sends overlap runs.
REPLY = {"text": "ok", "delay_first": 0.02}
BARRIERS = ("none", "none", "reply", "runs", "pause")
TTL = "1.5"  # NAVI_LEASE_TTL_SEC: renewed every third of it, the peers sweep every half
# Bounds that only a lost message reaches (each run takes ~30 ms): the checks then
# name what is missing, instead of the test hanging.
RUNS_LIMIT = 30.0
EXAMPLE_LIMIT = 90.0


@attrs.define(eq=False)
class Sender:
    """One client connection, sending one message at a time (it waits for each reply)."""

    client: Client
    name: str
    daemon: Daemon
    sent: list[str] = attrs.field(factory=list)
    acked: list[str] = attrs.field(factory=list)
    refused: list[str] = attrs.field(factory=list)
    pauses: int = 0  # times its daemon was paused past its lease (`pause_the_owner`)
    # Taken by a send until its reply comes (released by the task that sends, so a
    # semaphore: a lock belongs to the task that took it).
    lock: trio.Semaphore = attrs.field(factory=lambda: trio.Semaphore(1))

    async def start(self, nursery: trio.Nursery, sid: str, text: str) -> None:
        """Send `text` once the reply to the last message came (in the background)."""
        await self.lock.acquire()
        nursery.start_soon(self._send_held, sid, text)

    async def send(self, sid: str, text: str) -> None:
        await self.lock.acquire()
        await self._send_held(sid, text)

    async def _send_held(self, sid: str, text: str) -> None:
        pauses = self.pauses
        try:
            self.sent.append(text)
            reply = await self.client.request(
                {"type": "message", "session_id": sid, "content": text}
            )
        finally:
            self.lock.release()
        if reply["type"] == "ok":
            self.acked.append(text)
        else:
            # Busy, or, to a daemon paused while it handled the message, the database
            # gone from under it: the server ended the paused transaction (its idle
            # timeout), and the daemon answers what it could not do.
            lost = reply.get("code") == "storage" and self.pauses != pauses
            assert reply["type"] == "error" and (reply["code"] == "session_busy" or lost), reply
            self.refused.append(text)

    async def idle(self) -> None:
        async with self.lock:
            pass


@attrs.define
class Tally:
    examples: int = 0
    acked: int = 0
    refused: int = 0
    sends: int = 0
    pauses: int = 0
    taken: int = 0  # pauses in which the session was taken over from the paused daemon
    ended: int = 0  # acked messages never asked: their turn ended by the takeover


def ended_by_takeover(db: str, sid: str) -> set[str]:
    """The user messages of `sid` whose turn the next owner ended as dead before any
    word of it was saved: the dead-turn row (agent.py DEAD_TURN) right after them."""
    rows = sql(db, "SELECT role, content, data FROM messages WHERE session_id = %s"
                   " ORDER BY position", (sid,))  # fmt: skip
    ended: set[str] = set()
    for (role, content, _), (next_role, _, data) in itertools.pairwise(rows):
        if role == "user" and next_role == "assistant" and DEAD_TURN in str(data):
            ended.add(str(content))
    return ended


async def pause_the_owner(
    db: str, sid: str, senders: list[Sender], text: str, tally: Tally
) -> None:
    """The daemon holding the session's lease is paused (SIGSTOP) past its lease, by the
    database's clock (`run_out`: not waited for), and a client of another daemon sends
    `text` meanwhile (it takes the session over, unless a peer's sweep took it first);
    then it goes on. Nothing when nobody holds the lease now (nothing to pause)."""
    row = lease(db, sid)
    owner = next((s.daemon for s in senders if row is not None and s.daemon.pid == row[1]), None)
    other = next((s for s in senders if s.daemon is not owner), None)
    if row is None or owner is None or other is None or float(row[2]) <= float(row[4]):
        return
    for sender in senders:
        sender.pauses += sender.daemon is owner
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        # Paused, whatever it still holds runs out (not what it let go meanwhile, nor
        # what another took).
        run_out(db, str(row[0]))
        await other.send(sid, text.replace(" p", f" {other.name} p", 1))
        now = lease(db, sid)
        tally.taken += now is not None and now[3] > row[3]
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    tally.pauses += 1


@asynccontextmanager
async def machines(
    tmp_path: Path, pg_url: str, replies: list[dict[str, Any]], n: int = 2, **env: str
) -> AsyncIterator[tuple[FakeLLMServer, list[Daemon], str]]:
    """The fake LLM playing `replies`, `n` daemons with data folders of their own, and
    the token of alice, a user written to the database as `navi users add` writes one."""
    async with (
        open_fake_llm(replies) as llm,
        pg_daemons(tmp_path, pg_url, llm.url, n, separate=True, **env, forked=True) as procs,
    ):
        yield llm, procs, await store_user(pg_url, "alice")


async def say(client: Client, sid: str, text: str) -> dict[str, Any]:
    return await client.request({"type": "message", "session_id": sid, "content": text})


async def chat_requests_at_least(llm: FakeLLMServer, n: int) -> None:
    while len(llm.chat_requests) < n:
        await llm.wait_requests(len(llm.requests) + 1)


async def each_run_or_ended(
    llm: FakeLLMServer, db: str, sid: str, base: int, acked: list[str]
) -> None:
    """Until each of `acked` was sent to the model or had its turn ended by the daemon
    that took the session over (read again at each new model request). A count of
    requests waited out its whole limit for an ended one, which is never asked."""
    while True:
        asked = {last_user(r["body"]) for r in llm.chat_requests[base:]}
        missing = {t for t in acked if t not in asked}
        if not missing or missing <= ended_by_takeover(db, sid):
            return
        await llm.wait_requests(len(llm.requests) + 1)


def last_user(body: dict[str, Any]) -> str:
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    return str(users[-1]) if users else ""


async def play(
    llm: FakeLLMServer,
    db: str,
    senders: list[Sender],
    sid: str,
    plan: list[tuple[int, str]],
    tally: Tally,
) -> None:
    """One interleaving: `plan` is (client, then what to wait for) per send."""
    base = len(llm.chat_requests)
    for sender in senders:  # this example's sends
        sender.sent, sender.acked, sender.refused = [], [], []
    made = await senders[0].client.request(
        {"type": "sessions", "action": "create", "session_id": sid}
    )
    assert made["type"] != "error", made
    async with trio.open_nursery() as sends:
        for step, (who, barrier) in enumerate(plan):
            sender = senders[who % len(senders)]
            # A client sends its next message once the last one was answered.
            await sender.start(sends, sid, f"{sid} {sender.name} m{step}")
            if barrier == "reply":
                await sender.idle()
            elif barrier == "runs":  # every message acknowledged so far has started
                await sender.idle()
                so_far = [t for s in senders for t in s.acked]
                with trio.move_on_after(RUNS_LIMIT):
                    await each_run_or_ended(llm, db, sid, base, so_far)
            elif barrier == "pause":
                await pause_the_owner(db, sid, senders, f"{sid} p{step}", tally)
    acked = [t for s in senders for t in s.acked]
    refused = [t for s in senders for t in s.refused]
    # Every acknowledged message runs: the model is asked once for each.
    with trio.move_on_after(RUNS_LIMIT):
        await each_run_or_ended(llm, db, sid, base, acked)
    users = [content for role, content in history(db, sid) if role == "user"]
    ended = ended_by_takeover(db, sid)
    asked = [last_user(r["body"]) for r in llm.chat_requests[base:]]
    for text in acked:
        assert users.count(text) == 1, (text, users)  # stored once
        # Run once: asked once; or, never asked, its turn ended by the daemon that took
        # the session from one paused (or dead) after the save and before the model
        # call: the dead turn's end, which the new owner writes since it cannot know
        # whether the model was asked or a tool ran. Never twice, never neither.
        runs = asked.count(text)
        assert runs == 1 or (runs == 0 and text in ended), (text, asked, ended)
        tally.ended += runs == 0
    for text in refused:
        assert text not in users and text not in asked, (text, users)
    assert sorted(users) == sorted(acked), (users, acked)
    for s in senders:  # each client's messages in the order it sent them
        mine = [t for t in users if t.startswith(f"{sid} {s.name} ")]
        assert mine == s.acked, (s.name, mine, s.acked)
    assert sql(db, "SELECT count(*) FROM queued WHERE session_id = %s", (sid,)) == [(0,)]
    tally.examples += 1
    tally.acked += len(acked)
    tally.refused += len(refused)
    tally.sends += sum(len(s.sent) for s in senders)


async def _hold_connection(
    url: str, token: str, *, task_status: trio.TaskStatus[Client] = trio.TASK_STATUS_IGNORED
) -> None:
    async with connect_as(url, token) as client:
        task_status.started(client)
        await trio.sleep_forever()


def _one_pause(plan: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """At most one pause per plan: a few, not most, of a plan's sends see a takeover."""
    seen = False
    out = []
    for who, barrier in plan:
        if barrier == "pause":
            barrier, seen = ("none" if seen else "pause"), True
        out.append((who, barrier))
    return out


def _in_thread(fn: Callable[[list[tuple[int, str]]], Any], clients: int) -> Callable[[], None]:
    token = trio.lowlevel.current_trio_token()
    plans = st.lists(
        st.tuples(st.integers(0, clients - 1), st.sampled_from(BARRIERS)), min_size=2, max_size=9
    ).map(_one_pause)

    def run() -> None:
        # No shrinking: a failing plan is reported as found (each try costs real time).
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(plans)
        def check(plan: list[tuple[int, str]]) -> None:
            trio.from_thread.run(fn, plan, trio_token=token)

        check()

    return run


async def test_interleaved_sends_on_several_daemons_run_each_acknowledged_message_once_in_order(
    tmp_path: Path, pg_server: PgServer, pg_url: str
) -> None:
    """Both topologies at once, each a cluster of its own (its database, daemons and fake
    LLM): one's waits for a paused daemon's lease to run out are the other's time to run."""
    second = pg_server.schema_database()
    try:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(interleavings, tmp_path / "two", pg_url, 2)
                nursery.start_soon(interleavings, tmp_path / "three", second, 3)
    finally:
        pg_server.drop_database(second.rsplit("/", 1)[1])


async def interleavings(tmp_path: Path, pg_url: str, daemons: int) -> None:
    """EXAMPLES plans of sends over `daemons` daemons on the database at `pg_url`."""
    await trio.Path(tmp_path).mkdir()
    tally = Tally()
    async with (
        open_fake_llm([REPLY], loop=True) as llm,
        pg_daemons(
            tmp_path,
            pg_url,
            llm.url,
            daemons,
            separate=True,
            NAVI_MESSAGE_QUEUE_MAX="1000",
            NAVI_LEASE_TTL_SEC=TTL,
            forked=True,
        ) as procs,  # fmt: skip
    ):
        token = await store_user(pg_url, "alice")
        sessions = itertools.count()
        # The clients, connected once: each example is a session of its own.
        async with trio.open_nursery() as conns:
            senders: list[Sender] = []
            for n in range(daemons * CLIENTS_PER_DAEMON):
                proc = procs[n % daemons]
                client = await conns.start(_hold_connection, proc.url, token)
                senders.append(Sender(client, f"c{n}", proc))

            async def example(plan: list[tuple[int, str]]) -> None:
                sid = f"alice.x{next(sessions)}"  # a new one each time (a retried plan too)
                # (hypothesis runs this on the trio thread outside the test's scope)
                with trio.fail_after(EXAMPLE_LIMIT):
                    await play(llm, pg_url, senders, sid, plan, tally)

            await trio.to_thread.run_sync(_in_thread(example, len(senders)))
            conns.cancel_scope.cancel()
    print(
        f"\n{daemons} daemons: {tally.examples} interleavings ({tally.pauses} with a daemon "
        f"paused past its lease, {tally.taken} taken over then), {tally.sends} sends, "
        f"{tally.acked} acknowledged (each stored once, run once, in order; "
        f"{tally.ended} of them ended with the paused daemon's turn), "
        f"{tally.refused} refused (stored nowhere)"
    )
    assert tally.examples == EXAMPLES and tally.acked >= tally.examples * 2


async def test_acknowledged_messages_of_a_daemon_that_lost_its_session_run_on_the_new_owner(
    tmp_path: Path, pg_url: str
) -> None:
    """B runs the session and has two acknowledged messages queued behind its turn; B is
    paused past its lease, and a message through C takes the session over. C runs B's
    queued messages first (they were acknowledged before its own came), then its own;
    when B comes back its run is over (fenced) and it drops nothing and runs nothing
    twice: each message is in the history once, in order."""
    replies: list[dict[str, Any]] = [
        {"text": "B's first, never finished", "stall": True},
        {"text": "answer b0"},
        {"text": "answer b1"},
        {"text": "answer c1"},
        {"text": "answer b2"},
    ]
    with trio.fail_after(TIMEOUT):
        async with machines(tmp_path, pg_url, replies, NAVI_LEASE_TTL_SEC="1.5") as (
            llm, (b, c), token,
        ):  # fmt: skip
            sid = "alice.taken"
            async with connect_as(b.url, token) as on_b, connect_as(c.url, token) as on_c:
                assert (await say(on_b, sid, "m0"))["type"] == "session"
                await chat_requests_at_least(llm, 1)  # B runs m0
                for text in ("b0", "b1"):
                    ok = await say(on_b, sid, text)
                    assert (ok["type"], ok["queued"]) == ("ok", True), ok
                first = lease(pg_url, sid)
                assert first is not None and first[1] == b.pid
                os.kill(b.pid, signal.SIGSTOP)
                try:
                    await wait_lease_expired(pg_url, sid)
                    # Behind b0, b1; queued or not: C's sweep may have taken B's messages
                    # over already, and C run them, before c1 came.
                    assert (await say(on_c, sid, "c1"))["type"] == "ok"
                    for text in ("answer b0", "answer b1", "answer c1"):
                        end = await on_c.until(end_of(text))
                        assert end["reason"] == "complete", end
                finally:
                    os.kill(b.pid, signal.SIGCONT)
                end = await on_b.until_end(sid)  # m0's run: taken over under it
                assert end["reason"] == "error", end
                errors = [f for f in on_b.frames if f["type"] == "error"]
                assert [e["code"] for e in errors] == ["session_busy"], errors
                # B drops nothing and runs nothing again: a message after it runs once.
                assert (await say(on_b, sid, "b2"))["type"] == "ok"
                await chat_requests_at_least(llm, 5)
            users = [content for role, content in history(pg_url, sid) if role == "user"]
            assert users == ["m0", "b0", "b1", "c1", "b2"], users
            asked = [last_user(r["body"]) for r in llm.chat_requests]
            assert asked == ["m0", "b0", "b1", "c1", "b2"], asked
            assert sql(pg_url, "SELECT count(*) FROM queued") == [(0,)]


async def test_the_queue_cap_holds_the_same_on_every_daemon_and_names_what_it_drops(
    tmp_path: Path, pg_url: str
) -> None:
    """B runs a turn; clients on A (handed over) and on B (queued there) queue six
    messages behind it, three at most (NAVI_MESSAGE_QUEUE_MAX): the three oldest are
    dropped whichever daemon queued them, each named in a ``message_dropped`` warning
    that every client following the session gets, its sender's included. Each
    acknowledged message then either runs once or is named dropped once: never both,
    never neither."""
    replies: list[dict[str, Any]] = [
        {"text": "the long turn", "stall": True},
        {"text": "one"},
        {"text": "two"},
        {"text": "three"},
    ]
    with trio.fail_after(TIMEOUT):
        async with machines(tmp_path, pg_url, replies, NAVI_MESSAGE_QUEUE_MAX="3") as (
            llm, (a, b), token,
        ):  # fmt: skip
            sid = "alice.capped"
            async with connect_as(a.url, token) as on_a, connect_as(b.url, token) as on_b:
                assert (await say(on_b, sid, "m0"))["type"] == "session"
                await chat_requests_at_least(llm, 1)  # B runs m0
                sent = ["a1", "b1", "a2", "b2", "a3", "b3"]
                for text in sent:
                    ok = await say(on_a if text.startswith("a") else on_b, sid, text)
                    assert (ok["type"], ok["queued"]) == ("ok", True), ok
                queued = sql(pg_url, "SELECT count(*) FROM queued WHERE session_id = %s", (sid,))
                assert queued == [(3,)]  # the same cap for both daemons' messages
                assert (await on_b.request({"type": "stop", "session_id": sid}))["stopped"]
                for client in (on_a, on_b):
                    ends = [await client.until_end(sid) for _ in range(4)]
                    assert [e["reason"] for e in ends] == ["stopped"] + ["complete"] * 3, ends
            users = [content for role, content in history(pg_url, sid) if role == "user"]
            ran = users[1:]
            for client in (on_a, on_b):
                warned = [
                    f["message"] for f in client.frames
                    if f["type"] == "warning" and f.get("code") == "message_dropped"
                ]  # fmt: skip
                named = [t for t in sent if any(f"'{t}'" in w for w in warned)]
                assert len(warned) == len(named) == 3, warned
                for text in sent:  # run once, or dropped and named once: not both, not neither
                    assert ran.count(text) + sum(f"'{text}'" in w for w in warned) == 1, text
            assert sorted(named) == ["a1", "a2", "b1"], named  # the oldest three
            for mine in ("a", "b"):  # each client's messages in the order it sent them
                in_order = [t for t in sent if t[0] == mine and t in ran]
                assert [t for t in ran if t[0] == mine] == in_order, ran
            assert len(llm.chat_requests) == 4


FAIL_HANDED = """
CREATE FUNCTION refuse_handed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF position('refuse me' in NEW.data) > 0 THEN
        RAISE EXCEPTION 'could not extend file: No space left on device'
            USING ERRCODE = '53100';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_handed BEFORE INSERT ON queued
    FOR EACH ROW EXECUTE FUNCTION refuse_handed();
"""


async def test_a_message_handed_to_another_daemon_whose_queue_write_fails_gets_an_error(
    tmp_path: Path, pg_url: str
) -> None:
    """B runs the session; a message sent through A is to be queued for B, and the
    database refuses the write (its disk is full): the client gets that error, never
    ``ok``, and the message is nowhere: not queued, never run."""
    replies: list[dict[str, Any]] = [
        {"text": "the long turn", "stall": True},
        {"text": "answer to the next one"},
    ]
    with trio.fail_after(TIMEOUT):
        async with machines(tmp_path, pg_url, replies) as (llm, (a, b), token):
            sid = "alice.refused"
            sql(pg_url, FAIL_HANDED)
            async with connect_as(a.url, token) as on_a, connect_as(b.url, token) as on_b:
                assert (await say(on_b, sid, "m0"))["type"] == "session"
                await chat_requests_at_least(llm, 1)  # B runs m0
                refused = await say(on_a, sid, "refuse me")
                assert (refused["type"], refused.get("code")) == ("error", "storage_full"), refused
                assert sql(pg_url, "SELECT count(*) FROM queued") == [(0,)]
                ok = await say(on_a, sid, "the next one")
                assert (ok["type"], ok["queued"]) == ("ok", True), ok
                assert (await on_b.request({"type": "stop", "session_id": sid}))["stopped"]
                ends = [await on_a.until_end(sid) for _ in range(2)]
                assert [e["reason"] for e in ends] == ["stopped", "complete"], ends
            users = [content for role, content in history(pg_url, sid) if role == "user"]
            assert users == ["m0", "the next one"], users
            assert [last_user(r["body"]) for r in llm.chat_requests] == ["m0", "the next one"]
