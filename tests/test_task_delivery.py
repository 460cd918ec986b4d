"""Delivery of background results end to end (issue 4, "Delivery"): task_update frames
to every connected client (out-of-band), completion notes drained into the next turn's
context as one persisted system message, notes surviving a restart (and lost jobs
reported, not forgotten), the tasks tool scoped to its session, and Stop leaving
background jobs alone while `tasks cancel` ends them.

Rules: real HTTP to the fake LLM on 127.0.0.1 (port 0) through `open_harness`, a real
SQLite file under tmp_path (the restart test opens a second runtime on the same file),
real time, every test under an absolute `fail_after`; nothing sleeps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from bg_tools import BACKGROUNDABLE, Kit, call, calls, make_kit, of_type, profile, system_texts

from navi_trio.core.jobs import NOTES_SCOPE, Job
from navi_trio.core.jobs.task_notes import FOOTER, HEADER, pending_notes
from navi_trio.core.jobs.task_supervisor import LOST_SUMMARY
from navi_trio.testing import Harness, SessionDriver, open_harness

TIMEOUT = 30

PROFILES: dict[str, dict[str, Any]] = {
    "general": profile(["block", "tasks", "snapshot"]),
}


def harness(tmp_path: Path, kit: Kit, replies: list[dict[str, Any]], **settings: Any) -> Any:
    return open_harness(
        tmp_path,
        replies=replies,
        profiles=PROFILES,
        tools=kit.tools(),
        backgroundable_tools=BACKGROUNDABLE,
        **settings,
    )


def bg(label: str) -> dict[str, Any]:
    return call("block", label=label, background=True)


def jobs_by_label(h: Harness, kit: Kit, session_id: str) -> dict[str, Job]:
    """The session's jobs keyed by the label their block call got."""
    jobs = h.runtime.supervisor.list_jobs(session_id)
    return {json.loads(job.args_summary)["label"]: job for job in jobs}


def nothing_waiting(driver: SessionDriver) -> bool:
    try:
        driver.subscription.frames.receive_nowait()
    except trio.WouldBlock:
        return True
    return False


async def test_task_update_reaches_every_client_out_of_band(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [calls(bg("j")), {"text": "started"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            one, two = await h.session("s1"), await h.session("s1")
            other = await h.session("s2")
            one.send("hi")
            ends = [await d.until_end() for d in (one, two)]
            for frames in ends:
                (running,) = of_type(frames, "task_update")
                assert (running["status"], running["tool"], running["seq"]) == (
                    "running",
                    "block",
                    None,
                )
            task_id = running["task_id"]
            kit.block.release("j")
            for d in (one, two):
                (done,) = of_type(await d.until_type("task_update"), "task_update")
                assert (done["task_id"], done["status"], done["seq"]) == (
                    task_id,
                    "completed",
                    None,
                )
                assert done["result_excerpt"] == "block j released"
            # Another session's client hears nothing of it.
            assert nothing_waiting(other)
            # Out-of-band: a client that resubscribes from seq 0 gets no task_update ...
            actor = h.runtime.sessions.actor("s1")
            assert actor is not None
            with actor.subscribe(last_seq=0) as again:
                replayed = []
                while True:
                    try:
                        replayed.append(again.frames.receive_nowait())
                    except trio.WouldBlock:
                        break
            assert replayed and replayed[-1]["type"] == "stream_end"
            assert not of_type(replayed, "task_update")
            # ... and resyncs through the tasks list instead.
            h.add_replies(calls(call("tasks", action="list")), {"text": "ok"})
            frames = await h.turn("s1", "what runs?")
            (listing,) = of_type(frames, "tool_result", name="tasks")
            assert f"{task_id} (block) completed" in listing["output"]


async def test_completion_notes_become_one_persisted_system_message(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [calls(bg("a"), bg("b")), {"text": "both started"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            await h.turn("s1", "hi")
            jobs = jobs_by_label(h, kit, "s1")
            kit.block.release("a")
            await jobs["a"].done.wait()
            kit.block.release("b")
            await jobs["b"].done.wait()
            store = h.runtime.store
            assert len(await pending_notes(store, "s1")) == 2
            h.add_replies({"text": "I see the results"}, {"text": "still here"})
            await h.turn("s1", "any news?")
            expected = "\n".join(
                [
                    HEADER,
                    f"- {jobs['a'].task_id} (block) completed: block a released",
                    f"- {jobs['b'].task_id} (block) completed: block b released",
                    FOOTER,
                ]
            )
            request = h.chat_requests[-1]
            assert system_texts(request).count(expected) == 1
            # It comes before the user message of the turn that drained it.
            texts = [m["content"] for m in request["messages"]]
            assert texts.index(expected) < texts.index("any news?")
            # Drained: nothing pending; persisted once in the context, never displayed.
            assert await pending_notes(store, "s1") == []
            assert await store.kv_list(NOTES_SCOPE) == []
            context = await store.load_context("s1")
            notes = [m for m in context if m.get("task_notes")]
            assert len(notes) == 1
            assert (notes[0]["role"], notes[0]["content"], notes[0]["keep"]) == (
                "system",
                expected,
                True,
            )
            messages = await store.load_messages("s1")
            assert not [m for m in messages if HEADER in m["content"]]
            # The next turn still sends it (persisted), and adds no second one.
            await h.turn("s1", "and now?")
            assert system_texts(h.chat_requests[-1]).count(expected) == 1
            context = await store.load_context("s1")
            assert len([m for m in context if m.get("task_notes")]) == 1


async def test_notes_survive_a_restart_and_lost_jobs_are_reported(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [calls(bg("finished"), bg("lost")), {"text": "both started"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            await h.turn("s1", "hi")
            jobs = jobs_by_label(h, kit, "s1")
            kit.block.release("finished")
            await jobs["finished"].done.wait()
            finished_id, lost_id = jobs["finished"].task_id, jobs["lost"].task_id
            lost_args = jobs["lost"].args_summary
        # Leaving the runtime is the daemon stopping: the running job dies with it.
        assert kit.block.cancelled == ["lost"]

        kit2 = make_kit()
        async with harness(tmp_path, kit2, [{"text": "noted"}]) as h2:
            assert h2.runtime.supervisor.list_jobs("s1") == []  # jobs do not survive
            await h2.turn("s1", "what happened while I was away?")
            notes = [t for t in system_texts(h2.chat_requests[0]) if t.startswith(HEADER)]
            assert len(notes) == 1
            lines = notes[0].splitlines()
            assert lines[0] == HEADER and lines[-1] == FOOTER.splitlines()[-1]
            assert f"- {finished_id} (block) completed: block finished released" in lines
            assert f"- {lost_id} (block) failed: {LOST_SUMMARY} {lost_args}" in lines
            assert await pending_notes(h2.runtime.store, "s1") == []


async def test_tasks_tool_is_scoped_to_its_session(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [calls(bg("mine")), {"text": "started"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            await h.turn("s-a", "hi")
            (job,) = h.runtime.supervisor.list_jobs("s-a")
            tid = job.task_id
            h.add_replies(
                calls(
                    call("tasks", action="list"),
                    call("tasks", action="check", task_id=tid),
                    call("tasks", action="wait", task_id=tid, timeout=5),
                    call("tasks", action="cancel", task_id=tid),
                ),
                {"text": "nothing for me"},
            )
            frames = await h.turn("s-b", "hi")
            listing, check, wait, cancel = of_type(frames, "tool_result", name="tasks")
            assert listing["ok"] is True and tid not in listing["output"]
            assert "No background tasks" in listing["output"]
            for result in (check, wait, cancel):
                assert result["ok"] is False
                assert result["error"] == (
                    f"no task {tid} in this session (call tasks list to see its tasks)"
                )
            assert job.status == "running" and kit.block.cancelled == []
            # Its own session sees it and can cancel it.
            h.add_replies(
                calls(call("tasks", action="check", task_id=tid)),
                calls(call("tasks", action="cancel", task_id=tid)),
                {"text": "cancelled"},
            )
            frames = await h.turn("s-a", "cancel it")
            check, cancel = of_type(frames, "tool_result", name="tasks")
            assert f"task {tid} (block): running" in check["output"]
            assert cancel["ok"] is True and f"task {tid} (block) cancelled" in cancel["output"]
            assert kit.block.cancelled == ["mine"]


async def test_stop_leaves_background_jobs_running_only_tasks_cancel_ends_them(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    # The job starts, then the model stalls mid-answer and the user presses Stop.
    replies = [calls(bg("survivor")), {"text": "thinking about", "stall": True}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            assert h.fake is not None
            s = await h.session("s1")
            s.send("hi")
            await h.fake.wait_requests(2)
            await s.until_type("text_delta")
            assert s.stop() is True
            frames = await s.until_end()
            assert frames[-1]["reason"] == "stopped"
            (job,) = h.runtime.supervisor.list_jobs("s1")
            assert job.status == "running" and not job.done.is_set()
            assert kit.block.cancelled == []
            # A later Stop with no run active changes nothing either.
            await s.idle()
            assert s.stop() is False
            assert job.status == "running"
            # tasks cancel does end it, and every client hears the final state.
            h.add_replies(
                calls(call("tasks", action="cancel", task_id=job.task_id)), {"text": "cancelled it"}
            )
            s.send("cancel the job")
            frames = await s.until_end()
            (result,) = of_type(frames, "tool_result", name="tasks")
            assert result["ok"] is True, result
            assert job.status == "cancelled" and kit.block.cancelled == ["survivor"]
            (update,) = of_type(frames, "task_update")
            assert (update["task_id"], update["status"]) == (job.task_id, "cancelled")


async def test_notes_stay_pending_until_the_turn_that_carries_them_is_saved(
    tmp_path: Path,
) -> None:
    from navi_trio.core.jobs import JobNote, record_note

    kit = make_kit()
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, [{"text": "seen"}]) as h:
            rt = h.runtime
            await rt.store.create_session("s1", profile_id="general")
            await record_note(
                rt.store,
                rt.settings,
                "s1",
                JobNote(
                    task_id="bt-00000001", tool="terminal", status="completed", summary="PASS 3/3"
                ),
            )
            real_save = rt.agent.cache.save

            async def failing_save(state: Any) -> None:
                raise OSError("disk full")

            rt.agent.cache.save = failing_save
            frames = await h.turn("s1", "hi")
            assert of_type(frames, "error")[0]["code"] == "internal"
            # The save failed: the note is still pending, not lost.
            assert [n["task_id"] for n in await pending_notes(rt.store, "s1")] == ["bt-00000001"]

            rt.agent.cache.save = real_save
            rt.agent.cache.forget("s1")  # what the failed turn left in memory is gone
            frames = await h.turn("s1", "hi")
            assert frames[-1]["text"] == "seen"
            assert await pending_notes(rt.store, "s1") == []
            context = await rt.store.load_context("s1")
            notes = [m for m in context if m.get("task_notes")]
            assert len(notes) == 1 and "bt-00000001" in notes[0]["content"]
