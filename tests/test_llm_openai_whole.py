"""NAVI_OPENAI_TOOL_STREAM=false: tool turns sent non-streamed, against the fake server.

llama-cpp-python's function-calling format calls a tool on its own choice only in a
non-streamed request (tests/test_llama_server.py shows it on the real server). These
tests hold that path to the streamed one's behaviour over real HTTP: the same chunks,
the guard's first-chunk timeout bounding the whole answer, Stop closing the request,
clear errors. Loopback only, port 0; the autojump clock for anything that sleeps; every
test has an absolute timeout.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import llm_served
import pytest
import trio
import trio.testing

from navi_trio.errors import (
    LLMEmptyResponseError,
    LLMFirstChunkTimeout,
    LLMMalformedStreamError,
    LLMStatusError,
    LLMStreamError,
)
from navi_trio.llm.base import (
    ChatRequest,
    DoneChunk,
    LLMChunk,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallsChunk,
)
from navi_trio.llm.factory import make_backend
from navi_trio.llm.guard import guarded_stream
from navi_trio.llm.openai import OpenAIBackend, parse_completion
from navi_trio.settings import Settings
from navi_trio.testing.fake_llm import FakeLLMServer

TIMEOUT = 10
LIMIT = 600  # virtual seconds (autojump clock)
ECHO = {
    "type": "function",
    "function": {"name": "echo", "parameters": {"type": "object", "properties": {}}},
}
WITH_TOOLS = ChatRequest(messages=[{"role": "user", "content": "echo hi"}], model="m", tools=[ECHO])
NO_TOOLS = ChatRequest(messages=[{"role": "user", "content": "hi"}], model="m")


def served(
    replies: list[dict[str, Any]], tool_stream: bool = False
) -> AbstractAsyncContextManager[tuple[FakeLLMServer, OpenAIBackend]]:
    server = {"dialects": ("openai",)}
    return llm_served.served(replies, "openai", server=server, tool_stream=tool_stream)


async def collect(backend: OpenAIBackend, request: ChatRequest = WITH_TOOLS) -> list[LLMChunk]:
    return await llm_served.collect(backend, request)


async def test_a_tool_turn_goes_non_streamed_and_gives_the_same_chunks() -> None:
    reply = {
        "thinking": "the user wants echo",
        "text": "Calling it.",
        "tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}],
        "prompt_tokens": 40,
        "completion_tokens": 9,
    }
    with trio.fail_after(TIMEOUT):
        async with served([reply]) as (server, backend):
            got = await collect(backend)
    body = server.chat_requests[0]["body"]
    assert body["stream"] is False and "stream_options" not in body
    assert body["tool_choice"] == "auto" and body["tools"] == [ECHO]
    assert got == [
        ThinkingChunk("the user wants echo"),
        TextChunk("Calling it."),
        ToolCallsChunk((ToolCall("call_1_0", "echo", {"text": "hi"}),)),
        DoneChunk(model="m", prompt_tokens=40, completion_tokens=9, done_reason="tool_calls"),
    ]


async def test_turns_without_tools_and_the_default_setting_still_stream() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "a b"}]) as (server, backend):
            assert [c for c in await collect(backend, NO_TOOLS) if isinstance(c, TextChunk)] == [
                TextChunk("a "),
                TextChunk("b"),
            ]
        async with served([{"text": "a b"}], tool_stream=True) as (server2, backend2):
            got = await collect(backend2)
    assert server.chat_requests[0]["body"]["stream"] is True
    body = server2.chat_requests[0]["body"]
    assert body["stream"] is True and "tool_choice" not in body
    assert len([c for c in got if isinstance(c, TextChunk)]) == 2


async def test_the_first_chunk_timeout_bounds_the_whole_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 10 words at 10 s each: 100 s of generation before the body comes.
    reply = {"text": " ".join(["w"] * 10), "delay_first": 10, "delay_chunk": 10}
    with trio.fail_after(LIMIT):
        async with served([reply]) as (server, backend):
            start = trio.current_time()
            with pytest.raises(LLMFirstChunkTimeout):
                async with guarded_stream(
                    backend, WITH_TOOLS, first_chunk_timeout=90, chunk_timeout=5
                ) as chunks:
                    async for _ in chunks:
                        pass
            assert trio.current_time() - start == pytest.approx(90, abs=1)
            await server.wait_disconnects(1)  # the server saw the request go
            assert server.completed == 0


async def test_stop_while_the_server_generates_closes_the_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with served([{"text": "never", "endless": True}]) as (server, backend):
            with trio.move_on_after(30) as stop:  # the user's Stop is a cancel scope
                await collect(backend)
            assert stop.cancelled_caught
            await server.wait_disconnects(1)
            assert server.disconnects[0]["path"] == "/v1/chat/completions"


async def test_bad_answers_are_clear_errors() -> None:
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"empty_body": True}, LLMEmptyResponseError, "window"),
        ({"malformed": True}, LLMMalformedStreamError, "not JSON"),
        ({"error_line": "model crashed"}, LLMStreamError, "model crashed"),
        ({"status": 500, "error_body": "out of memory"}, LLMStatusError, "out of memory"),
    ]
    with trio.fail_after(TIMEOUT):
        async with served([c[0] for c in cases]) as (_, backend):
            for _reply, kind, words in cases:
                with pytest.raises(kind, match=words):
                    await collect(backend)


def test_a_completion_body_is_parsed_strictly_but_never_crashes() -> None:
    with pytest.raises(LLMMalformedStreamError, match="without a choice"):
        parse_completion(b'{"choices": []}', "m")
    with pytest.raises(LLMMalformedStreamError, match="without a message"):
        parse_completion(b'{"choices": [{"text": "legacy"}]}', "m")
    body = (
        b'{"choices": [{"message": {"content": null, "tool_calls": ['
        b'"junk", {"id": "c2", "function": {"name": "echo", "arguments": "{\\"a\\": "}}]},'
        b' "finish_reason": "length"}]}'
    )
    got = parse_completion(body, "m")
    assert isinstance(got[0], ToolCallsChunk)
    junk, cut = got[0].calls
    assert junk.parse_error and "no function name" in junk.parse_error
    assert cut.name == "echo" and cut.parse_error and "not valid JSON" in cut.parse_error
    assert got[-1] == DoneChunk(model="m", done_reason="length")


def test_the_setting_reaches_the_backend() -> None:
    env = {"NAVI_LLM_BACKEND": "openai", "NAVI_OPENAI_TOOL_STREAM": "false"}
    client = httpx.AsyncClient()
    backend = make_backend(Settings.from_env(env), client)
    assert isinstance(backend, OpenAIBackend) and backend.tool_stream is False
    default = make_backend(Settings.from_env({"NAVI_LLM_BACKEND": "openai"}), client)
    assert isinstance(default, OpenAIBackend) and default.tool_stream is True
