"""A daemon killed mid-turn (docs/pages/scaling.md, "Failover"): the daemon that takes its
session over ends the dead turn in the history and publishes its ``stream_end``, every
follower gets ``resync`` before frames of another epoch, and on the same machine this
happens at once, not when the lease runs out.

Real `navi serve` processes with data folders of their own on one PostgreSQL, a user
written to the database as `navi users add` writes one, a fake LLM over real HTTP. Waits
are for frames and processes; the lease TTL is set far above the tests' limits, so a
takeover that waited for it could not pass. Every test under `trio.fail_after`; every
process is killed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client
from daemons import connect_as, history, pg_daemons, store_user
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql
from test_scale_cluster import LEASE_LOG, killed_then_two, never_two_owners

from navi_trio.core.turn.agent import DEAD_TURN
from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow

TIMEOUT = 120
TTL = "600"  # far above TIMEOUT: nothing here may wait for a lease to run out
FOLLOWERS = 4  # clients following on each other daemon


def announced_epochs(c: Client, sid: str) -> None:
    """Every frame of the session that starts another epoch than the one before it is
    a ``resync``: no client sees another epoch begin unannounced."""
    epoch = None
    for f in c.frames:
        if f.get("session_id") != sid or "epoch" not in f:  # replies carry no epoch
            continue
        if epoch is not None and f["epoch"] != epoch:
            assert f["type"] == "resync", (epoch, f)
        epoch = f["epoch"]


def ended_here(url: str, sid: str) -> list[dict[str, Any]]:
    """The display messages of `sid` that end a dead daemon's turn."""
    rows = sql(url, "SELECT data FROM messages WHERE session_id = %s ORDER BY position", (sid,))
    return [m for (data,) in rows if (m := json.loads(data)).get("error") == DEAD_TURN]


async def test_a_turn_killed_with_its_daemon_is_ended_and_every_follower_resyncs(
    tmp_path: Path, pg_url: str
) -> None:
    words = " ".join(f"w{i}" for i in range(200))
    replies: list[dict[str, Any]] = [
        {"text": words, "delay_chunk": 0.2},  # A's turn: killed mid-stream
        {"text": "the next turn"},
    ]
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(
                tmp_path,
                pg_url,
                llm.url,
                3,
                NAVI_LEASE_TTL_SEC=TTL,
                NAVI_WS_CONNECTIONS_PER_USER="64",
                forked=True,
            ) as (a, b, c),
            AsyncExitStack() as stack,
        ):
            token = await store_user(pg_url, "alice")
            on_a = await stack.enter_async_context(connect_as(a.url, token))
            made = await on_a.request({"type": "message", "content": "one"})
            sid = made["session_id"]
            followers = [
                await stack.enter_async_context(connect_as(d.url, token))
                for d in (b, c)
                for _ in range(FOLLOWERS)
            ]
            for f in followers:
                assert (await f.request({"type": "subscribe", "session_id": sid}))["type"] == "ok"
            for f in followers:  # A's frames reach every follower
                await f.until_type("text_delta", session_id=sid)
            os.kill(a.pid, signal.SIGKILL)
            # B or C (whichever is first) ends A's turn: every follower hears of it.
            for f in followers:
                end = await f.until_end(sid)
                assert end["reason"] == "error", end
                said = [x for x in f.frames if x["type"] == "error" and x.get("session_id") == sid]
                assert [x["code"] for x in said] == ["daemon_died"], said
            # The next turn, sent on B, runs on one of them; every follower sees it whole.
            ok = await followers[0].request(
                {"type": "message", "session_id": sid, "content": "two"}
            )
            assert ok["type"] == "ok", ok
            for f in followers:
                end = await f.until_end(sid)
                assert (end["reason"], end["text"]) == ("complete", "the next turn"), end
                announced_epochs(f, sid)
        rows = history(pg_url, sid)
        assert [r for r in rows if r[0] == "user"] == [("user", "one"), ("user", "two")], rows
        assert len(ended_here(pg_url, sid)) == 1, rows  # ended once, by one daemon
        assert rows[-1] == ("assistant", "the next turn"), rows


async def test_a_daemon_killed_on_the_same_machine_is_taken_over_before_its_lease_ends(
    tmp_path: Path, pg_url: str
) -> None:
    """Its pid is gone: the other daemon, which watches it (B started after A), takes its
    session over at once, with no command to it: B's turn is ended, the message handed
    to B runs, long before B's lease would run out."""
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(killed_then_two(600)) as llm,
            pg_daemons(
                tmp_path, pg_url, llm.url, 2, separate=True, NAVI_LEASE_TTL_SEC=TTL, forked=True
            ) as (
                a,
                b,
            ),
        ):
            sql(pg_url, LEASE_LOG)
            token = await store_user(pg_url, "alice")
            async with connect_as(b.url, token) as on_b, connect_as(a.url, token) as on_a:
                sid = (await on_b.request({"type": "message", "content": "one"}))["session_id"]
                await llm.wait_requests(1)  # B runs it
                ok = await on_a.request({"type": "message", "session_id": sid, "content": "two"})
                assert (ok["type"], ok["queued"]) == ("ok", True), ok  # handed to B
                os.kill(b.pid, signal.SIGKILL)
                reasons = [(await on_a.until_end(sid))["reason"] for _ in range(2)]
                assert reasons == ["error", "complete"], reasons
                ok = await on_a.request({"type": "message", "session_id": sid, "content": "three"})
                assert (await on_a.until_end(sid))["reason"] == "complete"
            rows = history(pg_url, sid)
            assert [r for r in rows if r[0] == "user"] == [
                ("user", "one"), ("user", "two"), ("user", "three")
            ], rows  # fmt: skip
            assert rows[-1] == ("assistant", "answer three"), rows
            assert len(ended_here(pg_url, sid)) == 1, rows
            # A took B's lease while it had most of its TTL left: B's pid was gone.
            (taken,) = sql(
                pg_url,
                "SELECT n.at, o.expires_at FROM lease_log n JOIN lease_log o"
                " ON o.session_id = n.session_id AND o.generation = n.generation - 1"
                " WHERE n.session_id = %s AND n.owner LIKE %s ORDER BY n.id LIMIT 1",
                (sid, f"%:{a.pid}:%"),
            )
            assert taken[1] - taken[0] > float(TTL) / 2, taken
            assert never_two_owners(pg_url, frozenset({b.pid})) >= 2


@pytest.mark.parametrize("saved", [True, False], ids=["its-message-saved", "after-its-answer"])
async def test_a_message_for_a_session_whose_holder_died_here_runs_here_at_once(
    tmp_path: Path, pg_url: str, saved: bool
) -> None:
    """A process of this machine that kept no daemon row (an embedded `navi run`) died
    holding the session's lease: a message to it is not handed to that dead pid, it runs
    here at once, after the dead turn's end when its turn's message was saved; when it
    died after its turn's answer, before its release, there is no turn to end."""
    replies: list[dict[str, Any]] = [{"text": "answer one"}, {"text": "answer two"}]
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(
                tmp_path, pg_url, llm.url, 1, separate=True, NAVI_LEASE_TTL_SEC=TTL, forked=True
            ) as (a,),
        ):
            token = await store_user(pg_url, "alice")
            async with connect_as(a.url, token) as on_a:
                sid = (await on_a.request({"type": "message", "content": "one"}))["session_id"]
                assert (await on_a.until_end(sid))["reason"] == "complete"
                await on_a.idle(sid)  # else "two" may queue behind the run still settling
                gone = await trio.lowlevel.open_process(["true"])  # a process that ended:
                await gone.wait()  # its pid, reaped, is dead
                sql(pg_url, "UPDATE leases SET owner = %s, pid = %s, host = %s, expires_at ="
                            " extract(epoch FROM clock_timestamp()) + 600, generation ="
                            " generation + 1 WHERE session_id = %s",
                    (f"{socket.gethostname()}:{gone.pid}:run", gone.pid, socket.gethostname(),
                     sid))  # fmt: skip
                dead: list[tuple[str, str]] = []
                if saved:  # the row its save wrote
                    sql(pg_url, "INSERT INTO messages (session_id, position, role, content,"
                                " is_plan, data, created_at) SELECT %s, max(position) + 1, 'user',"
                                " 'run', false, %s, 0 FROM messages WHERE session_id = %s",
                        (sid, json.dumps({"role": "user", "content": "run"}), sid))  # fmt: skip
                    dead = [("user", "run"), ("assistant", "")]  # its turn, ended here
                ok = await on_a.request({"type": "message", "session_id": sid, "content": "two"})
                assert (ok["type"], ok["queued"]) == ("ok", False), ok
                ends = ["error", "complete"] if saved else ["complete"]
                reasons = [(await on_a.until_end(sid))["reason"] for _ in ends]
                assert reasons == ends, reasons
            assert history(pg_url, sid) == [
                ("user", "one"), ("assistant", "answer one"), *dead,
                ("user", "two"), ("assistant", "answer two"),
            ]  # fmt: skip
