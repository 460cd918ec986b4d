"""What goes wrong, and how the loop carries on: a tool that raises or does not exist,
an LLM that drops mid-stream / answers an HTTP error / goes silent, a context too
large for the window, an answer cut by ``done_reason: length`` (also mid tool call).

Rules: see tests/test_agent_basic.py. The timeout test runs on the autojump clock under a
real-time limit (tests/realtime.py says why a trio deadline would not do).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing
from agent_tools import (
    EchoTool,
    ExplodeTool,
    assert_paired,
    call,
    of_type,
    seed,
    tool_contents,
    toolset,
    with_tools,
)
from realtime import paced

from navi_trio.testing import open_harness

TIMEOUT = 30
TASK = "Find the answer to the question"


async def test_a_tool_that_raises_becomes_an_error_result(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies: list[dict[str, Any]] = [
            {
                "tool_calls": [
                    {"name": "explode", "arguments": {}},
                    {"name": "nosuchtool", "arguments": {}},
                    {"name": "echo", "arguments": {"text": "still here"}},
                ]
            },
            {"text": "I recovered."},
        ]
        async with open_harness(
            tmp_path,
            replies=replies,
            tools=toolset(ExplodeTool(), EchoTool()),
            profiles={"general": with_tools(["explode", "echo"])},
        ) as h:
            await seed(h)
            frames = await h.turn("s1", TASK)
            results = of_type(frames, "tool_result")
            assert [r["ok"] for r in results] == [False, False, True]
            assert "RuntimeError: kaboom in the tool" in results[0]["error"]
            assert "unknown tool 'nosuchtool'" in results[1]["error"]
            seen = tool_contents(h.chat_requests[1])
            assert seen[0].startswith("Error: the tool explode raised RuntimeError")
            assert seen[1].startswith("Error: unknown tool 'nosuchtool'; available tools:")
            assert seen[2] == "still here"
            assert (frames[-1]["reason"], frames[-1]["text"]) == ("complete", "I recovered.")
            assert_paired(await h.runtime.store.load_context("s1"))


async def test_llm_drop_mid_stream_keeps_the_history(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies: list[dict[str, Any]] = [
            {"text": "I will now explain everything", "drop_after": 3},
            {"text": "Second try works."},
        ]
        async with open_harness(tmp_path, replies=replies) as h:
            await seed(h)
            frames = await h.turn("s1", TASK)
            errors = of_type(frames, "error")
            assert len(errors) == 1 and errors[0]["code"] == "llm_connection"
            assert "dropped" in errors[0]["message"]
            end = frames[-1]
            assert (end["reason"], end["stopped"], end["text"]) == ("error", False, "I will now ")
            for saved in (
                await h.runtime.store.load_messages("s1"),
                await h.runtime.store.load_context("s1"),
            ):
                assert [m["content"] for m in saved] == ["earlier", TASK, "I will now "]
                assert saved[-1]["partial"] is True and "dropped" in saved[-1]["error"]
            frames = await h.turn("s1", "try again")
            assert frames[-1]["text"] == "Second try works."
            sent = [m["content"] for m in h.chat_requests[1]["messages"] if m["role"] != "system"]
            assert sent == ["earlier", TASK, "I will now ", "try again"]


async def test_http_error_status_and_stream_error_line(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies: list[dict[str, Any]] = [
            {"status": 503, "error_body": "model is loading"},
            {"text": "partial", "error_line": "out of memory"},
        ]
        async with open_harness(tmp_path, replies=replies) as h:
            await seed(h)
            frames = await h.turn("s1", TASK)
            err = of_type(frames, "error")[0]
            assert err["code"] == "llm_status" and "503" in err["message"]
            assert "model is loading" in err["message"]
            assert frames[-1]["reason"] == "error"
            frames = await h.turn("s1", "again")
            err = of_type(frames, "error")[0]
            assert err["code"] == "llm_error" and "out of memory" in err["message"]
            messages = await h.runtime.store.load_messages("s1")
            assert [m["content"] for m in messages] == ["earlier", TASK, "again", "partial"]


async def test_first_chunk_and_chunk_timeouts(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The settings reach the guard through the agent: first chunk 10 s, then 0.3 s gaps.
    # A 1 s prefill with 0.2 s gaps completes; an 11 s prefill and a stall do not.
    # Paced (tests/realtime.py): on a threshold of 0 the clock jumped to the 0.3 s gap's
    # deadline while a chunk sent at 0.2 s was still on its way through the socket (every
    # task looks blocked then), and the complete answer timed out once in CI.
    async with paced(autojump_clock, TIMEOUT):
        replies = [
            {"delay_first": 1, "delay_chunk": 0.2, "text": "slow prefill then words"},
            {"delay_first": 11, "text": "too late"},
            {"text": "some words then", "stall": True, "delay_chunk": 0.2},
        ]
        async with open_harness(
            tmp_path, replies=replies, first_chunk_timeout=10, chunk_timeout=0.3
        ) as h:
            await seed(h)
            frames = await h.turn("s1", TASK)
            assert of_type(frames, "error") == []
            assert (frames[-1]["reason"], frames[-1]["text"]) == (
                "complete",
                "slow prefill then words",
            )
            frames = await h.turn("s1", "again")
            err = of_type(frames, "error")[0]
            assert err["code"] == "llm_timeout"
            assert err["message"] == "the model sent nothing within 10 s (first chunk)"
            assert h.fake is not None
            await h.fake.wait_disconnects(1)
            frames = await h.turn("s1", "again")
            err = of_type(frames, "error")[0]
            assert err["code"] == "llm_timeout"
            assert err["message"] == "the model went silent for 0.3 s mid-stream"
            assert frames[-1]["text"] == "some words then"
            await h.fake.wait_disconnects(2)
            messages = await h.runtime.store.load_messages("s1")
            assert messages[-1]["partial"] is True and messages[-1]["content"] == "some words then"


async def test_context_too_large_is_answered_not_crashed(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        huge = "word " * 1500
        async with open_harness(tmp_path, replies=[{"text": "small answer"}], num_ctx=1024) as h:
            await seed(h)
            frames = await h.turn("s1", huge)
            assert h.chat_requests == []  # never sent
            end = frames[-1]
            assert end["reason"] == "context_too_large"
            text = "".join(f["text"] for f in of_type(frames, "text_delta"))
            assert text == end["text"] and "navi compact --session s1" in text and "tokens" in text
            messages = await h.runtime.store.load_messages("s1")
            context = await h.runtime.store.load_context("s1")
            # The user message is kept; the synthesized answer is shown, not sent back.
            assert [m["role"] for m in messages][-2:] == ["user", "assistant"]
            assert messages[-1]["content"] == text
            assert context[-1]["content"] == huge


async def test_done_reason_length_is_shown_and_cut_tool_json_is_an_error_result(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        replies: list[dict[str, Any]] = [
            {"text": "A long answer that got", "done_reason": "length"},
            {
                "tool_calls": [{"name": "echo", "arguments": '{"text": "abc'}],
                "done_reason": "length",
            },
            {"text": "Retried."},
        ]
        async with open_harness(
            tmp_path,
            replies=replies,
            tools=toolset(EchoTool()),
            profiles={"general": with_tools(["echo"])},
        ) as h:
            await seed(h)
            frames = await h.turn("s1", TASK)
            assert frames[-1]["done_reason"] == "length"
            assert frames[-1]["reason"] == "complete"
            warn = [f for f in of_type(frames, "warning") if f["code"] == "length"]
            assert len(warn) == 1 and "cut off" in warn[0]["message"]

            frames = await h.turn("s1", "again")
            assert any(f["code"] == "length" for f in of_type(frames, "warning"))
            result = of_type(frames, "tool_result")[0]
            assert result["ok"] is False and "not valid JSON" in result["error"]
            assert "not valid JSON" in tool_contents(h.chat_requests[2])[-1]
            assert frames[-1]["text"] == "Retried."
            assert_paired(await h.runtime.store.load_context("s1"))


async def test_internal_error_still_ends_the_stream(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "fine"}, call("echo")]) as h:
            await seed(h)
            # A context message the builder refuses (bad role): our bug, not the user's.
            await h.runtime.store.append("s1", context=[{"role": "wizard", "content": "?"}])
            h.runtime.agent.cache.forget("s1")
            frames = await h.turn("s1", TASK)
            assert of_type(frames, "error")[0]["code"] == "internal"
            assert frames[-1]["type"] == "stream_end" and frames[-1]["reason"] == "error"
            messages = await h.runtime.store.load_messages("s1")
            assert messages[-1]["content"] == TASK


async def test_garbage_from_the_llm_ends_the_turn_with_an_error_and_loses_nothing(
    tmp_path: Path,
) -> None:
    # Both dialects: a line that is not JSON (or not an SSE event) in the middle of an
    # answer. The partial answer is kept, the error names the problem, and the session
    # answers the next message normally.
    for dialect in ("ollama", "openai"):
        with trio.fail_after(TIMEOUT):
            replies = [
                {"text": "half an answer", "malformed": "<html>502 Bad Gateway</html>"},
                {"text": "back to normal"},
            ]
            async with open_harness(tmp_path / dialect, replies=replies, dialect=dialect) as h:
                await seed(h)
                frames = await h.turn("s1", TASK)
                (err,) = of_type(frames, "error")
                assert err["code"] == "llm_error" and "Bad Gateway" in err["message"]
                assert (frames[-1]["type"], frames[-1]["reason"]) == ("stream_end", "error")
                frames = await h.turn("s1", "again")
                assert frames[-1]["text"] == "back to normal"
                messages = await h.runtime.store.load_messages("s1")
                assert [m["content"] for m in messages] == [
                    "earlier",
                    TASK,
                    "half an answer",
                    "again",
                    "back to normal",
                ]
                assert messages[2]["partial"] is True and "Bad Gateway" in messages[2]["error"]
                assert all(m.get("role") != "tool" for m in messages)
