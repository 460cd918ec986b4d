"""The core after its untangling (issue 7): what the turn, its sub-agents and its
background jobs own, and the loop behaviours no other test pinned down.

- a synchronous sub-agent's tokens count in the parent turn; a background one's do not;
- a sub-agent whose backend fails ends its parent's turn with that error; one that
  fails on its own request or answer says so in its failed result (not "iteration or
  time limit"); a background one's failure is its job's;
- a sub-agent runs in a child task: a ContextVar its tools set stays there;
- a background job keeps no finished run alive (no Turn, no history, no channel);
- `Agent.run()`; hot reload of persona and prompt files end to end; the clamp of
  spawn_agent's timeout to NAVI_SPAWN_TIMEOUT_SEC (MockClock);
- a ``done_reason: length`` answer is marked in history; Stop during thinking keeps the
  thinking; a status-only todo change is progress; shutdown while the user message is
  being saved still saves it.

Rules: real HTTP to the fake LLM on 127.0.0.1 (port 0) through `open_harness`, a real
SQLite file under tmp_path; every wait is on an event, never on a clock. Tests on the
real clock run under an absolute `fail_after`; the clamp test uses a MockClock without
autojump (time moves only when the test jumps it, so the store's thread cannot race a
deadline).
"""

from __future__ import annotations

import contextvars
import gc
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import assert_paired, seed
from bg_tools import BACKGROUNDABLE, Kit, call, calls, make_kit, of_type, profile
from realtime import paced

from navi_trio.core.turn.turn_state import Turn
from navi_trio.profiles import ConfigSource
from navi_trio.settings import REPO_ROOT
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import open_harness
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.todo import TodoTool

TIMEOUT = 30

PROFILES: dict[str, dict[str, Any]] = {
    "pa": profile(
        ["spawn_agent", "snapshot", "leak", "block"], ["snapshot", "leak"], model="model-pa"
    ),
    # One iteration: the parent asks the model once, so a background sub-agent's
    # requests are the only ones the fake LLM sees afterwards (its script is global).
    "bg1": profile(["spawn_agent", "block"], ["snapshot"], max_iterations=1),
}

MARK: contextvars.ContextVar[str] = contextvars.ContextVar("test_mark", default="parent")


class LeakTool:
    """Sets a ContextVar and never resets it: where it runs, the value stays."""

    name = "leak"
    description = "sets a context variable"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.seen.append(MARK.get())
        if "set" in args:
            MARK.set(str(args["set"]))
        return ToolResult.success(MARK.get())


def harness(tmp_path: Path, kit: Kit, replies: list[dict[str, Any]], **settings: Any) -> Any:
    settings.setdefault("backgroundable_tools", BACKGROUNDABLE)
    return open_harness(
        tmp_path,
        replies=replies,
        profiles=PROFILES,
        tools=[*kit.tools(), LeakTool()],
        **settings,
    )


def spawn(**arguments: Any) -> dict[str, Any]:
    return calls(call("spawn_agent", **arguments))


def usage(prompt: int, completion: int, **reply: Any) -> dict[str, Any]:
    return {**reply, "prompt_tokens": prompt, "completion_tokens": completion}


# --- item 17: whose tokens --------------------------------------------------------------


# The parent detaches a sub-agent, then blocks in a foreground call until released.
DETACH_THEN_BLOCK = calls(
    call("spawn_agent", task="Dig in the background", background=True),
    call("block", label="parent"),
)


async def _background_subagent(h: Any, kit: Kit) -> tuple[Any, Any]:
    """Start DETACH_THEN_BLOCK's turn in bg1; (its session driver, its job, finished)."""
    s = await h.session("s1")
    s.send("hi", profile_id="bg1")
    await kit.block.wait_started()
    (job,) = h.runtime.supervisor.list_jobs("s1")
    await job.done.wait()
    return s, job


async def test_a_synchronous_subagents_tokens_count_in_the_parent_turn(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        usage(100, 50, **spawn(task="Dig")),
        usage(5000, 2, text="the sub-agent's report"),
        usage(200, 30, text="done"),
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="pa")
            (finished,) = of_type(frames, "subagent_finished")
            assert finished["tokens"] == 5002
            (result,) = of_type(frames, "tool_result", name="spawn_agent")
            assert result["ok"] is True
            end = frames[-1]
            assert (end["prompt_tokens"], end["completion_tokens"]) == (5300, 82)


async def test_a_background_subagents_tokens_stay_out_of_the_parent_turn(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    # The parent's turn is still open while the sub-agent spends its tokens, so a leak
    # would show.
    replies = [usage(100, 50, **DETACH_THEN_BLOCK), usage(5000, 2, text="the report")]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            s, job = await _background_subagent(h, kit)
            assert job.status == "completed" and job.tokens == 5002
            kit.block.release("parent")
            end = (await s.until_end())[-1]
            assert (end["prompt_tokens"], end["completion_tokens"]) == (100, 50)


# --- item 18: what really happened -------------------------------------------------------


# A sub-agent's LLM call that fails: (its reply, the error code, words of the message).
BACKEND_FAILURES = [
    pytest.param({"status": 500, "error_body": "the sub model crashed"}, "llm_status",
                 "the sub model crashed", id="5xx"),
    pytest.param({"text": "two words", "drop_after": 1}, "llm_connection", "dropped",
                 id="dropped"),
    pytest.param({"text": "half", "error_line": "the runner stopped"}, "llm_error",
                 "the runner stopped", id="error-in-stream"),
]  # fmt: skip
NOT_FINISHED = "not finished: the turn ended on an LLM error"


async def _ends_on_the_subagents_error(
    h: Any, kit: Kit, code: str, words: str
) -> list[dict[str, Any]]:
    """The turn of `spawn_agent` + `snapshot` whose sub-agent met a backend failure."""
    frames: list[dict[str, Any]] = await h.turn("s1", "hi", profile_id="pa")
    assert frames[-1]["reason"] == "error"
    (error,) = [f for f in of_type(frames, "error") if not f["is_subagent"]]
    assert error["code"] == code and words in error["message"], error
    assert len(h.chat_requests) == 2  # the parent never asked the model again
    assert kit.snapshot.records == []  # the call after the spawn never ran
    results = {r["name"]: r for r in of_type(frames, "tool_result")}
    for name in ("spawn_agent", "snapshot"):
        assert results[name]["ok"] is False and results[name]["stopped"] is True
        assert results[name]["error"].startswith(NOT_FINISHED)
    (finished,) = of_type(frames, "subagent_finished")
    assert finished["completed"] is False
    assert_paired(await h.runtime.store.load_context("s1"))
    return frames


@pytest.mark.parametrize(("reply", "code", "words"), BACKEND_FAILURES)
async def test_a_subagents_backend_failure_ends_the_turn_with_its_error(
    tmp_path: Path, reply: dict[str, Any], code: str, words: str
) -> None:
    """agent-loop spec: "backend-level LLM errors still abort the turn". A sub-agent's
    backend failing (a 5xx, a dropped connection, an error in the stream) ends its
    parent's turn with that error, as the parent's own call would; the calls not
    finished are paired, and the model is not asked again."""
    kit = make_kit()
    replies = [
        calls(call("spawn_agent", task="Dig"), call("snapshot", label="after")),
        reply,
        {"text": "never asked for"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            await _ends_on_the_subagents_error(h, kit, code, words)


async def test_a_subagents_silent_backend_ends_the_turn_too(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """agent-loop spec: "backend-level LLM errors still abort the turn": a backend
    silent past the first-chunk timeout is one.

    The clock is paced (tests/realtime.py): on a threshold of 0 it ran from lease
    renewal to lease renewal while the sub-agent's start worked on threads, and now and
    then reached the sub-agent's own time limit (300 s) before it had asked its model:
    a timed-out spawn_agent, which is not a backend's failure. That limit is far here
    too: it is not what this test is about."""
    kit = make_kit()
    replies = [
        calls(call("spawn_agent", task="Dig"), call("snapshot", label="after")),
        {"text": "never arrives", "delay_first": 3600},
        {"text": "never asked for"},
    ]
    async with (
        paced(autojump_clock, TIMEOUT),
        harness(tmp_path, kit, replies, first_chunk_timeout=10, spawn_timeout_sec=1e5) as h,
    ):
        await _ends_on_the_subagents_error(h, kit, "llm_timeout", "first chunk")


REQUEST_FAILURES = [
    pytest.param({"status": 404, "error_body": "model 'model-pa' not found"},
                 "model 'model-pa' not found", id="4xx"),
    pytest.param({"text": "word " * 40}, "NAVI_ANSWER_MAX_CHARS", id="answer-too-long"),
    pytest.param({"empty_body": True}, "empty body", id="prompt-over-the-window"),
]  # fmt: skip


@pytest.mark.parametrize(("reply", "words"), REQUEST_FAILURES)
async def test_a_subagents_other_llm_failure_is_its_calls_failed_result(
    tmp_path: Path, reply: dict[str, Any], words: str
) -> None:
    """A sub-agent whose own request or answer failed (the server refused it, the
    answer ran too long, its prompt outgrew the server's window) is a failed
    spawn_agent result that says so, and the turn goes on."""
    kit = make_kit()
    replies = [spawn(task="Dig"), reply, {"text": "noted"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies, answer_max_chars=100) as h:
            frames = await h.turn("s1", "hi", profile_id="pa")
            assert (frames[-1]["reason"], frames[-1]["text"]) == ("complete", "noted")
            assert [f for f in of_type(frames, "error") if not f["is_subagent"]] == []
            (result,) = of_type(frames, "tool_result", name="spawn_agent")
            assert result["ok"] is False
            error = result["error"]
            assert "LLM call failed" in error and words in error, error
            assert "iteration limit" not in error and "time limit" not in error
            (finished,) = of_type(frames, "subagent_finished")
            assert finished["completed"] is False


async def test_a_background_subagents_backend_failure_is_its_jobs_failure(
    tmp_path: Path,
) -> None:
    """A background sub-agent has no turn to end: its backend's failure fails its job
    (the job says why), and the turn that started it goes on."""
    kit = make_kit()
    replies = [DETACH_THEN_BLOCK, {"status": 500, "error_body": "the sub model crashed"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            s, job = await _background_subagent(h, kit)
            assert job.status == "failed"
            assert job.error is not None
            assert job.error.startswith("the sub-agent did not finish: its LLM call failed")
            assert "the sub model crashed" in job.error
            kit.block.release("parent")
            frames = await s.until_end()
            assert frames[-1]["reason"] == "max_iterations"  # bg1's one iteration, not an error
            assert [f for f in of_type(frames, "error") if not f["is_subagent"]] == []


async def test_a_subagent_at_its_iteration_limit_says_that(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [
        spawn(task="Loop", max_iterations=1),
        calls(call("snapshot", label="1")),
        {"text": "noted"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            frames = await h.turn("s1", "hi", profile_id="pa")
            (result,) = of_type(frames, "tool_result", name="spawn_agent")
            assert result["ok"] is False
            assert "iteration limit (1)" in result["error"]


# --- the child task and the background job -----------------------------------------------


async def test_a_subagent_runs_in_a_child_task_its_contextvars_stay_there(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    replies = [
        spawn(task="Mark it"),
        calls(call("leak", set="sub-agent")),  # the sub-agent's tool sets the variable
        {"text": "marked"},
        calls(call("leak")),  # the parent's next tool reads it
        {"text": "done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            tools = h.runtime.registry
            leak = tools.get("leak")
            assert isinstance(leak, LeakTool)
            frames = await h.turn("s1", "hi", profile_id="pa")
            assert frames[-1]["text"] == "done"
            assert leak.seen == ["parent", "parent"]


async def test_a_background_job_keeps_no_finished_run_alive(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [calls(call("block", label="j", background=True)), {"text": "started it"}]
    # Turns an earlier test of this process left (gc.freeze keeps start-up's garbage, and
    # a first runtime may freeze another test's) are not this test's: only new ones count.
    gc.collect()
    before = {id(o) for o in gc.get_objects() if isinstance(o, Turn)}
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            s = await h.session("s1")
            s.send("hi", profile_id="pa")
            await s.until_end()
            await s.idle()
            await kit.block.wait_started()
            ctx = kit.block.calls[0].ctx
            assert ctx.services is not None  # it can still spawn, say
            with pytest.raises(Exception, match="not available in a background task"):
                ctx.services.switch_profile("general")
            gc.collect()
            alive = [o for o in gc.get_objects() if isinstance(o, Turn) and id(o) not in before]
            assert alive == []  # the job holds its context, and with it no turn
            kit.block.release("j")
            (job,) = h.runtime.supervisor.list_jobs("s1")
            await job.done.wait()
            assert job.status == "completed"


# --- item 20: Agent.run, hot reload, the spawn timeout clamp ------------------------------


async def test_agent_run_returns_the_final_text_of_the_top_level_turn(tmp_path: Path) -> None:
    kit = make_kit()
    replies = [spawn(task="Dig"), {"text": "the sub-agent's report"}, {"text": "all done"}]
    with trio.fail_after(TIMEOUT):
        async with harness(tmp_path, kit, replies) as h:
            await h.runtime.store.create_session("s1", profile_id="pa")
            assert await h.runtime.agent.run("s1", "hi") == "all done"
            messages = await h.runtime.store.load_messages("s1")
            assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
            assert (messages[0]["content"], messages[-1]["content"]) == ("hi", "all done")


async def test_an_edited_persona_or_prompt_file_reaches_the_next_model_call(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "config"
    shutil.copytree(REPO_ROOT / "config", folder)
    source = ConfigSource(folder / "config.json")
    replies = [{"text": "one"}, {"text": "two"}, {"text": "three"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, config=source) as h:
            await h.turn("s1", "hi")
            assert "PERSONA-V2" not in _system(h.chat_requests[0])
            (folder / "persona.md").write_text("PERSONA-V2: you are terse.\n", encoding="utf-8")
            await h.turn("s1", "hi")
            assert _system(h.chat_requests[1]).startswith("PERSONA-V2: you are terse.")
            (folder / "prompts" / "general.md").write_text("GENERAL-V2 prompt\n", "utf-8")
            await h.turn("s1", "hi")
            system = _system(h.chat_requests[2])
            assert "PERSONA-V2" in system and system.endswith("GENERAL-V2 prompt")


async def test_an_edited_prompt_reaches_later_turns_and_switches_past_a_running_turn(
    tmp_path: Path,
) -> None:
    """agent-loop spec: the system prompt cache "is invalidated when the profile is
    reloaded (e.g. after switch_profile or hot-reload)". A turn started before a prompt
    file was edited runs on its own config until it switches, so it still builds the
    old prompt after the reload; that must reach neither a turn started after the edit
    nor its own switch back to that profile: both take the current prompt."""
    folder = tmp_path / "config"
    shutil.copytree(REPO_ROOT / "config", folder)
    data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    for pid in ("pa", "pb"):
        (folder / "prompts" / f"{pid}.md").write_text(f"{pid.upper()}-V1 prompt\n", "utf-8")
        data["profiles"][pid] = {
            "system_prompt_file": f"prompts/{pid}.md",
            "tools": {"agent": ["switch_profile", "block"], "subagent": []},
        }
    (folder / "config.json").write_text(json.dumps(data), encoding="utf-8")
    kit = make_kit()
    replies = [
        calls(call("block", label="one")),
        calls(call("block", label="two")),  # asked with the old prompt, after the reload
        {"text": "a later turn"},  # another session's, meanwhile
        calls(call("switch_profile", profile_id="pb")),
        calls(call("switch_profile", profile_id="pa")),
        {"text": "done"},
    ]
    source = ConfigSource(folder / "config.json")
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, config=source, tools=kit.tools()) as h:
            s = await h.session("s1")
            s.send("hi", profile_id="pa")
            await kit.block.wait_started()
            (folder / "prompts" / "pa.md").write_text("PA-V2 prompt, edited\n", "utf-8")
            h.runtime.agent.config()  # what the next turn to start does: reload, cache cleared
            kit.block.release("one")
            await kit.block.wait_started(2)
            await h.turn("s2", "hi", profile_id="pa")
            kit.block.release("two")
            frames = await s.until_end()
            assert frames[-1]["text"] == "done"
            first, older, later, still, in_pb, back = (_system(r) for r in h.chat_requests)
            for own in (first, older, still):  # the turn's own config, until it switches
                assert own.endswith("PA-V1 prompt")
            assert later.endswith("PA-V2 prompt, edited")
            assert in_pb.endswith("PB-V1 prompt")
            assert back.endswith("PA-V2 prompt, edited")


def _system(body: dict[str, Any]) -> str:
    first = body["messages"][0]
    assert first["role"] == "system"
    return str(first["content"]).strip()


async def test_spawn_agent_timeout_is_clamped_to_the_setting(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # The in-process scripted backend: no sockets, so once every task is blocked the
    # sub-agent is really waiting on its stalled stream and nothing else is in flight.
    kit = make_kit()
    replies = [
        spawn(task="Think", timeout_seconds=1000),  # asks for far more than allowed
        {"text": "partial words", "stall": True},
        {"text": "done"},
    ]
    async with harness(tmp_path, kit, replies, scripted=True, spawn_timeout_sec=5) as h:
        s = await h.session("s1")
        s.send("hi", profile_id="pa")
        await s.until(lambda f: f["type"] == "text_delta" and f["text"].endswith("words"))
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(4.9)
        await trio.testing.wait_all_tasks_blocked()
        assert not of_type(_drain(s), "subagent_finished")
        # Past the cap, far before the 1000 s asked for and the 60 s chunk timeout.
        mock_clock.jump(0.2)
        await trio.testing.wait_all_tasks_blocked()
        (finished,) = of_type(_drain(s), "subagent_finished")
        assert finished["completed"] is False and "timed out after 5 s" in finished["text"]
        frames = await s.until_end()
        (result,) = of_type(s.frames, "tool_result", name="spawn_agent")
        assert result["ok"] is False and "timed out after 5 s" in result["error"]
        assert frames[-1]["text"] == "done"


def _drain(s: Any) -> list[dict[str, Any]]:
    """The frames that have arrived so far, without waiting (so a failure cannot hang)."""
    while True:
        try:
            s.frames.append(s.subscription.frames.receive_nowait())
        except trio.WouldBlock:
            return list(s.frames)


# --- history marks, stop, anti-stall, shutdown --------------------------------------------


async def test_a_length_cut_answer_is_marked_in_history(tmp_path: Path) -> None:
    replies = [{"text": "The answer is cut", "done_reason": "length"}, {"text": "whole"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies) as h:
            await seed(h)
            first = await h.turn("s1", "Tell me everything")
            assert first[-1]["done_reason"] == "length"
            await h.turn("s1", "again")
            messages = await h.runtime.store.load_messages("s1")
            cut, whole = messages[-3], messages[-1]
            assert (cut["content"], cut["cut"]) == ("The answer is cut", "length")
            assert whole["content"] == "whole" and "cut" not in whole


async def test_stop_while_the_model_streams_only_thinking_keeps_the_thinking(
    tmp_path: Path,
) -> None:
    replies = [{"thinking": "let me weigh this", "stall": True}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies) as h:
            await seed(h)
            s = await h.session("s1")
            s.send("Find the answer to the question")
            await s.until(lambda f: f["type"] == "thinking_delta" and f["text"].endswith("this"))
            s.stop()
            frames = await s.until_end()
            assert frames[-1]["reason"] == "stopped"
            for saved in (
                await h.runtime.store.load_messages("s1"),
                await h.runtime.store.load_context("s1"),
            ):
                last = saved[-1]
                assert (last["role"], last["partial"], last["stopped"]) == ("assistant", True, True)
                assert last["thinking"] == "let me weigh this"


async def test_a_status_only_todo_change_counts_as_progress(tmp_path: Path) -> None:
    flags = {"anti_stall_threshold": 2, "goal_anchoring_enabled": False}

    def todo(**arguments: Any) -> dict[str, Any]:
        return calls(call("todo", **arguments))

    replies = [
        todo(action="add", text="check the thing"),
        todo(action="update", index=1, status="in_progress"),
        todo(action="update", index=1, status="failed"),
        todo(action="update", index=1, status="pending"),
        {"text": "final"},
    ]
    profiles = {"general": profile(["todo"], [], **flags)}
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, profiles=profiles, tools=[TodoTool()]
        ) as h:
            await seed(h)
            frames = await h.turn("s1", "Work through the list")
            assert frames[-1]["text"] == "final"
            assert [f for f in of_type(frames, "warning") if f["code"] == "anti_stall"] == []
            notes = [
                m["content"]
                for body in h.chat_requests
                for m in body["messages"]
                if m["role"] == "system"
            ]
            assert not [n for n in notes if n.startswith("[Warning]")]


async def test_shutdown_while_the_user_message_is_being_saved_still_saves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, gate = trio.Event(), trio.Event()
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "never asked"}]) as h:
            store = h.runtime.store
            kv_list = store.kv_list

            async def slow_kv_list(scope: str, prefix: str = "") -> list[tuple[str, Any]]:
                if scope == "task_notes":  # the first read of a turn: collecting notes
                    entered.set()
                    await gate.wait()
                return await kv_list(scope, prefix)

            monkeypatch.setattr(store, "kv_list", slow_kv_list)
            s = await h.session("s1")
            s.send("remember this message")
            await entered.wait()
            h.runtime.nursery.cancel_scope.cancel()  # the daemon shuts down now
            gate.set()
        async with SQLiteStore.open(tmp_path / "navi.db") as reopened:
            messages = await reopened.load_messages("s1")
        assert [(m["role"], m["content"]) for m in messages][:1] == [
            ("user", "remember this message")
        ]


# --- the test helper the fuzz tests rely on ----------------------------------------------


def test_assert_paired_wants_each_result_directly_after_its_call() -> None:
    def asks(*ids: str) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [{"id": i} for i in ids]}

    def answer(i: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": i, "content": "ok"}

    user = {"role": "user", "content": "hi"}
    assert_paired([user, asks("a", "b"), answer("b"), answer("a"), user])
    for broken in (
        [asks("a"), user, answer("a")],  # paired, but not directly
        [answer("a"), asks("a")],  # the result before its call
        [asks("a", "b"), answer("a")],  # one call without a result
        [asks("a"), answer("a"), answer("a")],  # a second result
        [asks("a"), answer("x")],  # someone else's result
    ):
        with pytest.raises(AssertionError):
            assert_paired(broken)
