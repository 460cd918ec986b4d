"""OpenAIBackend against the fake LLM server: real HTTP, real server-sent events.

Rules: loopback only, port 0; every I/O test has an absolute timeout; nothing sleeps
for real.
"""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from typing import Any

import llm_served
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from navi_trio.errors import (
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
from navi_trio.llm.openai import OpenAIBackend, OpenAIParser, chat_completions_url
from navi_trio.testing.fake_llm import FakeLLMServer

TIMEOUT = 10


def request(**kw: Any) -> ChatRequest:
    kw.setdefault("messages", [{"role": "user", "content": "hello there"}])
    kw.setdefault("model", "gpt-oss:20b")
    return ChatRequest(**kw)


def served(
    replies: list[dict[str, Any]], api_key: str = ""
) -> AbstractAsyncContextManager[tuple[FakeLLMServer, OpenAIBackend]]:
    return llm_served.served(replies, "openai", api_key=api_key)


async def collect(backend: OpenAIBackend, req: ChatRequest | None = None) -> list[LLMChunk]:
    return await llm_served.collect(backend, req or request())


async def test_text_streams_word_by_word_with_usage_from_the_last_chunk() -> None:
    reply = {"text": "Paris is in France", "prompt_tokens": 321, "completion_tokens": 4}
    with trio.fail_after(TIMEOUT):
        async with served([reply]) as (server, backend):
            got = await collect(backend)
    assert got == [
        TextChunk("Paris "),
        TextChunk("is "),
        TextChunk("in "),
        TextChunk("France"),
        DoneChunk(model="gpt-oss:20b", prompt_tokens=321, completion_tokens=4, done_reason="stop"),
    ]
    assert server.completed == 1


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
async def test_thinking_is_read_from_either_reasoning_field(field: str) -> None:
    reply = {"thinking": "step one", "text": "done", "thinking_field": field}
    with trio.fail_after(TIMEOUT):
        async with served([reply]) as (_s, backend):
            got = await collect(backend)
    assert got[:3] == [ThinkingChunk("step "), ThinkingChunk("one"), TextChunk("done")]


async def test_tool_call_fragments_are_assembled_by_index() -> None:
    calls = [
        {"name": "search", "arguments": {"query": "trio nursery", "limit": 3}},
        {"name": "read_file", "arguments": {"path": "/tmp/a b.txt"}},
    ]
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "Looking.", "tool_calls": calls}]) as (server, backend):
            got = await collect(backend)
    (chunk,) = [c for c in got if isinstance(c, ToolCallsChunk)]
    assert [(c.name, c.arguments) for c in chunk.calls] == [
        ("search", {"query": "trio nursery", "limit": 3}),
        ("read_file", {"path": "/tmp/a b.txt"}),
    ]
    assert all(c.id.startswith("call_") for c in chunk.calls)
    assert len({c.id for c in chunk.calls}) == 2
    assert isinstance(got[-1], DoneChunk) and got[-1].done_reason == "tool_calls"


async def test_cut_arguments_become_a_parse_error_and_length_is_reported() -> None:
    reply = {
        "tool_calls": [{"name": "write", "arguments": '{"path": "x", "te'}],
        "done_reason": "length",
        "model": "gpt-oss:20b-resolved",
    }
    with trio.fail_after(TIMEOUT):
        async with served([reply]) as (_s, backend):
            got = await collect(backend)
    (call,) = next(c for c in got if isinstance(c, ToolCallsChunk)).calls
    assert call.arguments == {} and "not valid JSON" in (call.parse_error or "")
    done = got[-1]
    assert isinstance(done, DoneChunk)
    assert (done.done_reason, done.model) == ("length", "gpt-oss:20b-resolved")


async def test_request_body_is_openai_shaped() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "hi", "is_plan": False},
        {
            "role": "assistant",
            "content": "",
            "thinking": "hm",
            "tool_calls": [{"id": "c1", "name": "f", "arguments": {"x": 1}}],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f", "_tokens": 3},
    ]
    req = request(
        messages=messages,
        tools=tools,
        think=True,
        options={"num_ctx": 8192, "temperature": 0.2, "num_predict": 100},
    )
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "ok"}], api_key="sk-test") as (server, backend):
            await collect(backend, req)
    (seen,) = server.chat_requests
    assert seen["path"] == "/v1/chat/completions"
    assert seen["headers"]["authorization"] == "Bearer sk-test"
    assert seen["body"] == {
        "model": "gpt-oss:20b",
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"x": 1}'},
                    }
                ],
            },
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": tools,
        "temperature": 0.2,
        "max_tokens": 100,
    }


def test_base_url_may_already_end_in_v1() -> None:
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("https://api.example.com/v1/") == (
        "https://api.example.com/v1/chat/completions"
    )


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, 'model "nope" not found, try pulling it first'),
        (400, "registry.ollama.ai/library/gemma:2b does not support tools"),
        (503, "server busy, please try again"),
    ],
)
async def test_http_errors_quote_the_error_message(status: int, body: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"status": status, "error_body": body}]) as (_s, backend):
            with pytest.raises(LLMStatusError) as info:
                await collect(backend)
    assert info.value.status == status and info.value.body == body
    assert body in str(info.value)


async def test_malformed_data_is_an_error_quoting_it() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "a", "malformed": True}]) as (_s, backend):
            with pytest.raises(LLMMalformedStreamError, match="this line is cut"):
                await collect(backend)


async def test_an_error_event_in_a_200_stream_is_a_stream_error() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "a", "error_line": "out of memory"}]) as (_s, backend):
            with pytest.raises(LLMStreamError, match="out of memory"):
                await collect(backend)


async def test_a_dropped_connection_is_a_connection_error_naming_the_url() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "a b c", "drop_after": 1}]) as (server, backend):
            with pytest.raises(LLMConnectionError, match=f"{server.url}/v1/chat/completions"):
                await collect(backend)


async def test_script_exhausted_is_http_500() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([]) as (_s, backend):
            with pytest.raises(LLMStatusError, match="script exhausted"):
                await collect(backend)


# --- the line parser, without I/O: the shapes Ollama's compat layer really sends --------


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}"


def test_whole_tool_calls_in_one_chunk_without_ids_get_ids() -> None:
    parser = OpenAIParser("m")
    delta = {
        "tool_calls": [
            {"index": 0, "function": {"name": "f", "arguments": '{"a": 1}'}},
            {"index": 1, "function": {"name": "g", "arguments": {"b": 2}}},
        ]
    }
    assert parser.feed(sse({"choices": [{"delta": delta, "finish_reason": "tool_calls"}]})) == []
    calls, done = parser.feed("data: [DONE]")
    assert isinstance(calls, ToolCallsChunk) and isinstance(done, DoneChunk)
    assert [(c.name, c.arguments) for c in calls.calls] == [("f", {"a": 1}), ("g", {"b": 2})]
    assert all(c.id for c in calls.calls)


def test_fragments_without_an_index_follow_their_id_or_the_call_opened_last() -> None:
    # Servers that send no index: a new id opens the next call even at position 0, and a
    # fragment with neither id nor index continues the call opened last.
    parser = OpenAIParser("m")
    frags = [
        {"id": "a", "function": {"name": "f", "arguments": '{"p": '}},
        {"function": {"arguments": "1}"}},
        {"id": "b", "function": {"name": "g", "arguments": '{"q": '}},
        {"function": {"arguments": "2}"}},
    ]
    for frag in frags:
        assert parser.feed(sse({"choices": [{"delta": {"tool_calls": [frag]}}]})) == []
    parser.feed(sse({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}))
    calls, _done = parser.feed("data: [DONE]")
    assert isinstance(calls, ToolCallsChunk)
    assert [(c.id, c.name, c.arguments) for c in calls.calls] == [
        ("a", "f", {"p": 1}),
        ("b", "g", {"q": 2}),
    ]


def test_a_finish_reason_without_done_marker_still_completes() -> None:
    parser = OpenAIParser("m")
    parser.feed(
        sse({"model": "m2", "choices": [{"delta": {"content": "x"}, "finish_reason": "stop"}]})
    )
    assert parser.finish() == [DoneChunk(model="m2", done_reason="stop")]


def test_ending_without_finish_is_a_connection_error_and_comments_are_ignored() -> None:
    parser = OpenAIParser("m", "http://h/v1/chat/completions")
    assert parser.feed(": keep-alive") == [] and parser.feed("event: message") == []
    assert parser.feed(sse({"choices": [{"delta": {"content": "x"}}]})) == [TextChunk("x")]
    with pytest.raises(LLMConnectionError, match="http://h/v1/chat/completions"):
        parser.finish()


def test_a_line_that_is_not_sse_is_malformed() -> None:
    with pytest.raises(LLMMalformedStreamError, match="not server-sent events"):
        OpenAIParser("m").feed('{"choices": []}')


def test_tool_call_objects_in_history_become_json_strings() -> None:
    from navi_trio.llm.openai import to_openai_message

    out = to_openai_message(
        {"role": "assistant", "content": None, "tool_calls": [ToolCall("c", "f", {"a": 1})]}
    )
    assert out == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
        ],
    }


_keys = st.sampled_from(
    [
        "choices",
        "delta",
        "content",
        "reasoning",
        "reasoning_content",
        "tool_calls",
        "index",
        "id",
        "function",
        "name",
        "arguments",
        "finish_reason",
        "usage",
        "prompt_tokens",
        "model",
        "error",
    ]
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=25,
)


@given(
    st.lists(
        st.one_of(
            st.text(max_size=100),
            _json.map(sse),
            st.binary(max_size=100).map(lambda b: "data: " + b.decode("latin-1")),
        ),
        max_size=6,
    )
)
def test_fuzzed_events_give_chunks_or_an_llm_error_never_anything_else(lines: list[str]) -> None:
    parser = OpenAIParser("m", "http://x")
    chunks: list[LLMChunk] = []
    try:
        for line in lines:
            chunks += parser.feed(line)
        chunks += parser.finish()
    except LLMError:
        return
    for chunk in chunks:
        assert isinstance(chunk, TextChunk | ThinkingChunk | ToolCallsChunk | DoneChunk)
