"""OllamaBackend against the fake LLM server: real HTTP, real NDJSON.

Rules: loopback only, port 0; every I/O test has an absolute timeout; nothing sleeps
for real.
"""

from __future__ import annotations

import json
import socket
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import llm_served
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from navi_trio.errors import (
    ConfigError,
    LLMConnectionError,
    LLMError,
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
from navi_trio.llm.factory import make_backend, make_client
from navi_trio.llm.ollama import OllamaBackend, OllamaParser, to_ollama_message
from navi_trio.llm.openai import OpenAIBackend
from navi_trio.llm.script import rough_tokens
from navi_trio.settings import Settings
from navi_trio.testing.fake_llm import FakeLLMServer, open_fake_llm

TIMEOUT = 10


def request(**kw: Any) -> ChatRequest:
    kw.setdefault("messages", [{"role": "user", "content": "hello there"}])
    kw.setdefault("model", "qwen3:8b")
    return ChatRequest(**kw)


def served(
    replies: list[dict[str, Any]], **kw: Any
) -> AbstractAsyncContextManager[tuple[FakeLLMServer, OllamaBackend]]:
    return llm_served.served(replies, "ollama", server=kw, keep_alive="5m")


async def collect(backend: OllamaBackend, req: ChatRequest | None = None) -> list[LLMChunk]:
    return await llm_served.collect(backend, req or request())


async def test_text_streams_word_by_word_and_ends_with_done() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "The sky is blue."}]) as (server, backend):
            got = await collect(backend)
    assert got[:-1] == [TextChunk("The "), TextChunk("sky "), TextChunk("is "), TextChunk("blue.")]
    assert isinstance(got[-1], DoneChunk)
    assert server.completed == 1


async def test_thinking_comes_before_text_as_thinking_chunks() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"thinking": "let me see", "text": "Yes"}]) as (_s, backend):
            got = await collect(backend, request(think=True))
    assert got[:4] == [
        ThinkingChunk("let "),
        ThinkingChunk("me "),
        ThinkingChunk("see"),
        TextChunk("Yes"),
    ]


async def test_tool_calls_arrive_whole_and_get_generated_ids() -> None:
    calls = [
        {"name": "read_file", "arguments": {"path": "a.txt"}},
        {"name": "now", "arguments": {}},
    ]
    with trio.fail_after(TIMEOUT):
        async with served([{"tool_calls": calls}]) as (server, backend):
            got = await collect(backend)
    chunk = next(c for c in got if isinstance(c, ToolCallsChunk))
    assert [(c.name, c.arguments) for c in chunk.calls] == [
        ("read_file", {"path": "a.txt"}),
        ("now", {}),
    ]
    ids = [c.id for c in chunk.calls]
    assert all(ids) and len(set(ids)) == 2
    assert all(c.parse_error is None for c in chunk.calls)


async def test_cut_tool_arguments_become_a_parse_error_not_a_crash() -> None:
    reply = {
        "tool_calls": [{"name": "write", "arguments": '{"path": "a.txt", "text": "ab'}],
        "done_reason": "length",
    }
    with trio.fail_after(TIMEOUT):
        async with served([reply]) as (_s, backend):
            got = await collect(backend)
    (call,) = next(c for c in got if isinstance(c, ToolCallsChunk)).calls
    assert call.name == "write" and call.arguments == {}
    assert call.parse_error and "not valid JSON" in call.parse_error and "a.txt" in call.parse_error
    assert got[-1] == DoneChunk(
        model="qwen3:8b",
        prompt_tokens=rough_tokens(request().messages),  # the fake's count of the prompt
        completion_tokens=1,
        done_reason="length",
    )


async def test_usage_resolved_model_and_length_are_reported() -> None:
    reply = {
        "text": "cut",
        "model": "qwen3:8b-q4",
        "prompt_tokens": 1234,
        "completion_tokens": 56,
        "done_reason": "length",
    }
    with trio.fail_after(TIMEOUT):
        async with served([reply]) as (_s, backend):
            got = await collect(backend)
    assert got[-1] == DoneChunk(
        model="qwen3:8b-q4", prompt_tokens=1234, completion_tokens=56, done_reason="length"
    )


async def test_request_body_is_ollama_shaped_and_drops_internal_keys() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi", "_seq": 3},
        {
            "role": "assistant",
            "content": "",
            "thinking": "hm",
            "is_plan": False,
            "tool_calls": [{"id": "c1", "name": "f", "arguments": {"x": 1}}],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"},
    ]
    req = request(messages=messages, tools=tools, think=True, options={"num_ctx": 16384})
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "ok"}, {"text": "ok"}]) as (server, backend):
            await collect(backend, req)
            await collect(backend, request())
    first, second = (r["body"] for r in server.chat_requests)
    assert first == {
        "model": "qwen3:8b",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}],
            },
            {"role": "tool", "content": "42", "tool_name": "f"},
        ],
        "stream": True,
        "tools": tools,
        "think": True,
        "options": {"num_ctx": 16384},
        "keep_alive": "5m",
    }
    assert "tools" not in second and "think" not in second


def test_json_text_arguments_in_history_are_sent_as_objects() -> None:
    msg = {"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": '{"a": 2}'}]}
    assert to_ollama_message(msg)["tool_calls"] == [
        {"function": {"name": "f", "arguments": {"a": 2}}}
    ]


def test_tool_call_objects_are_converted_too() -> None:
    msg = {"role": "assistant", "content": None, "tool_calls": [ToolCall("c", "f", {"a": 1})]}
    assert to_ollama_message(msg) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
    }


@pytest.mark.parametrize(
    ("status", "body", "quoted"),
    [
        (404, "model 'nope' not found", "model 'nope' not found"),
        (
            400,
            "registry.ollama.ai/library/gemma:2b does not support tools",
            "does not support tools",
        ),
        (400, '"gemma" does not support thinking', "does not support thinking"),
        (503, "server busy, please try again.  maximum pending requests exceeded", "server busy"),
    ],
)
async def test_http_errors_quote_the_error_text(status: int, body: str, quoted: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"status": status, "error_body": body}]) as (server, backend):
            with pytest.raises(LLMStatusError) as info:
                await collect(backend)
    assert info.value.status == status
    assert info.value.body == body  # the `error` string, not the JSON around it
    assert quoted in str(info.value) and server.url in str(info.value)


async def test_a_plain_text_error_body_is_quoted_as_is() -> None:
    reply = {"status": 502, "error_body": "Bad Gateway (nginx)", "error_raw": True}
    with trio.fail_after(TIMEOUT):
        async with served([reply]) as (_s, backend):
            with pytest.raises(LLMStatusError, match=r"HTTP 502 .*Bad Gateway \(nginx\)"):
                await collect(backend)


async def test_a_malformed_line_is_an_error_quoting_it() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "a b", "malformed": "<html>oops"}]) as (_s, backend):
            with pytest.raises(LLMMalformedStreamError, match="<html>oops"):
                await collect(backend)


async def test_an_error_line_in_a_200_stream_is_a_stream_error() -> None:
    reply = {"text": "a", "error_line": "llama runner process has terminated"}
    with trio.fail_after(TIMEOUT):
        async with served([reply]) as (_s, backend):
            with pytest.raises(LLMStreamError, match="llama runner process has terminated"):
                await collect(backend)


async def test_a_connection_dropped_mid_stream_is_a_connection_error_naming_the_url() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "a b c d", "drop_after": 2}]) as (server, backend):
            got: list[LLMChunk] = []
            with pytest.raises(LLMConnectionError) as info:
                async with backend.stream_chat(request()) as chunks:
                    async for c in chunks:
                        got.append(c)
    assert got == [TextChunk("a "), TextChunk("b ")]
    assert f"{server.url}/api/chat" in str(info.value)
    assert server.disconnects == []  # the server dropped it, the client did not leave


async def test_script_exhausted_is_http_500() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "once"}]) as (_s, backend):
            await collect(backend)
            with pytest.raises(LLMStatusError, match="script exhausted") as info:
                await collect(backend)
    assert info.value.status == 500


async def test_connection_refused_names_the_url() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with trio.fail_after(TIMEOUT):
        async with httpx.AsyncClient() as client:
            backend = OllamaBackend(client, f"http://127.0.0.1:{port}/")
            with pytest.raises(
                LLMConnectionError, match=f"cannot connect .*127.0.0.1:{port}/api/chat"
            ):
                await collect(backend)


async def test_factory_picks_the_backend_and_rejects_unknown_names() -> None:
    settings = Settings(llm_url="http://127.0.0.1:9", keep_alive="1h", llm_connect_timeout=3)
    async with make_client(settings) as client:
        assert client.timeout.connect == 3 and client.timeout.read is None
        ollama = make_backend(settings, client)
        assert isinstance(ollama, OllamaBackend) and ollama.keep_alive == "1h"
        openai = make_backend(Settings(llm_backend="openai", llm_api_key="k"), client)
        assert isinstance(openai, OpenAIBackend)
        with pytest.raises(ConfigError, match="NAVI_LLM_BACKEND='llamacpp'.*ollama, openai"):
            make_backend(Settings(llm_backend="llamacpp"), client)


async def test_aclose_closes_the_client() -> None:
    client = httpx.AsyncClient()
    await OllamaBackend(client, "http://127.0.0.1:9").aclose()
    assert client.is_closed


# --- the line parser, without I/O ----------------------------------------------------


def test_parser_reports_a_stream_that_ends_before_done() -> None:
    parser = OllamaParser("m", "http://x/api/chat")
    parser.feed(json.dumps({"message": {"content": "hi"}, "done": False}))
    with pytest.raises(LLMConnectionError, match="http://x/api/chat"):
        parser.finish()


def test_parser_keeps_ids_ollama_sends_and_flags_non_object_arguments() -> None:
    line = json.dumps(
        {
            "message": {
                "tool_calls": [
                    {"id": "call_7", "function": {"name": "f", "arguments": {"a": 1}}},
                    {"function": {"name": "g", "arguments": "[1, 2]"}},
                    {"function": {"arguments": {}}},
                ]
            }
        }
    )
    (chunk,) = OllamaParser("m").feed(line)
    assert isinstance(chunk, ToolCallsChunk)
    first, second, third = chunk.calls
    assert first == ToolCall("call_7", "f", {"a": 1})
    assert second.arguments == {} and "not a JSON object" in (second.parse_error or "")
    assert "no function name" in (third.parse_error or "")


@given(
    st.one_of(
        st.text(max_size=200),
        st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=10),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(
                        [
                            "message",
                            "content",
                            "thinking",
                            "tool_calls",
                            "function",
                            "name",
                            "arguments",
                            "done",
                            "done_reason",
                            "error",
                            "model",
                            "eval_count",
                            "prompt_eval_count",
                            "id",
                        ]
                    ),
                    inner,
                    max_size=5,
                )
            ),
            max_leaves=20,
        ).map(json.dumps),
    )
)
def test_fuzzed_lines_give_chunks_or_an_llm_error_never_anything_else(line: str) -> None:
    parser = OllamaParser("m", "http://x")
    try:
        chunks = parser.feed(line)
        parser.finish()
    except LLMError:
        return
    for chunk in chunks:
        assert isinstance(chunk, TextChunk | ThinkingChunk | ToolCallsChunk | DoneChunk)


@pytest.mark.parametrize("dialect", [OllamaBackend, OpenAIBackend])
async def test_done_comes_after_the_body_ended_so_stopping_there_is_no_disconnect(
    dialect: type[OllamaBackend] | type[OpenAIBackend],
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": "a b"}] * 3) as server:
            async with httpx.AsyncClient() as client:
                backend = dialect(client, server.url)
                for _ in range(3):
                    async with backend.stream_chat(request()) as chunks:
                        async for chunk in chunks:
                            if isinstance(chunk, DoneChunk):
                                break
    assert server.completed == 3 and server.disconnects == []
    # The body was read to its end each time, so httpx kept the one connection alive.
    assert server.connections == 1
