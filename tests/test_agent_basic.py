"""The agent loop end to end, basics: DIRECT, streaming events, the system prompt and
memory message, the run's ContextVars, tools in the loop.

Rules (as in every tests/test_agent_*.py): the loop talks real HTTP to the fake LLM on
127.0.0.1 (port 0) through `open_harness`; the store is a real SQLite file under
tmp_path; real time (nothing here waits on a delay), each test under an absolute
`trio.fail_after`; assertions read what the fake server received and what the store
holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import (
    EchoTool,
    ExplodeTool,
    RecordTool,
    call,
    of_type,
    system_notes,
    toolset,
    with_tools,
)

from navi_trio.core.turn import RunControl, UserMessage, runvars
from navi_trio.core.turn.context import MEMORY_HEADER
from navi_trio.events import AgentEvent, StreamEnd
from navi_trio.testing import open_harness

TIMEOUT = 30


async def test_direct_answer_skips_planning_and_is_saved(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [{"text": "DIRECT"}, {"text": "Paris is the capital."}]
        async with open_harness(tmp_path, replies=replies) as h:
            frames = await h.turn("s1", "What is the capital of France?")
            reqs = h.chat_requests
            assert len(reqs) == 2  # phase 1 + one main call: no phase 2/3
            assert "What is the capital of France?" in reqs[0]["messages"][-1]["content"]
            assert [f["status"] for f in of_type(frames, "plan_phase")] == [
                "started",
                "done",
                "skipped",
                "skipped",
            ]
            assert not of_type(frames, "plan")
            end = frames[-1]
            assert end["type"] == "stream_end"
            assert (end["reason"], end["stopped"], end["text"]) == (
                "complete",
                False,
                "Paris is the capital.",
            )
            msgs = await h.runtime.store.load_messages("s1")
            assert [(m["role"], m["content"]) for m in msgs] == [
                ("user", "What is the capital of France?"),
                ("assistant", "Paris is the capital."),
            ]


async def test_casual_first_message_does_not_plan(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "Hello!"}]) as h:
            frames = await h.turn("s1", "hi")
            assert len(h.chat_requests) == 1
            assert not of_type(frames, "plan_phase")
            assert frames[-1]["text"] == "Hello!"


async def test_streaming_events_come_in_order(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        reply = {"thinking": "let me see", "text": "two words", "model": "m-1"}
        async with open_harness(tmp_path, replies=[reply]) as h:
            frames = await h.turn("s1", "hi")
            # How many deltas a text comes in depends on how far the reader is behind
            # (waiting deltas merge); their order and their text do not.
            kinds = [f["type"] for f in frames]
            kinds = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
            assert kinds == [
                "thinking_delta",
                "thinking_end",
                "text_delta",
                "model_info",
                "stream_end",
            ]
            assert "".join(f["text"] for f in of_type(frames, "thinking_delta")) == "let me see"
            assert "".join(f["text"] for f in of_type(frames, "text_delta")) == "two words"
            assert of_type(frames, "model_info")[0]["model"] == "m-1"
            seqs = [f["seq"] for f in frames]  # a merged delta carries its last seq
            actor = h.runtime.sessions.actor("s1")
            assert actor is not None
            assert seqs == sorted(set(seqs)) and seqs[-1] == actor.seq
            stored = await h.runtime.store.load_messages("s1")
            assert stored[-1]["thinking"] == "let me see"


async def test_model_info_at_each_runs_first_answer_and_when_it_changes(
    tmp_path: Path,
) -> None:
    # Once per run, not once per session: a client that resumes the session (or joins
    # it from another connection) learns the model from the next answer.
    with trio.fail_after(TIMEOUT):
        replies = [
            {"text": "one", "model": "m-a"},
            {"text": "two", "model": "m-a"},  # a new run: told again
            {**call("echo", text="x"), "model": "m-a"},
            {**call("echo", text="y"), "model": "m-a"},  # the same model: not told again
            {"text": "three", "model": "m-b"},  # changed mid-turn
        ]
        async with open_harness(
            tmp_path,
            replies=replies,
            tools=toolset(EchoTool()),
            profiles={"general": with_tools(["echo"])},
        ) as h:
            first = await h.turn("s1", "hi")
            second = await h.turn("s1", "hello")
            third = await h.turn("s1", "thanks")
            assert [f["model"] for f in of_type(first, "model_info")] == ["m-a"]
            assert [f["model"] for f in of_type(second, "model_info")] == ["m-a"]
            assert [f["model"] for f in of_type(third, "model_info")] == ["m-a", "m-b"]


async def test_system_prompt_is_persona_then_profile_and_never_stored(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "ok"}]) as h:
            cfg = h.runtime.config.current
            persona = cfg.persona.strip()
            prompt = cfg.profile("general").system_prompt.strip()
            await h.turn("s1", "hi")
            first = h.chat_requests[0]["messages"][0]
            assert first["role"] == "system"
            assert first["content"] == f"{persona}\n\n---\n\n{prompt}"
            context = await h.runtime.store.load_context("s1")
            messages = await h.runtime.store.load_messages("s1")
            assert all(persona not in str(m.get("content")) for m in context + messages)


async def test_memory_message_and_stale_system_messages(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "ok"}, {"text": "ok"}]) as h:
            store = h.runtime.store
            # A session saved by an older version, with a system prompt in its context
            # and a kept note: the old prompt is stripped, the note reaches the model.
            await store.create_session("s1", profile_id="general")
            await store.append(
                "s1",
                messages=[{"role": "user", "content": "earlier"}],
                context=[
                    {"role": "system", "content": "STALE SYSTEM PROMPT"},
                    {"role": "user", "content": "earlier"},
                    {"role": "system", "content": "KEPT NOTE", "keep": True},
                ],
            )
            await h.turn("s1", "hi")
            notes = system_notes(h.chat_requests[0])
            assert "STALE SYSTEM PROMPT" not in notes
            assert "KEPT NOTE" in notes
            assert not any(n.startswith(MEMORY_HEADER) for n in notes)

            await store.kv_set(
                "memory",
                "local",
                {"next": 2, "items": [{"id": "m1", "text": "prefers metric units"}]},
            )
            await h.turn("s1", "hi again")
            msgs = h.chat_requests[1]["messages"]
            assert msgs[1] == {
                "role": "system",
                "content": f"{MEMORY_HEADER}\n- prefers metric units",
            }


async def test_a_message_from_a_user_the_store_does_not_know_never_runs(tmp_path: Path) -> None:
    # What may run is the store's word at the start of each run: a user removed (here:
    # never added) gets an error and the LLM hears nothing, on any daemon, after any start.
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "DIRECT"}, {"text": "hi"}]) as h:
            frames = await h.turn("s1", "hi", user_id="u-0123456789ab", user_role="admin")
            end = frames[-1]
            assert (end["type"], end["reason"]) == ("stream_end", "error"), frames
            (error,) = of_type(frames, "error")
            assert "removed" in error["message"], error
            assert h.chat_requests == []


async def test_a_runs_sandbox_gets_the_tmp_size_of_the_settings(tmp_path: Path) -> None:
    rec = RecordTool()
    replies = [call("record"), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, tools=toolset(rec), sandbox_tmp_max_bytes=123_456,
            profiles={"general": with_tools(["record"], planning_first_message=False)},
        ) as h:  # fmt: skip
            await h.turn("s1", "hi", cwd=tmp_path)
    (seen,) = rec.seen
    assert seen["ctx_sandbox"].tmp_max_bytes == 123_456, seen


async def test_run_sets_context_vars_and_message_keeps_cwd(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        rec = RecordTool()
        work = tmp_path / "work"
        work.mkdir()
        replies = [call("record"), {"text": "done"}]
        async with open_harness(
            tmp_path,
            replies=replies,
            tools=toolset(rec),
            profiles={"general": with_tools(["record"], model="model-x")},
        ) as h:
            ann = await h.user("ann", "admin")
            msg = dict(cwd=work, user_id=ann, user_role="admin", user_info={"name": "Ann"})
            await h.turn("s1", "hi", **msg)
            seen = rec.seen[0]
            assert seen["session_id"] == "s1"
            assert seen["model"] == "model-x"
            assert seen["working_directory"] == work == seen["ctx_cwd"]
            assert (seen["user_id"], seen["user_role"], seen["user_info"]) == (
                ann,
                "admin",
                {"name": "Ann"},
            )
            user = (await h.runtime.store.load_messages("s1"))[0]
            assert user["cwd"] == str(work)


async def _turn_in_this_task(h: Any, session_id: str, text: str, **kw: Any) -> list[AgentEvent]:
    """Run one turn in the calling task, so its ContextVars are the ones we look at.

    (run_stream runs a turn in a child task, whose context is a copy: a leak there
    could never be seen from here.)
    """
    events: list[AgentEvent] = []
    control = kw.pop("control", None) or RunControl()
    await h.runtime.agent._run_turn(session_id, UserMessage(text, **kw), events.append, control)
    return events


async def test_context_vars_reset_on_every_exit_path(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        rec = RecordTool()
        replies = [
            call("record"),
            {"text": "complete"},  # normal end
            call("record"),
            {"status": 500, "error_body": "GPU on fire"},  # LLM error
            call("record"),
            {"stall": True, "text": "never"},  # stopped
        ]
        async with open_harness(
            tmp_path,
            replies=replies,
            tools=toolset(rec),
            profiles={"general": with_tools(["record"])},
        ) as h:
            before = runvars.snapshot()
            assert set(before.values()) == {None}
            msg = dict(cwd=tmp_path, user_id="u1", user_role="r", user_info={"k": 1})

            events = await _turn_in_this_task(h, "s1", "hi", **msg)
            assert isinstance(events[-1], StreamEnd) and events[-1].reason == "complete"
            assert runvars.snapshot() == before

            events = await _turn_in_this_task(h, "s1", "hi", **msg)
            assert isinstance(events[-1], StreamEnd) and events[-1].reason == "error"
            assert runvars.snapshot() == before

            control = RunControl()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _stop_when(h, 6, control))
                events = await _turn_in_this_task(h, "s1", "hi", control=control, **msg)
            assert isinstance(events[-1], StreamEnd) and events[-1].reason == "stopped"
            assert runvars.snapshot() == before

            # ... and while each run was on, the tool saw the values.
            assert len(rec.seen) == 3
            assert all(
                s["working_directory"] == tmp_path and s["user_id"] == "u1" for s in rec.seen
            )


async def _stop_when(h: Any, requests: int, control: RunControl) -> None:
    await h.fake.wait_requests(requests)
    control.stop()


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
async def test_tool_results_go_back_to_the_model(tmp_path: Path, dialect: str) -> None:
    with trio.fail_after(TIMEOUT):
        rec = RecordTool()
        replies = [
            {"text": "Let me check.", **call("record", q=1)},
            {"text": "All done."},
        ]
        async with open_harness(
            tmp_path,
            replies=replies,
            tools=toolset(rec, ExplodeTool()),
            dialect=dialect,
            profiles={"general": with_tools(["record", "explode"])},
        ) as h:
            frames = await h.turn("s1", "hi")
            started = of_type(frames, "tool_started")
            progress = of_type(frames, "tool_event")
            result = of_type(frames, "tool_result")
            assert [f["type"] for f in frames if f["type"].startswith("tool_")] == [
                "tool_started",
                "tool_event",
                "tool_result",
            ]
            assert [(f["name"], f["arguments"]) for f in started] == [("record", {"q": 1})]
            assert progress[0]["data"] == {"progress": "half way"}
            assert (result[0]["ok"], result[0]["output"]) == (True, "recorded")
            assert started[0]["call_id"] == progress[0]["call_id"] == result[0]["call_id"]
            second = h.chat_requests[1]["messages"]
            call_msg = next(m for m in second if m.get("tool_calls"))
            tool_msg = second[second.index(call_msg) + 1]
            assert tool_msg["role"] == "tool" and tool_msg["content"] == "recorded"
            context = await h.runtime.store.load_context("s1")
            assert [m["role"] for m in context] == ["user", "assistant", "tool", "assistant"]
            assert context[1]["content"] == "Let me check."
            assert context[2]["tool_call_id"] == context[1]["tool_calls"][0]["id"]
            # Only the tools the profile names are offered.
            offered = {t["function"]["name"] for t in h.chat_requests[0]["tools"]}
            assert offered == {"record", "explode"}
            assert frames[-1]["text"] == "All done." and frames[-1]["iterations"] == 2


async def test_memories_load_once_per_turn_and_reload_after_the_memory_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store round trip per round was measured on the tool-loop path: once per turn,
    # and again only after the memory tool ran.
    with trio.fail_after(TIMEOUT):
        replies = [
            call("echo", text="a"), call("echo", text="b"),
            call("memory", action="remember", fact="likes tea"),
            call("echo", text="c"), {"text": "done"},
        ]  # fmt: skip
        async with open_harness(
            tmp_path,
            replies=replies,
            tools=toolset(EchoTool()),
            profiles={"general": with_tools(["echo", "memory"])},
        ) as h:
            store = h.runtime.store
            reads: list[str] = []
            kv_get = store.kv_get

            async def counting_kv_get(scope: str, key: str) -> Any:
                if scope == "memory":
                    reads.append(key)
                return await kv_get(scope, key)

            monkeypatch.setattr(store, "kv_get", counting_kv_get)
            frames = await h.turn("s1", "hi")
            assert frames[-1]["reason"] == "complete"
            main = h.chat_requests[-5:]
            mem = [[n for n in system_notes(r) if n.startswith(MEMORY_HEADER)] for r in main]
            tea = [f"{MEMORY_HEADER}\n- likes tea"]
            assert mem == [[], [], [], tea, tea]  # reloaded right after the memory tool
            # One load for the turn, one by the memory tool, one reload after it.
            assert len(reads) == 3, reads
