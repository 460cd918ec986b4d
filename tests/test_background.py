"""Background interception end to end (issue 4, "Background interception"): a call with
``"background": true`` to a backgroundable tool is detached by the ToolExecutor — flag
stripped, job submitted, synthetic result at once — from the top-level loop and from
sub-agents; other tools (and ``terminal open``) keep running inline; the job has its own
context, its own event sink (its ring) and never writes session history.

Rules: real HTTP to the fake LLM on 127.0.0.1 (port 0) through `open_harness`, a real
SQLite file under tmp_path, real time (the store works on a thread), every test under
an absolute `fail_after`; nothing sleeps: tests wait on the test tools' events and on
the jobs' `done` events. The "block" test tool is added to `backgroundable_tools`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from bg_tools import BACKGROUNDABLE, Kit, call, calls, make_kit, of_type, profile

from navi_trio.core.jobs import Job
from navi_trio.core.jobs.task_notes import pending_notes
from navi_trio.core.jobs.task_supervisor import SPAWN_RING_SIZE
from navi_trio.core.turn.tool_executor import BACKGROUND_HINT
from navi_trio.events import SubagentStarted, ToolEvent, ToolStarted, WarningEvent
from navi_trio.settings import DEFAULT_BACKGROUNDABLE
from navi_trio.testing import Harness, open_harness
from navi_trio.testing.harness import replay_buffer
from navi_trio.tools.services import SpawnRequest

TIMEOUT = 30

PROFILES: dict[str, dict[str, Any]] = {
    "bg": profile(["block", "snapshot", "terminal", "spawn_agent", "tasks"], ["block", "snapshot"]),
    # One iteration: the parent asks the model once, so a background sub-agent's
    # requests are the only ones the fake LLM sees afterwards (its script is global).
    "bg1": profile(["spawn_agent", "tasks"], ["block", "snapshot"], max_iterations=1),
}


def harness(tmp_path: Path, kit: Kit, replies: list[dict[str, Any]], **settings: Any) -> Any:
    settings.setdefault("backgroundable_tools", BACKGROUNDABLE)
    return open_harness(tmp_path, replies=replies, profiles=PROFILES, tools=kit.tools(), **settings)


def only_job(h: Harness, session_id: str) -> Job:
    jobs = h.runtime.supervisor.list_jobs(session_id)
    assert len(jobs) == 1, jobs
    job: Job = jobs[0]
    return job


def test_the_default_backgroundable_tools_are_the_specs() -> None:
    assert DEFAULT_BACKGROUNDABLE == ("terminal", "ssh_exec", "peer", "spawn_agent", "code_exec")


async def test_background_call_is_detached_with_a_synthetic_result_at_once(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    replies = [
        calls(call("block", label="j", extra="x", background=True)),
        {"text": "started it"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            # The turn ends while the tool is still blocked: the result came at once.
            frames = await h.turn("s1", "hi", profile_id="bg")
            assert frames[-1]["text"] == "started it"
            assert kit.block.finished == [] and kit.block.cancelled == []
            job = only_job(h, "s1")
            assert (job.tool, job.status) == ("block", "running")
            (result,) = of_type(frames, "tool_result", name="block")
            assert result["ok"] is True
            payload = json.loads(result["output"])
            assert payload == {
                "task_id": job.task_id,
                "tool": "block",
                "status": "running",
                "args_summary": job.args_summary,
                "hint": BACKGROUND_HINT,
            }
            assert payload["task_id"].startswith("bt-") and len(payload["task_id"]) == 11
            assert json.loads(job.args_summary) == {"label": "j", "extra": "x"}
            # The model got the synthetic result as the tool message.
            tool_msgs = [m for m in h.chat_requests[1]["messages"] if m["role"] == "tool"]
            assert [m["content"] for m in tool_msgs] == [result["output"]]
            # The flag was stripped before the tool ran.
            await kit.block.wait_started()
            assert kit.block.calls[0].args == {"label": "j", "extra": "x"}
            kit.block.release("j")
            await job.done.wait()
            assert job.status == "completed"
            assert job.result is not None and job.result.output == "block j released"


async def test_job_has_its_own_context_and_sink_and_never_writes_history(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    replies = [calls(call("block", label="j", background=True)), {"text": "ok"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="bg")
            (started,) = of_type(frames, "tool_started", name="block")
            job = only_job(h, "s1")
            store = h.runtime.store
            messages = await store.load_messages("s1")
            context = await store.load_context("s1")
            await kit.block.wait_started()
            ctx = kit.block.calls[0].ctx
            assert (ctx.session_id, ctx.call_id) == ("s1", started["call_id"])
            # The foreground run is over; the job speaks now, into its own ring.
            kit.block.release("j")
            await job.done.wait()
            assert job.status == "completed"
            ring = list(job.ring)
            assert (
                ToolEvent(
                    call_id=started["call_id"],
                    name="block",
                    data={"phase": "released", "label": "j"},
                )
                in ring
            )
            assert WarningEvent(message="j says goodbye", code="block") in ring
            actor = h.runtime.sessions.actor("s1")
            assert actor is not None
            replayed = list(replay_buffer(actor))
            assert not of_type(replayed, "warning") and not of_type(replayed, "tool_event")
            # Nothing of the job reached the session's history or context.
            assert await store.load_messages("s1") == messages
            assert await store.load_context("s1") == context


async def test_tools_outside_the_list_run_inline_even_with_the_flag(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [calls(call("snapshot", label="s", background=True)), {"text": "ok"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="bg")
            (result,) = of_type(frames, "tool_result", name="snapshot")
            assert result["ok"] is True and "task_id" not in result["output"]
            assert json.loads(result["output"])["session_id"] == "s1"
            assert len(kit.snapshot.records) == 1  # it ran, inside the turn
            assert h.runtime.supervisor.list_jobs("s1") == []


async def test_backgroundable_is_what_the_settings_list_says(tmp_path: Path) -> None:
    # With the default list "block" is not backgroundable: the flag is ignored and the
    # call runs inline (the turn waits for it).
    kit = make_kit()
    replies = [calls(call("block", label="inline", background=True)), {"text": "ok"}]
    with trio.fail_after(TIMEOUT):
        async with harness(
            tmp_path, kit, replies, backgroundable_tools=DEFAULT_BACKGROUNDABLE
        ) as h:
            s = await h.session("s1")
            s.send("hi", profile_id="bg")
            await kit.block.wait_started()
            assert h.runtime.supervisor.list_jobs("s1") == []
            assert kit.block.calls[0].args == {"label": "inline"}
            kit.block.release("inline")
            frames = await s.until_end()
            (result,) = of_type(frames, "tool_result", name="block")
            assert result["output"] == "block inline released"


@pytest.mark.slow
async def test_terminal_open_keeps_its_own_meaning_of_background(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        calls(call("terminal", action="open", command="sleep 30", background=True)),
        {"text": "ok"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="bg")
            (result,) = of_type(frames, "tool_result", name="terminal")
            assert result["ok"] is True, result
            assert "task_id" not in result["output"]
            assert h.runtime.supervisor.list_jobs("s1") == []
            # A persistent process of the session, not a background job.
            assert len(h.runtime.processes.list("s1")) == 1


async def test_backgroundable_tools_offer_the_background_flag_to_the_model(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, [{"text": "ok"}]) as h:
            await h.turn("s1", "hi", profile_id="bg")
            tools = {t["function"]["name"]: t["function"] for t in h.chat_requests[0]["tools"]}
            assert "background" in tools["terminal"]["parameters"]["properties"]
            assert "background" in tools["block"]["parameters"]["properties"]
            assert "background" not in tools["tasks"]["parameters"]["properties"]
            # The tool's own schema is not changed by it.
            terminal = h.runtime.registry.get("terminal")
            assert terminal is not None
            assert "background" not in terminal.parameters["properties"]


@pytest.mark.slow
async def test_only_terminal_run_is_detached_not_its_other_actions(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        calls(call("terminal", action="list", background=True)),
        calls(call("terminal", action="run", command="echo hi", background=True)),
        {"text": "ok"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="bg")
            listed, ran = of_type(frames, "tool_result", name="terminal")
            assert "task_id" not in listed["output"]  # answered inline
            assert json.loads(ran["output"])["status"] == "running"
            (job,) = h.runtime.supervisor.list_jobs("s1")
            assert job.args_summary and '"action": "run"' in job.args_summary


async def test_a_subagent_without_a_session_cannot_detach(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [calls(call("block", background=True)), {"text": "did it inline"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            text, ok = await h.runtime.agent.run_ephemeral(SpawnRequest(task="go", profile_id="bg"))
            assert (text, ok) == ("did it inline", True)
            assert h.runtime.supervisor.running_count() == 0
            request = h.chat_requests[1]["messages"]
            refused = [m for m in request if m.get("role") == "tool"]
            assert "Cannot run in background" in refused[0]["content"]


async def test_background_calls_from_a_subagent_are_detached_the_same_way(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    replies = [
        calls(call("spawn_agent", task="Start the long job")),
        calls(call("block", label="sub", background=True)),
        {"text": "the job runs"},
        {"text": "done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="bg")
            (result,) = of_type(frames, "tool_result", name="block")
            assert result["is_subagent"] is True
            payload = json.loads(result["output"])
            # The job belongs to the parent session: its tasks tool and notes see it.
            job = only_job(h, "s1")
            assert payload["task_id"] == job.task_id and payload["status"] == "running"
            await kit.block.wait_started()
            call_seen = kit.block.calls[0]
            assert call_seen.args == {"label": "sub"}
            assert call_seen.ctx.is_subagent is True and call_seen.ctx.session_id == "s1"
            kit.block.release("sub")
            await job.done.wait()
            notes = await pending_notes(h.runtime.store, "s1")
            assert [(n["task_id"], n["status"]) for n in notes] == [(job.task_id, "completed")]


async def test_background_spawn_agent_streams_into_its_ring_not_the_parent(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    replies = [
        calls(call("spawn_agent", task="Dig in the background", background=True)),
        calls(call("block", label="deep")),  # the background sub-agent's first answer
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="bg1")
            job = only_job(h, "s1")
            assert job.is_spawn and job.tool == "spawn_agent"
            assert job.ring.maxlen == SPAWN_RING_SIZE == 200  # a deeper ring for spawns
            await kit.block.wait_started()
            ring = list(job.ring)
            assert any(isinstance(e, SubagentStarted) for e in ring)
            assert any(isinstance(e, ToolStarted) and e.name == "block" for e in ring)
            assert all(e.is_subagent for e in ring)
            # The sub-agent's live events stay out of the parent's stream.
            actor = h.runtime.sessions.actor("s1")
            assert actor is not None
            assert not [f for f in replay_buffer(actor) if f["is_subagent"]]
            assert not [f for f in frames if f["is_subagent"]]
            # tasks check shows the live progress while it still runs.
            h.add_replies(calls(call("tasks", action="check", task_id=job.task_id)))
            check_frames = await h.turn("s1", "how is it going?")
            (check,) = of_type(check_frames, "tool_result", name="tasks")
            assert f"task {job.task_id} (spawn_agent): running" in check["output"]
            assert "tool_started" in check["output"] and "block" in check["output"]
            # The script is one global queue: the sub-agent's last answer goes in now.
            h.add_replies({"text": "background report"})
            kit.block.release("deep")
            await job.done.wait()
            assert job.status == "completed"
            assert job.result is not None and job.result.output == "background report"
            assert job.tokens > 0
            (note,) = await pending_notes(h.runtime.store, "s1")
            assert note["tokens"] == job.tokens


async def test_a_refused_submit_is_a_failed_result_naming_the_cap(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        calls(
            call("block", label="one", background=True),
            call("block", label="two", background=True),
        ),
        {"text": "ok"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies, tasks_max_per_session=1) as h:
            frames = await h.turn("s1", "hi", profile_id="bg")
            first, second = of_type(frames, "tool_result", name="block")
            assert first["ok"] is True and json.loads(first["output"])["status"] == "running"
            assert second["ok"] is False
            assert second["error"].startswith("Cannot run in background: ")
            assert "tasks_max_per_session" in second["error"]
            assert len(h.runtime.supervisor.list_jobs("s1")) == 1


async def test_a_job_runs_with_the_run_variables_of_the_call_that_started_it(
    tmp_path: Path,
) -> None:
    # The job lives in the supervisor's nursery, not the run's, yet it must see the
    # session, model, cwd and user of the turn that started it, as an inline call does.
    kit = make_kit()
    replies = [
        calls(call("snapshot", label="inline")),
        calls(call("snapshot", label="job", background=True)),
        {"text": "ok"},
    ]
    cwd = tmp_path / "work"
    cwd.mkdir()
    with trio.fail_after(TIMEOUT):
        async with harness(
            tmp_path, kit, replies, backgroundable_tools=(*BACKGROUNDABLE, "snapshot")
        ) as h:
            alice = await h.user("alice")
            await h.turn("s1", "hi", profile_id="bg", cwd=cwd, user_id=alice)
            job = only_job(h, "s1")
            await job.done.wait()
            (inline,) = kit.snapshot.by_label("inline")
            (in_job,) = kit.snapshot.by_label("job")
            assert inline["vars"]["working_directory"] == cwd
            assert inline["vars"]["user_id"] == alice
            assert in_job["vars"] == inline["vars"]
            assert in_job["cwd"] == cwd


async def test_a_background_subagent_works_in_the_parents_cwd(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        calls(call("spawn_agent", task="Look around", background=True)),
        calls(call("snapshot", label="sub")),
        {"text": "looked"},
    ]
    cwd = tmp_path / "work"
    cwd.mkdir()
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            alice = await h.user("alice")
            await h.turn("s1", "hi", profile_id="bg1", cwd=cwd, user_id=alice)
            job = only_job(h, "s1")
            await job.done.wait()
            assert job.status == "completed", job.error
            (sub,) = kit.snapshot.by_label("sub")
            assert sub["is_subagent"] is True and sub["session_id"] == "s1"
            assert sub["cwd"] == cwd
            assert sub["vars"]["working_directory"] == cwd
            assert sub["vars"]["user_id"] == alice
