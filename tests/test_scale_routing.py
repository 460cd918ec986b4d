"""Approvals and background tasks across daemons (issue 20 "Any daemon takes any
command"): a client on daemon A answers the approval request of a call that daemon B
runs, lists the background jobs B runs in its sessions, and cancels one there; another
user is refused on A as on B.

Two real `navi serve` processes on one PostgreSQL, a fake LLM over real HTTP; users
made in the database the daemons share. Waits are for frames; every test under
`trio.fail_after`; every process is killed on the way out. The owner's checks of what
it is asked (core/cluster/owner_calls.py) are also tested on their own, with a recording bus.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import trio
from agent_tools import call
from api_ws import Client
from daemons import connect_as, no_plan_config, pg_daemons
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql

from navi_trio.core.cluster.owner_calls import OwnerCalls
from navi_trio.errors import ForbiddenError, NotFoundError
from navi_trio.store.base import ClusterBus
from navi_trio.store.methods import SessionStore
from navi_trio.store.postgres import PostgresStore
from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 30
RULES = [
    {"tool": "scratchpad", "action": "write", "decision": "ask"},
    {"tool": "terminal", "action": "run", "match": "sleep *", "decision": "allow"},
]


async def add_users(url: str, *names: str) -> dict[str, str]:
    """A token for each new user (role user)."""
    async with PostgresStore.open(url) as store:
        for name in names:
            await store.create_user(name, f"token-of-{name}")
    return {name: f"token-of-{name}" for name in names}


def config(tmp_path: Path) -> str:
    """Its own folder: pg_daemons writes its default config in tmp_path's either way."""
    return str(no_plan_config(tmp_path / "rules", policy={"rules": RULES}))


async def answer(c: Client, kind: str, sid: str, call_id: str) -> dict[str, Any]:
    return await c.request({"type": kind, "session_id": sid, "call_id": call_id})


def results(c: Client, sid: str) -> list[dict[str, Any]]:
    return [f for f in c.frames if f["type"] == "tool_result" and f.get("session_id") == sid]


async def test_a_client_on_another_daemon_answers_approvals_only_its_own(
    tmp_path: Path, pg_url: str
) -> None:
    replies: list[dict[str, Any]] = [
        call("scratchpad", action="write", content="approved on A"),
        {"text": "written"},
        call("scratchpad", action="write", content="never"),
        {"text": "refused"},
    ]
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 2, NAVI_CONFIG=config(tmp_path), forked=True) as (
                a,
                b,
            ),
        ):
            tokens = await add_users(pg_url, "bob", "carol")
            async with (
                connect_as(b.url, tokens["bob"]) as bob_b,
                connect_as(a.url, tokens["bob"]) as bob_a,
                connect_as(a.url, tokens["carol"]) as carol_a,
                a.connect() as admin_a,
            ):
                made = await bob_b.request({"type": "message", "content": "note it"})
                sid = made["session_id"]
                req = await bob_b.until_type("approval_request", session_id=sid)  # B runs it
                cid = req["call_id"]
                # Another user, and an admin, are refused on A; the call still waits.
                refused = await answer(carol_a, "approve", sid, cid)
                assert refused.get("code") == "forbidden", refused
                refused = await answer(admin_a, "approve", sid, cid)
                assert refused.get("code") == "forbidden", refused
                assert "only the owner" in refused["message"], refused
                # The owner on A: answered on B, and the call runs there.
                ok = await answer(bob_a, "approve", sid, cid)
                assert ok["type"] == "ok", ok
                assert (ok["approved"], ok["call_id"], ok["scope"]) == (True, cid, "once")
                end = await bob_b.until_end(sid)
                assert (end["reason"], end["text"]) == ("complete", "written"), end
                assert [r["ok"] for r in results(bob_b, sid)] == [True]
                decided = await bob_b.until_type("approval_decided", session_id=sid)
                assert (decided["approved"], decided["by"]) == (True, "owner"), decided
                # Answered once: a second answer finds nothing waiting on B.
                again = await answer(bob_a, "deny", sid, cid)
                assert again["code"] == "not_found", again
                # A deny on A likewise: the call fails on B, and the model goes on.
                await bob_b.send({"type": "message", "session_id": sid, "content": "again"})
                req = await bob_b.until_type("approval_request", session_id=sid)
                ok = await answer(bob_a, "deny", sid, req["call_id"])
                assert (ok["type"], ok["approved"]) == ("ok", False), ok
                end = await bob_b.until_end(sid)
                assert (end["reason"], end["text"]) == ("complete", "refused"), end
                denied = results(bob_b, sid)[-1]
                assert denied["ok"] is False and "the user denied it" in denied["error"]
            pad = sql(pg_url, "SELECT value FROM kv WHERE scope = 'scratchpad' AND key = %s",
                      (sid,))  # fmt: skip
            assert pad and "approved on A" in str(pad[0][0]), pad
            # Both runs were B's: its lease, never A's.
            owners = sql(pg_url, "SELECT pid FROM leases WHERE session_id = %s", (sid,))
            assert owners == [(b.pid,)], owners


async def test_tasks_on_another_daemon_are_listed_and_cancelled_there(
    tmp_path: Path, pg_url: str
) -> None:
    replies: list[dict[str, Any]] = [
        call("terminal", action="run", command="sleep 60", background=True),
        {"text": "started"},
    ]
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm(replies) as llm,
            pg_daemons(tmp_path, pg_url, llm.url, 2, NAVI_CONFIG=config(tmp_path), forked=True) as (
                a,
                b,
            ),
        ):
            tokens = await add_users(pg_url, "bob")
            async with (
                b.connect() as on_b,
                a.connect() as on_a,
                connect_as(a.url, tokens["bob"]) as bob_a,
            ):
                sid = "admin.jobs"
                made = await on_b.request(
                    {"type": "message", "session_id": sid, "content": "wait", "mode": "full"}
                )
                assert made["type"] == "session", made
                end = await on_b.until_end(sid)
                assert end["text"] == "started", end
                (job,) = (await on_b.request({"type": "tasks", "action": "list"}))["tasks"]
                tid = job["task_id"]
                assert (job["tool"], job["status"]) == ("terminal", "running"), job
                # A lists it, from B's running marker, with the daemon that runs it.
                (seen,) = (await on_a.request({"type": "tasks", "action": "list"}))["tasks"]
                assert (seen["task_id"], seen["session_id"], seen["status"]) == (
                    tid, sid, "running",
                ), seen  # fmt: skip
                assert seen["tool"] == "terminal" and "sleep 60" in seen["args"], seen
                assert f":{b.pid}:" in seen["daemon"] and 0 <= seen["age_sec"] < TIMEOUT, seen
                checked = await on_a.request({"type": "tasks", "action": "check", "task_id": tid})
                assert checked["task"]["status"] == "running", checked
                # Another user sees nothing of it, and cannot cancel it.
                assert (await bob_a.request({"type": "tasks", "action": "list"}))["tasks"] == []
                err = await bob_a.request({"type": "tasks", "action": "cancel", "task_id": tid})
                assert err["code"] == "not_found", err
                # Cancelled from A: B cancels it.
                done = await on_a.request({"type": "tasks", "action": "cancel", "task_id": tid})
                assert (done["type"], done["task_id"], done["cancelled"]) == (
                    "tasks", tid, True,
                ), done  # fmt: skip
                update = await on_b.until(
                    lambda f: f["type"] == "task_update" and f.get("status") == "cancelled"
                )
                assert update["task_id"] == tid, update
                checked = await on_b.request({"type": "tasks", "action": "check", "task_id": tid})
                assert checked["task"]["status"] == "cancelled", checked


class RecordingBus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def notify(self, items: Sequence[tuple[str, str]]) -> None:
        self.sent += [(channel, json.loads(payload)) for channel, payload in items]


class Broker:
    def __init__(self) -> None:
        self.answered: list[tuple[str, str, bool, str, str]] = []

    async def answer(
        self, session_id: str, call_id: str, *, approve: bool, scope: str, user_id: str
    ) -> None:
        if call_id == "gone":
            raise NotFoundError(f"no approval request {call_id!r} is waiting")
        if user_id != "u-starter":
            raise ForbiddenError("only the owner of this run answers")
        self.answered.append((session_id, call_id, approve, scope, user_id))


async def test_the_owner_checks_every_field_of_what_it_is_asked() -> None:
    bus, broker = RecordingBus(), Broker()
    calls = OwnerCalls(
        cast(ClusterBus, bus), cast(SessionStore, None), "me", lambda owner: f"nd_{owner}"
    )
    calls.attach(broker, None)
    good: dict[str, Any] = {
        "k": "approve",
        "s": "s-1",
        "r": "r1",
        "o": "you",
        "c": "call-1",
        "a": True,
        "u": "u-starter",
    }
    with trio.fail_after(10):
        assert await calls.received({**good, "sc": "once"})
        assert broker.answered == [("s-1", "call-1", True, "once", "u-starter")]
        assert bus.sent == [("nd_you", {"k": "answer", "r": "r1", "v": True})]
        # Every malformed field: an error answered, nothing done.
        for bad in ({"sc": "forever"}, {"sc": "once", "a": "yes"}, {"sc": "once", "c": 7},
                    {"sc": "once", "c": "x" * 301}):  # fmt: skip
            assert await calls.received({**good, **bad})
            assert "malformed" in bus.sent[-1][1]["e"], bad
        assert len(broker.answered) == 1
        # No request id or asker: nobody to answer, nothing done.
        sent = len(bus.sent)
        assert await calls.received({**good, "sc": "once", "o": None})
        assert await calls.received({**good, "sc": "once", "r": ["r1"]})
        assert len(bus.sent) == sent and len(broker.answered) == 1
        # Not waiting there: the asker learns it (not_found on its side).
        assert await calls.received({**good, "sc": "once", "c": "gone"})
        assert bus.sent[-1][1]["nf"] is True
        # The answering user is part of the request: without one, nothing is answered;
        # another user than the run's starter is refused (forbidden on the asker's side).
        assert await calls.received({**good, "sc": "once", "u": None})
        assert "without its user" in bus.sent[-1][1]["e"]
        assert await calls.received({**good, "sc": "once", "u": "u-other"})
        assert bus.sent[-1][1]["fb"] is True and "only the owner" in bus.sent[-1][1]["e"]
        # A cancel without a task id; and a kind that is not ours (stop, compact).
        assert await calls.received({"k": "cancel_task", "s": "s-1", "r": "r2", "o": "you"})
        assert "task id" in bus.sent[-1][1]["e"]
        assert not await calls.received({"k": "stop", "s": "s-1"})
        # An answer nobody waits for is dropped.
        assert await calls.received({"k": "answer", "r": "unknown", "v": True})
