"""ScriptedBackend: the in-process twin of the HTTP backends against the fake server.

Anything that sleeps uses the autojump clock; every test has an absolute timeout.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
import trio.testing

from navi_trio.errors import (
    ConfigError,
    LLMConnectionError,
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
    ToolCallsChunk,
)
from navi_trio.llm.ollama import OllamaBackend
from navi_trio.llm.script import Reply, parse_reply, rough_tokens
from navi_trio.llm.scripted import ScriptedBackend
from navi_trio.testing.fake_llm import open_fake_llm

REQ = ChatRequest(messages=[{"role": "user", "content": "12345678"}], model="m")


async def collect(backend: ScriptedBackend, req: ChatRequest = REQ) -> list[LLMChunk]:
    out: list[LLMChunk] = []
    with trio.fail_after(1000):
        async with backend.stream_chat(req) as chunks:
            async for c in chunks:
                out.append(c)
    return out


async def test_plays_replies_in_order_with_the_same_chunks_as_http() -> None:
    backend = ScriptedBackend(
        [
            {"thinking": "hm", "text": "hi there", "model": "m-resolved"},
            Reply(
                tool_calls=[
                    parse_reply({"tool_calls": [{"name": "f", "arguments": {"a": 1}}]}).tool_calls[
                        0
                    ]
                ]
            ),
        ]
    )
    first = await collect(backend)
    assert first == [
        ThinkingChunk("hm"),
        TextChunk("hi "),
        TextChunk("there"),
        DoneChunk(
            model="m-resolved",
            prompt_tokens=rough_tokens(REQ.messages),
            completion_tokens=3,
            done_reason="stop",
        ),
    ]
    second = await collect(backend)
    assert isinstance(second[0], ToolCallsChunk)
    (call,) = second[0].calls
    assert (call.name, call.arguments) == ("f", {"a": 1}) and call.id
    assert backend.requests == [REQ, REQ] and backend.completed == 2


async def test_exhausted_script_fails_like_http_500_and_loop_cycles() -> None:
    backend = ScriptedBackend([{"text": "once"}])
    await collect(backend)
    with pytest.raises(LLMStatusError, match="script exhausted") as info:
        await collect(backend)
    assert info.value.status == 500
    looping = ScriptedBackend([{"text": "a"}, {"text": "b"}], loop=True)
    texts = [(await collect(looping))[0] for _ in range(3)]
    assert texts == [TextChunk("a"), TextChunk("b"), TextChunk("a")]


async def test_add_replies_extends_the_script_at_run_time() -> None:
    backend = ScriptedBackend()
    backend.add_replies({"text": "late"})
    assert (await collect(backend))[0] == TextChunk("late")


@pytest.mark.parametrize(
    ("reply", "error", "match"),
    [
        (
            {"status": 404, "error_body": "model 'x' not found"},
            LLMStatusError,
            "model 'x' not found",
        ),
        ({"text": "a", "malformed": True}, LLMMalformedStreamError, "not JSON"),
        ({"text": "a", "error_line": "boom"}, LLMStreamError, "boom"),
        ({"text": "a b c", "drop_after": 1}, LLMConnectionError, "dropped"),
    ],
)
async def test_scripted_failures_raise_the_errors_http_would(
    reply: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        await collect(ScriptedBackend([reply]))


async def test_drop_after_delivers_that_many_chunks_first() -> None:
    got: list[LLMChunk] = []
    with pytest.raises(LLMConnectionError):
        async with ScriptedBackend([{"text": "a b c", "drop_after": 2}]).stream_chat(REQ) as chunks:
            async for c in chunks:
                got.append(c)
    assert got == [TextChunk("a "), TextChunk("b ")]


async def test_delays_follow_the_virtual_clock(autojump_clock: trio.testing.MockClock) -> None:
    backend = ScriptedBackend([{"text": "a b", "delay_first": 30, "delay_chunk": 5}])
    times = []
    async with backend.stream_chat(REQ) as chunks:
        async for _ in chunks:
            times.append(trio.current_time())
    assert times == pytest.approx([30, 35, 40])


async def test_stall_never_finishes_until_cancelled(autojump_clock: trio.testing.MockClock) -> None:
    backend = ScriptedBackend([{"text": "a", "stall": True}])
    got: list[LLMChunk] = []
    with trio.move_on_after(10_000) as scope:
        async with backend.stream_chat(REQ) as chunks:
            async for c in chunks:
                got.append(c)
    assert scope.cancelled_caught and got == [TextChunk("a")]


def test_bad_replies_are_rejected_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="unknown key 'txt'"):
        ScriptedBackend([{"txt": "x"}])
    with pytest.raises(
        ConfigError, match=r"reply 1: .*expected float \(a number\), got .soon. @ \$.delay_first"
    ):
        ScriptedBackend([{}, {"delay_first": "soon"}])


@pytest.mark.parametrize(
    "error_body",
    [
        "model 'x' not found",
        {"error": "busy"},
        {"error": {"message": "no tools", "type": "invalid_request"}},
        {"detail": "odd proxy"},
    ],
)
async def test_status_errors_quote_the_same_text_as_the_http_backend(error_body: Any) -> None:
    reply = {"status": 400, "error_body": error_body}
    with pytest.raises(LLMStatusError) as scripted:
        await collect(ScriptedBackend([reply]))
    with trio.fail_after(10):
        async with open_fake_llm([reply]) as server, httpx.AsyncClient() as client:
            with pytest.raises(LLMStatusError) as http:
                async with OllamaBackend(client, server.url).stream_chat(REQ) as chunks:
                    await chunks.receive()
    assert scripted.value.body == http.value.body
