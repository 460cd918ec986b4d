"""Reliability: every way the LLM can fail mid-turn, in both dialects (issue 11).

For each fault: a clear error frame, the user message and everything streamed before
the fault stay in the history, no tool call is left without its result, and the next
message in the same session is answered normally. The fake server plays the faults
over real HTTP on 127.0.0.1; timeouts run on the autojump clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import EchoTool, assert_paired, of_type, seed, toolset, with_tools
from realtime import paced

from navi_trio.testing import open_harness
from navi_trio.testing.harness import Harness

DIALECTS = ("ollama", "openai")
LIMIT = 60  # real seconds for a whole test (it runs many turns)

# One reply of N content chunks: 3 thinking words, 4 text words, then one tool call.
THINKING = "weigh the options"
TEXT = "I will echo now"
FULL: dict[str, Any] = {
    "thinking": THINKING,
    "text": TEXT,
    "tool_calls": [{"name": "echo", "arguments": {"text": "echoed"}}],
}
N_CHUNKS = len(THINKING.split()) + len(TEXT.split()) + 1


def _open(tmp_path: Path, dialect: str, replies: list[dict[str, Any]], **kw: Any) -> Any:
    return open_harness(
        tmp_path / dialect,
        replies=replies,
        dialect=dialect,
        tools=toolset(EchoTool()),
        profiles={"general": with_tools(["echo"])},
        **kw,
    )


def _streamed_text(frames: list[dict[str, Any]]) -> str:
    return "".join(f["text"] for f in of_type(frames, "text_delta"))


async def _check_fault(
    h: Harness, user_text: str, frames: list[dict[str, Any]], code: str, words: tuple[str, ...]
) -> None:
    """The turn ended in one clear error and the history kept everything."""
    errors = of_type(frames, "error")
    assert len(errors) == 1, errors
    err = errors[0]
    assert err["code"] == code, err
    assert err["message"] and all(w in err["message"] for w in words), err
    end = frames[-1]
    assert (end["type"], end["reason"], end["stopped"]) == ("stream_end", "error", False)
    streamed = _streamed_text(frames)
    assert end["text"] == streamed
    messages = await h.runtime.store.load_messages("s1")
    contents = [m["content"] for m in messages]
    assert user_text in contents, contents
    after_user = messages[contents.index(user_text) + 1 :]
    saved_text = "".join(m["content"] or "" for m in after_user if m["role"] == "assistant")
    assert saved_text == streamed, (saved_text, streamed)
    assert_paired(await h.runtime.store.load_context("s1"))
    assert_paired(messages)


async def _next_turn_works(h: Harness, text: str) -> None:
    h.add_replies({"text": f"fine after {text}"})
    frames = await h.turn("s1", text)
    assert of_type(frames, "error") == []
    assert (frames[-1]["reason"], frames[-1]["text"]) == ("complete", f"fine after {text}")
    assert_paired(await h.runtime.store.load_context("s1"))


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_drop_after_every_chunk_index_loses_nothing(tmp_path: Path, dialect: str) -> None:
    with trio.fail_after(LIMIT):
        async with _open(tmp_path, dialect, []) as h:
            await seed(h)
            for k in range(N_CHUNKS + 1):
                user_text = f"task {k}"
                h.add_replies({**FULL, "drop_after": k})
                frames = await h.turn("s1", user_text)
                await _check_fault(h, user_text, frames, "llm_connection", ("dropped",))
                # A dropped stream never runs a tool: the call was not complete.
                assert of_type(frames, "tool_result") == []
                await _next_turn_works(h, f"after drop {k}")
            messages = await h.runtime.store.load_messages("s1")
            users = [m["content"] for m in messages if m["role"] == "user"]
            assert users == ["earlier"] + [
                x for k in range(N_CHUNKS + 1) for x in (f"task {k}", f"after drop {k}")
            ]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_stalls_before_the_first_chunk_and_mid_stream_time_out(
    tmp_path: Path, dialect: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with paced(autojump_clock, LIMIT):
        async with _open(tmp_path, dialect, [], first_chunk_timeout=10, chunk_timeout=2) as h:
            await seed(h)
            h.add_replies({"text": "never arrives", "delay_first": 3600})
            frames = await h.turn("s1", "prefill stall")
            await _check_fault(h, "prefill stall", frames, "llm_timeout", ("first chunk",))
            assert frames[-1]["text"] == ""
            await h.fake.wait_disconnects(1)
            await _next_turn_works(h, "after prefill stall")
            h.add_replies({"text": "three words then", "stall": True})
            frames = await h.turn("s1", "mid stall")
            await _check_fault(h, "mid stall", frames, "llm_timeout", ("mid-stream",))
            assert frames[-1]["text"] == "three words then"
            await h.fake.wait_disconnects(2)
            await _next_turn_works(h, "after mid stall")
            h.add_replies({"thinking": "thinking hard", "text": "x", "delay_chunk": 3600})
            frames = await h.turn("s1", "stall in thinking")
            await _check_fault(h, "stall in thinking", frames, "llm_timeout", ("mid-stream",))
            await h.fake.wait_disconnects(3)
            await _next_turn_works(h, "after thinking stall")


BAD_STREAMS: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    ("malformed", {"text": "half an", "malformed": "{not json"}, "llm_error", ()),
    ("malformed_default", {"text": "half an", "malformed": True}, "llm_error", ()),
    (
        "error_line",
        {"text": "some", "error_line": "CUDA out of memory"},
        "llm_error",
        ("CUDA out of memory",),
    ),
    ("error_line_first", {"error_line": "model crashed"}, "llm_error", ("model crashed",)),
    (
        "status_400",
        {"status": 400, "error_body": "bad request body"},
        "llm_status",
        ("400", "bad request body"),
    ),
    (
        "status_404",
        {"status": 404, "error_body": "model 'x' not found"},
        "llm_status",
        ("404", "not found"),
    ),
    ("status_429", {"status": 429, "error_body": "slow down"}, "llm_status", ("429", "slow down")),
    ("status_500", {"status": 500, "error_body": "internal"}, "llm_status", ("500",)),
    ("status_503", {"status": 503, "error_body": "loading"}, "llm_status", ("503", "loading")),
    (
        "status_raw",
        {"status": 502, "error_body": "<html>gateway</html>", "error_raw": True},
        "llm_status",
        ("502",),
    ),
    ("empty_body", {"empty_body": True}, "llm_empty_response", ()),
]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_bad_streams_and_error_statuses_end_the_turn_cleanly(
    tmp_path: Path, dialect: str
) -> None:
    with trio.fail_after(LIMIT):
        async with _open(tmp_path, dialect, []) as h:
            await seed(h)
            for name, reply, code, words in BAD_STREAMS:
                h.add_replies(reply)
                frames = await h.turn("s1", f"case {name}")
                try:
                    await _check_fault(h, f"case {name}", frames, code, words)
                except AssertionError as exc:
                    raise AssertionError(f"{dialect}/{name}: {exc}") from exc
                await _next_turn_works(h, f"after {name}")


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_fault_after_a_tool_round_keeps_the_paired_round(
    tmp_path: Path, dialect: str
) -> None:
    # Round 1 calls echo (completes); round 2 drops mid-text: the tool call and its result
    # stay paired in the history, followed by the partial answer.
    with trio.fail_after(LIMIT):
        replies: list[dict[str, Any]] = [
            {
                "tool_calls": [
                    {"name": "echo", "arguments": {"text": "one"}},
                    {"name": "echo", "arguments": {"text": "two"}},
                ]
            },
            {"text": "the echo said one and two", "drop_after": 3},
        ]
        async with _open(tmp_path, dialect, replies) as h:
            await seed(h)
            frames = await h.turn("s1", "use the tool")
            await _check_fault(h, "use the tool", frames, "llm_connection", ("dropped",))
            assert [r["ok"] for r in of_type(frames, "tool_result")] == [True, True]
            context = await h.runtime.store.load_context("s1")
            roles = [m["role"] for m in context]
            assert roles[-4:] == ["assistant", "tool", "tool", "assistant"], roles
            await _next_turn_works(h, "after tool round")


async def test_the_user_message_is_kept_when_reading_task_notes_is_cut_short(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the stall suite on the autojump clock: the accept step (read the task
    # notes, add the user message, save) runs under the clean-up deadline; when the read
    # outlived it, the turn went on WITHOUT the user message in the history.
    import navi_trio.core.turn.agent as agent_module

    async def slow_notes(*_args: Any) -> None:
        await trio.sleep(3600)

    monkeypatch.setattr(agent_module, "collect_notes", slow_notes)
    async with paced(autojump_clock, LIMIT):
        async with _open(tmp_path, "ollama", [{"text": "answered"}]) as h:
            await seed(h)
            frames = await h.turn("s1", "keep me")
            assert frames[-1]["text"] == "answered"
            messages = await h.runtime.store.load_messages("s1")
            assert [m["content"] for m in messages] == ["earlier", "keep me", "answered"]
            sent = [m["content"] for m in h.chat_requests[0]["messages"] if m["role"] == "user"]
            assert sent == ["earlier", "keep me"]
