"""Background results that wake the agent (issue 23): a profile's wake_on_task_done.

A background job (the gate tool, made backgroundable) ends while its session is idle: a
turn starts with its note, exactly once, also when the daemon restarts in between; while
a turn runs, the note joins that turn at its next LLM call. Wake-ups are bounded per
session per hour. Real parts: the daemon on 127.0.0.1, WebSocket clients, SQLite in
tmp_path, the fake LLM over HTTP. Jobs end when the test opens their gate; every test
has an absolute deadline.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import GateTool, call, system_notes, toolset, with_tools
from api_ws import open_daemon
from test_on_busy import messages_of, send
from test_store_sharing import dead_pid

from navi_trio.core.jobs import RUNNING_SCOPE
from navi_trio.core.jobs.task_notes import HEADER, pending_notes
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import Harness, open_harness

TIMEOUT = 20


class Gate2(GateTool):
    name = "gate2"


def profile(*tools: str, wake: bool = True) -> dict[str, Any]:
    return {"general": with_tools(tools, planning_first_message=False, wake_on_task_done=wake)}


def background(name: str = "gate") -> dict[str, Any]:
    return call(name, background=True)


def notes_in(body: dict[str, Any]) -> list[str]:
    return [n for n in system_notes(body) if n.startswith(HEADER)]


def hand_overs_never_return(h: Harness) -> trio.Event:
    """The runtime's hand-over of a wake-up to its session's actor waits forever (an actor
    starting, a lease; or a daemon that dies there); the event is set once one is tried."""
    tried = trio.Event()

    async def never(session_id: str) -> Any:
        tried.set()
        await trio.sleep_forever()

    h.runtime.sessions.get = never  # type: ignore[method-assign]
    return tried


async def test_a_job_that_ends_while_idle_starts_one_turn_with_its_note(tmp_path: Path) -> None:
    gate = GateTool()
    replies = [background(), {"text": "started it"}, {"text": "the job is done"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate), profiles=profile("gate"),
            backgroundable_tools=("gate",),
        ) as d, d.connect("alice") as c:  # fmt: skip
            fake = d.harness.fake
            assert fake is not None
            ok = await send(c, "start the job")
            sid = ok["session_id"]
            assert (await c.until_end(sid))["text"] == "started it"
            gate.gate.set()
            woken = await c.until_type("woken", session_id=sid)
            assert woken["text"].startswith(HEADER) and "gate opened" in woken["text"]
            end = await c.until_end(sid)
            assert end["text"] == "the job is done" and end["reason"] == "complete"
            (note,) = notes_in(fake.chat_requests[2]["body"])
            assert "completed: gate opened" in note
            actor = d.harness.runtime.sessions.actor(sid)
            assert actor is not None
            await actor.idle.wait()
            # Exactly once: no second turn, nothing queued, the note delivered.
            assert len(fake.chat_requests) == 3
            assert await d.harness.runtime.store.queued_sessions() == []
            assert await pending_notes(d.harness.runtime.store, sid) == []
            hist = await d.harness.runtime.store.load_messages(sid)
            assert [(m["role"], bool(m.get("wake"))) for m in hist][-2:] == [
                ("system", True), ("assistant", False)
            ]  # fmt: skip


async def test_a_job_that_ends_during_a_turn_joins_it_at_its_next_llm_call(
    tmp_path: Path,
) -> None:
    gate, gate2 = GateTool(), Gate2()
    replies = [background(), call("gate2"), {"text": "final, with the result"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate, gate2),
            profiles=profile("gate", "gate2"), backgroundable_tools=("gate",),
        ) as d, d.connect("alice") as c:  # fmt: skip
            fake = d.harness.fake
            assert fake is not None
            ok = await send(c, "work")
            sid = ok["session_id"]
            await gate2.entered.wait()  # the turn runs its second round
            actor = d.harness.runtime.sessions.actor(sid)
            assert actor is not None and actor.running is not None
            control = actor.running
            gate.gate.set()  # the background job ends now
            await c.until(lambda f: f["type"] == "task_update" and f["status"] == "completed")
            gate2.gate.set()
            end = await c.until_end(sid)
            assert end["text"] == "final, with the result"
            assert notes_in(fake.chat_requests[1]["body"]) == []
            (note,) = notes_in(fake.chat_requests[2]["body"])  # in this turn, not a later one
            assert "completed: gate opened" in note
            await control.finished.wait()
            assert control.injections.notes_due is False  # taken in: nothing to wake for
            await actor.idle.wait()
            assert len(fake.chat_requests) == 3 and not messages_of(c, sid, "woken")


async def test_wake_ups_are_bounded_per_session_per_hour(tmp_path: Path) -> None:
    gate, gate2 = GateTool(), Gate2()
    replies = [background(), {"text": "one"}, {"text": "woken once"},
               background("gate2"), {"text": "two"}]  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate, gate2),
            profiles=profile("gate", "gate2"), backgroundable_tools=("gate", "gate2"),
            wake_max_per_hour=1,
        ) as d, d.connect("alice") as c:  # fmt: skip
            ok = await send(c, "first")
            sid = ok["session_id"]
            await c.until_end(sid)
            gate.gate.set()
            assert (await c.until_end(sid))["text"] == "woken once"
            await send(c, "second", session_id=sid)
            assert (await c.until_end(sid))["text"] == "two"
            gate2.gate.set()
            await c.until(
                lambda f: f["type"] == "task_update" and f["status"] == "completed"
                and f["tool"] == "gate2"
            )  # fmt: skip
            actor = d.harness.runtime.sessions.actor(sid)
            assert actor is not None
            await actor.idle.wait()
            store = d.harness.runtime.store
            (waiting,) = await pending_notes(store, sid)  # kept for the next message
            assert waiting["tool"] == "gate2"
            assert len(messages_of(c, sid, "woken")) == 1
            assert await store.queued_sessions() == []


async def test_without_wake_on_task_done_the_note_waits_for_the_next_message(
    tmp_path: Path,
) -> None:
    gate = GateTool()
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=[background(), {"text": "started"}], tools=toolset(gate),
            profiles=profile("gate", wake=False), backgroundable_tools=("gate",),
        ) as d, d.connect("alice") as c:  # fmt: skip
            ok = await send(c, "start")
            sid = ok["session_id"]
            await c.until_end(sid)
            gate.gate.set()
            await c.until(lambda f: f["type"] == "task_update" and f["status"] == "completed")
            (waiting,) = await pending_notes(d.harness.runtime.store, sid)
            assert waiting["status"] == "completed"
            assert await d.harness.runtime.store.queued_sessions() == []
            assert not messages_of(c, sid, "woken")


async def test_a_wake_up_waiting_for_its_sessions_actor_does_not_hold_the_jobs_end(
    tmp_path: Path,
) -> None:
    """The note and the wake-up are committed in the job's shielded bookkeeping; handing
    the wake-up to the session's actor, which may wait (an actor starting, a lease),
    is not: the job ends at once, and a shutdown meanwhile is not held for the
    bookkeeping's deadline (the wake-up stays queued for the next start)."""
    gate = GateTool()
    kw: dict[str, Any] = {
        "tools": toolset(gate),
        "profiles": profile("gate"),
        "backgroundable_tools": ("gate",),
    }
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[background(), {"text": "started"}], **kw) as h:
            await h.turn("s1", "start the job")
            await (await h.session("s1")).idle()  # the run settled: the job's end wakes it
            (job,) = h.runtime.supervisor.list_jobs("s1")
            handed = hand_overs_never_return(h)
            gate.gate.set()
            await handed.wait()
            # Far less than the bookkeeping's 10 s deadline, which held it before.
            with trio.fail_after(5):
                await job.done.wait()
            assert await h.runtime.store.queued_sessions() == ["s1"]


async def test_a_restart_between_the_job_ending_and_the_turn_wakes_exactly_once(
    tmp_path: Path,
) -> None:
    gate = GateTool()
    kw: dict[str, Any] = {"tools": toolset(gate), "profiles": profile("gate"),
                          "backgroundable_tools": ("gate",)}  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[background(), {"text": "started"}], **kw) as h:
            await h.turn("s1", "start the job")
            # The daemon "dies" right after the note and its wake-up were committed:
            # the waker never reaches the session's actor.
            queued = hand_overs_never_return(h)
            gate.gate.set()
            await queued.wait()
            assert await h.runtime.store.queued_sessions() == ["s1"]
        # The next start runs the wake-up: one turn, with the note.
        async with open_harness(tmp_path, replies=[{"text": "woken after the restart"}], **kw) as h:
            h.runtime.sessions.adopt = True
            driver = await h.session("s1")
            assert await h.runtime.sessions.resume_queued() == 1
            frames = await driver.until_end()
            assert [f["type"] for f in frames if f["type"] in ("woken", "stream_end")] == [
                "woken", "stream_end"
            ]  # fmt: skip
            assert frames[-1]["text"] == "woken after the restart"
            assert h.fake is not None
            (note,) = notes_in(h.fake.chat_requests[0]["body"])
            assert "completed: gate opened" in note
            await driver.idle()
        # And never again.
        async with open_harness(tmp_path, replies=[{"text": "never"}], **kw) as h:
            h.runtime.sessions.adopt = True
            assert await h.runtime.sessions.resume_queued() == 0
            assert h.fake is not None and h.fake.chat_requests == []
            texts = [m.get("content") for m in await h.runtime.store.load_messages("s1")]
            assert texts.count("woken after the restart") == 1


@pytest.mark.slow
async def test_a_job_lost_with_its_daemon_wakes_its_session_too(tmp_path: Path) -> None:
    """A daemon died with a background job running in a session that wakes on finished
    jobs: the next start reports the job lost, as a note, and that note wakes the
    session as a finished job's would (once, with the note)."""
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        await store.create_session("s1", profile_id="general")
        marker = {"session_id": "s1", "task_id": "bt-gone", "tool": "terminal",
                  "args_summary": "make test", "is_spawn": False, "pid": dead_pid(),
                  "host": socket.gethostname()}  # fmt: skip
        await store.kv_set(RUNNING_SCOPE, "s1:bt-gone", marker)
    replies = [{"text": "the build job was lost; starting it again"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=profile()) as h:
            h.runtime.sessions.adopt = True  # as the daemon does at start-up
            driver = await h.session("s1")
            assert await h.runtime.sessions.resume_queued() == 1
            frames = await driver.until_end()
            (woken,) = [f for f in frames if f["type"] == "woken"]
            assert "bt-gone" in woken["text"] and "make test" in woken["text"], woken
            assert frames[-1]["text"] == "the build job was lost; starting it again"
            assert h.fake is not None
            (note,) = notes_in(h.fake.chat_requests[0]["body"])
            assert "bt-gone" in note
            await driver.idle()
            assert await h.runtime.store.kv_list(RUNNING_SCOPE) == []
            assert await h.runtime.store.queued_sessions() == []
