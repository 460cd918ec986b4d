"""Scheduled runs over WebSocket (issue 23): the ``schedule`` frames and their owner
checks, runs on the clock (exactly once per due time, a notice to the owner's clients),
headless approvals and budgets, catch-up across a restart, two daemons on one database.

The timed tests give the scheduler a wall clock of their own (`Wall`) and move it by
hand: after a move, `Scheduler.look_now` returns once a look that began after it has
ended, so what fell due has been claimed and nothing else has (no virtual clock that
runs on while a thread or a socket is waited for, no real sleep).
Real parts: the daemon on 127.0.0.1, WebSocket clients, SQLite in tmp_path, the fake LLM.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from agent_tools import call, toolset, with_tools
from api_ws import Client, Daemon, open_daemon
from test_api_approvals import ASK_PUSH, FakeTerminal

from navi_trio.testing import open_harness

TIMEOUT = 60
HOUR = 3600.0
NO_PLAN = {"planning_first_message": False}
MAIL: dict[str, Any] = {  # a daemon whose every run answers the same
    "replies": [{"text": "no new mail"}],
    "loop": True,
    "profiles": {"general": NO_PLAN},
}


@attrs.define
class Wall:
    """The scheduler's wall clock: it moves only when the test moves it."""

    now: float = attrs.field(factory=time.time)

    def __call__(self) -> float:
        return self.now


async def schedule(c: Client, action: str, **fields: Any) -> dict[str, Any]:
    return await c.request({"type": "schedule", "action": action, **fields})


async def add_every(c: Client, every: str = "10m", **fields: Any) -> dict[str, Any]:
    reply = await schedule(c, "add", every=every, message="check the mail", **fields)
    assert reply["type"] == "schedules", reply
    return dict(reply["schedule"])


@asynccontextmanager
async def on_the_clock(tmp_path: Path, wall: Wall, **kw: Any) -> AsyncIterator[Daemon]:
    """A daemon whose scheduler runs on `wall`."""
    async with open_daemon(tmp_path, schedules=True, wall_clock=wall, **kw) as d:
        yield d


async def at(d: Daemon, wall: Wall, when: float) -> None:
    """The wall clock moves to `when` and the daemon's scheduler has looked."""
    wall.now = when
    await d.harness.runtime.scheduler.look_now()


# -- the frames and who may use them -------------------------------------------------


async def test_schedules_are_added_listed_paused_resumed_and_removed(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, schedules=True) as d, d.connect("alice") as c:
            before = time.time()
            row = await add_every(c, new=True, profile="coder")
            assert (row["kind"], row["spec"], row["profile"], row["session_id"]) == (
                "every", "10m", "coder", None
            )  # fmt: skip
            assert before + 600 <= row["next_due"] <= time.time() + 600 and row["catch_up"]
            listed = await schedule(c, "list")
            assert [s["schedule_id"] for s in listed["schedules"]] == [row["schedule_id"]]
            paused = await schedule(c, "pause", schedule_id=row["schedule_id"])
            assert paused["schedule"]["paused"] is True
            resumed = await schedule(c, "resume", schedule_id=row["schedule_id"])
            assert resumed["schedule"]["paused"] is False
            cron = await schedule(c, "add", cron="*/30 * * * *", message="tidy", new=True,
                                  catch_up=False)  # fmt: skip
            assert cron["schedule"]["kind"] == "cron" and cron["schedule"]["catch_up"] is False
            gone = await schedule(c, "remove", schedule_id=row["schedule_id"])
            assert gone["removed"] is True
            listed = await schedule(c, "list")
            assert [s["kind"] for s in listed["schedules"]] == ["cron"]
            stored = await d.harness.runtime.store.list_schedules()
            assert [(r.kind, r.user_id) for r in stored] == [("cron", d.ids["alice"])]


async def test_a_user_touches_only_their_own_schedules_and_sessions(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, schedules=True
        ) as d, d.connect("alice") as alice, d.connect("bob") as bob:  # fmt: skip
            row = await add_every(alice, new=True)
            sid = row["schedule_id"]
            for action in ("pause", "resume", "remove"):
                err = await schedule(bob, action, schedule_id=sid)
                assert err["type"] == "error" and err["code"] == "forbidden", err
            assert (await schedule(bob, "list"))["schedules"] == []
            # A schedule of bob's may not run in alice's session.
            await d.harness.runtime.store.create_session(
                "s-0123456789ab", profile_id="general", user_id=d.ids["alice"]
            )
            err = await schedule(bob, "add", every="10m", message="x", session_id="s-0123456789ab")
            assert err["code"] == "forbidden", err
            # An admin sees everyone's.
            async with d.connect("root") as root:
                listed = await schedule(root, "list")
                assert [s["schedule_id"] for s in listed["schedules"]] == [sid]
            assert (await schedule(alice, "pause", schedule_id="sch-nope"))["code"] == "not_found"


BAD_ADDS: list[tuple[dict[str, Any], str]] = [
    ({"message": "x", "new": True}, "exactly one of cron, every and at"),
    ({"every": "10m", "cron": "* * * * *", "message": "x", "new": True}, "exactly one"),
    ({"every": "10m", "new": True}, "needs a message"),
    ({"every": "10m", "message": "x"}, "needs a session_id"),
    ({"every": "10m", "message": "x", "new": True, "session_id": "s-1"}, "needs a session_id"),
    ({"every": "30s", "message": "x", "new": True}, "at least 1 minute"),
    ({"every": "soon", "message": "x", "new": True}, "a duration like"),
    ({"every": "10", "message": "x", "new": True}, "every '10': add a unit: 10m (or s, h, d)"),
    ({"cron": "*/30 * * *", "message": "x", "new": True}, "five fields"),
    ({"cron": "61 * * * *", "message": "x", "new": True}, "Bad minute"),
    ({"cron": "* * * * * *", "message": "x", "new": True}, "five fields"),
    ({"at": "2001-01-01T00:00", "message": "x", "new": True}, "that time has passed"),
    ({"at": "tomorrow", "message": "x", "new": True}, "ISO 8601"),
    ({"every": "10m", "message": "x", "new": True, "profile": "nope"}, "unknown profile"),
    ({"every": "10m", "message": "x" * 16_001, "new": True}, "at most 16000"),
    ({"every": "10m", "message": "x", "new": True, "catch_up": "yes"}, "true or false"),
    ({"every": "10m", "message": "x", "new": True, "budget": {"turn": {"tokens": -1}}},
     "budget.turn.tokens"),
    ({"every": "x" * 200, "message": "x", "new": True}, "at most 128"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "problem"), BAD_ADDS)
async def test_a_bad_schedule_is_refused_naming_the_problem(
    tmp_path: Path, fields: dict[str, Any], problem: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, schedules=True) as d, d.connect("alice") as c:
            err = await schedule(c, "add", **fields)
            assert err["type"] == "error" and problem in err["message"], err
            assert err["code"] == "bad_frame"
            assert await d.harness.runtime.store.list_schedules() == []


async def test_the_schedules_of_a_user_are_bounded(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, schedules=True, schedules_per_user=2
        ) as d, d.connect("alice") as c:  # fmt: skip
            await add_every(c, new=True)
            await add_every(c, new=True)
            err = await schedule(c, "add", every="10m", message="x", new=True)
            assert err["code"] == "limit" and "NAVI_SCHEDULES_PER_USER" in err["message"]
            async with d.connect("bob") as bob:  # another user has their own count
                assert (await schedule(bob, "add", every="1h", message="x", new=True))[
                    "type"
                ] == "schedules"


# -- runs on the clock -------------------------------------------------------------------


async def test_an_every_schedule_runs_once_per_due_time_and_tells_its_owner(
    tmp_path: Path,
) -> None:
    wall = Wall()
    with trio.fail_after(TIMEOUT):
        async with (
            on_the_clock(tmp_path, wall, **MAIL) as d,
            d.connect("alice") as c,
            d.connect("bob") as bob,
        ):
            store = d.harness.runtime.store
            sid = (row := await add_every(c, "1h", new=True))["schedule_id"]
            first_due = row["next_due"]
            assert first_due == pytest.approx(wall.now + HOUR)
            await at(d, wall, first_due - 1)  # not yet
            assert (await d.harness.runtime.scheduler.get(sid)).runs == 0
            await at(d, wall, first_due)
            first = await c.until_type("schedule_run", schedule_id=sid)
            assert (first["reason"], first["text"]) == ("complete", "no new mail")
            await at(d, wall, first_due + HOUR / 2)  # between due times: nothing runs
            assert (await d.harness.runtime.scheduler.get(sid)).runs == 1
            await at(d, wall, first_due + HOUR)
            second = await c.until_type("schedule_run", schedule_id=sid)
            assert second["session_id"] != first["session_id"]  # new: true, a new session
            for run in (first, second):
                saved = await store.load_messages(run["session_id"])
                assert [(m["role"], m["content"]) for m in saved] == [
                    ("user", "check the mail"), ("assistant", "no new mail")
                ]  # fmt: skip
                session = await store.get_session(run["session_id"])
                assert session is not None and session.user_id == d.ids["alice"]
            # Three due times missed in a row (the loop was busy): one run, and the next
            # due time is the first one after now.
            await at(d, wall, first_due + 4 * HOUR + 60)
            late = await c.until_type("schedule_run", schedule_id=sid)
            got = await d.harness.runtime.scheduler.get(sid)
            assert got.runs == 3 and got.next_due == pytest.approx(wall.now + HOUR)
            # Paused, it does not run; resumed, it runs from now on.
            await schedule(c, "pause", schedule_id=sid)
            await at(d, wall, wall.now + 5 * HOUR)
            assert (await d.harness.runtime.scheduler.get(sid)).runs == 3
            resumed = await schedule(c, "resume", schedule_id=sid)
            assert resumed["schedule"]["next_due"] == pytest.approx(wall.now + HOUR)
            await at(d, wall, wall.now + HOUR)
            third = await c.until_type("schedule_run", schedule_id=sid)
            assert third["reason"] == "complete"
            # Once per due time: as many runs as notices and sessions.
            got = await d.harness.runtime.scheduler.get(sid)
            notices = [f for f in c.frames if f["type"] == "schedule_run"]
            sessions = await store.list_sessions(d.ids["alice"])
            assert got.runs == len(notices) == len(sessions) == 4
            assert [f["session_id"] for f in notices] == [
                run["session_id"] for run in (first, second, late, third)
            ]
            assert len({f["session_id"] for f in notices}) == 4
            assert not [f for f in bob.frames if f["type"] == "schedule_run"]


async def test_scheduled_runs_in_new_sessions_count_against_the_session_limit(
    tmp_path: Path,
) -> None:
    """Five one-shot schedules and a cron one, each in a new session, for a user who may
    have three sessions: the first three due runs run, the others are skipped (each
    claimed once, its schedule saying why, a schedule_run notice with reason
    ``skipped``); the cron one runs again once a session is deleted."""
    wall = Wall()
    soon = datetime.fromtimestamp(wall.now + 5).astimezone().isoformat(timespec="seconds")
    with trio.fail_after(TIMEOUT):
        async with on_the_clock(
            tmp_path, wall, replies=[{"text": "done"}], loop=True,
            profiles={"general": NO_PLAN}, sessions_per_user=3,
        ) as d, d.connect("alice") as c:  # fmt: skip
            store = d.harness.runtime.store
            at_ids = []
            for i in range(5):
                reply = await schedule(c, "add", at=soon, message=f"once {i}", new=True)
                at_ids.append(reply["schedule"]["schedule_id"])
            cron = (await schedule(c, "add", cron="* * * * *", message="each minute",
                                   new=True))["schedule"]  # fmt: skip
            await at(d, wall, max(wall.now + 5, cron["next_due"]))
            notices = []
            for _ in range(6):
                notices.append(await c.until_type("schedule_run"))
            ran = [n for n in notices if n["reason"] == "complete"]
            skipped = [n for n in notices if n["reason"] == "skipped"]
            assert (len(ran), len(skipped)) == (3, 3)
            assert all("NAVI_SESSIONS_PER_USER=3" in n["text"] for n in skipped)
            assert all(n["session_id"] is None for n in skipped)
            assert len(await store.list_sessions(d.ids["alice"])) == 3
            listed = {s["schedule_id"]: s for s in (await schedule(c, "list"))["schedules"]}
            for n in skipped:
                row = listed[n["schedule_id"]]
                assert row["runs"] == 0 and "NAVI_SESSIONS_PER_USER=3" in row["last_skip"]
            for n in ran:
                assert listed[n["schedule_id"]]["last_skip"] is None
            assert all(listed[sid]["next_due"] is None for sid in at_ids)  # each claimed once
            # Each minute the cron one is skipped while the sessions are full ...
            cron_id = cron["schedule_id"]
            await at(d, wall, listed[cron_id]["next_due"])
            again = await c.until_type("schedule_run", schedule_id=cron_id)
            assert again["reason"] == "skipped"
            # ... and runs once one is deleted.
            gone = ran[0]["session_id"]
            assert (await c.request({"type": "sessions", "action": "delete",
                                     "session_id": gone}))["type"] != "error"  # fmt: skip
            row = await store.get_schedule(cron_id)
            assert row is not None and row.next_due is not None
            await at(d, wall, row.next_due)
            back = await c.until_type("schedule_run", schedule_id=cron_id)
            assert back["reason"] == "complete"
            got = await store.get_schedule(cron_id)
            assert got is not None and got.last_skip is None
            assert len(await store.list_sessions(d.ids["alice"])) == 3


async def test_a_schedule_whose_owner_is_gone_never_runs_and_is_deleted(
    tmp_path: Path,
) -> None:
    # Removing a user removes their schedules with them (the store's transaction); one
    # added as they went (on a connection not closed yet) belongs to nobody when it
    # falls due: it is deleted, never run, while the others run as ever.
    wall = Wall()
    with trio.fail_after(TIMEOUT):
        async with on_the_clock(tmp_path, wall, **MAIL) as d, d.connect("alice") as c:
            store = d.harness.runtime.store
            kept = await add_every(c, "1h", new=True)
            carol = await store.create_user("carol", "carol's token")
            await store.create_session("carol.s", profile_id="general", user_id=carol["id"])
            await store.remove_user("carol")
            late = attrs.evolve(
                await d.harness.runtime.scheduler.get(kept["schedule_id"]),
                id="sch-late", user_id=carol["id"], session_id="carol.s",
            )  # fmt: skip
            await store.create_schedule(late)  # as if added while carol was removed
            await at(d, wall, kept["next_due"])
            ran = await c.until_type("schedule_run", schedule_id=kept["schedule_id"])
            assert ran["reason"] == "complete"
            assert [r.id for r in await store.list_schedules()] == [kept["schedule_id"]]
            assert await store.load_messages("carol.s") == []
            assert await store.queued_sessions() == []
            assert len(d.harness.chat_requests) == 1  # alice's run only


async def test_a_scheduled_run_in_a_session_is_headless_and_keeps_its_budget(
    tmp_path: Path,
) -> None:
    wall = Wall()
    term = FakeTerminal()
    replies = [call("terminal", action="run", command="git push"),
               call("terminal", action="run", command="ls"), {"text": "never"}]  # fmt: skip
    policy = {"rules": [ASK_PUSH]}
    with trio.fail_after(TIMEOUT):
        async with on_the_clock(
            tmp_path, wall, replies=replies, tools=toolset(term),
            profiles={"general": with_tools(["terminal"], policy=policy, **NO_PLAN)},
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid = "s-00000000000a"
            await d.harness.runtime.store.create_session(
                sid, profile_id="general", user_id=d.ids["alice"]
            )
            ok = await c.request({"type": "subscribe", "session_id": sid, "last_seq": None})
            assert ok["type"] == "ok"  # alice watches the session: still, nobody is asked
            budget = {"turn": {"tool_calls": 1}}
            row = await add_every(c, session_id=sid, budget=budget)
            assert row["budget"] == budget
            await at(d, wall, row["next_due"])
            done = await c.until_type("schedule_run", schedule_id=row["schedule_id"])
            assert done["session_id"] == sid and done["reason"] == "budget_exhausted"
            assert term.ran == []  # denied by the headless rule (none allows it)
            decided = await c.until_type("approval_decided", session_id=sid)
            assert (decided["by"], decided["approved"]) == ("headless", False)
            assert not [f for f in c.frames if f["type"] == "approval_request"]
            saved = await d.harness.runtime.store.load_messages(sid)
            assert saved[0] == {**saved[0], "role": "user", "content": "check the mail"}


async def test_a_due_time_missed_while_down_runs_once_at_start_up_or_is_skipped(
    tmp_path: Path,
) -> None:
    wall = Wall()
    kw: dict[str, Any] = {"replies": [{"text": "caught up"}], "loop": True,
                          "profiles": {"general": NO_PLAN}}  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with on_the_clock(tmp_path, wall, **kw) as d, d.connect("alice") as c:
            run = await add_every(c, "1h", new=True)
            skip = await add_every(c, "1h", new=True, catch_up=False)
            alice = d.tokens["alice"]
        wall.now += 3 * HOUR + 60  # the daemon is down for three due times
        async with on_the_clock(tmp_path, wall, **kw) as d:
            d.tokens["alice"] = alice
            # The start-up look runs the caught-up due time before any client can connect:
            # its `schedule_run` notice may be over by then (notices are not replayed), so
            # the run is awaited here, and the client connects only after its end, always.
            runtime = d.harness.runtime
            await runtime.scheduler.look_now()  # the start-up look has claimed and queued it
            store = runtime.store
            caught = await store.get_schedule(run["schedule_id"])
            skipped = await store.get_schedule(skip["schedule_id"])
            assert caught is not None and skipped is not None
            assert caught.runs == 1  # three missed due times: one run
            assert caught.next_due == pytest.approx(wall.now + HOUR)
            assert skipped.runs == 0  # moved past now, not run
            assert skipped.next_due == pytest.approx(wall.now + HOUR)
            assert caught.last_session_id is not None
            actor = await runtime.sessions.get(caught.last_session_id)
            await actor.idle.wait()  # (the look started its run: idle is its end)
            async with d.connect("alice") as c:
                history = await c.request(
                    {"type": "sessions", "action": "history", "session_id": actor.session_id}
                )
            said = [(m["role"], m["content"]) for m in history["messages"]]
            assert said == [("user", "check the mail"), ("assistant", "caught up")], said
            assert d.harness.fake is not None and len(d.harness.fake.chat_requests) == 1


async def test_two_daemons_on_one_database_run_a_due_time_once(tmp_path: Path) -> None:
    from navi_trio.core.triggers import ScheduleSpec

    wall = Wall()
    kw: dict[str, Any] = {"replies": [{"text": "once"}], "loop": True,
                          "profiles": {"general": NO_PLAN}, "schedules": True,
                          "wall_clock": wall}  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, **kw) as one, open_harness(tmp_path, **kw) as two:
            user = await one.runtime.store.create_user("carol", "t-carol-123")
            heard = trio.Event()

            async def listen(notices: Any) -> None:
                with notices.subscribe(user["id"]) as frames:
                    async for _ in frames:
                        heard.set()

            async def both_look() -> None:  # at once: the two claims race
                async with trio.open_nursery() as looks:
                    looks.start_soon(one.runtime.scheduler.look_now)
                    looks.start_soon(two.runtime.scheduler.look_now)

            async with trio.open_nursery() as listeners:
                listeners.start_soon(listen, one.runtime.notices)
                listeners.start_soon(listen, two.runtime.notices)
                spec = ScheduleSpec(
                    session_id=None, profile_id=None, kind="every", spec="1h", message="ping"
                )  # fmt: skip
                row = await one.runtime.scheduler.add(user["id"], spec)
                assert row.next_due is not None
                wall.now = row.next_due
                await both_look()
                await heard.wait()
                await both_look()  # both look again, before the next due time
                listeners.cancel_scope.cancel()
            got = await one.runtime.store.get_schedule(row.id)
            assert got is not None and got.runs == 1
            assert one.fake is not None and two.fake is not None
            assert len(one.fake.chat_requests) + len(two.fake.chat_requests) == 1
