"""Both LLM transports (NAVI_LLM_TRANSPORT=h11, our own on h11, and httpx's) behave the
same for a backend: a streamed chat, keep-alive reuse, the one retry on a connection the
server closed as it was reused, drops, garbage and error statuses, the guard's timeouts,
a stop mid-stream (the server sees the connection go). Also how the setting is read.

Rules: loopback only, port 0 (the fake LLM server in the same trio run); the autojump
clock where a timeout matters; every test has an absolute timeout.
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
    ConfigError,
    LLMChunkTimeout,
    LLMConnectionError,
    LLMFirstChunkTimeout,
    LLMMalformedStreamError,
    LLMStatusError,
)
from navi_trio.llm.base import ChatRequest, DoneChunk, LLMBackend, LLMChunk, TextChunk
from navi_trio.llm.client import LLMClient
from navi_trio.llm.factory import make_client
from navi_trio.llm.guard import guarded_stream
from navi_trio.llm.ollama import OllamaBackend
from navi_trio.llm.shards import ShardedClient
from navi_trio.llm.transport import H11Transport
from navi_trio.settings import Settings
from navi_trio.testing.fake_llm import FakeLLMServer

TIMEOUT = 20
LIMIT = 600  # virtual seconds, under the autojump clock
REQUEST = ChatRequest(messages=[{"role": "user", "content": "hi"}], model="m")
TRANSPORTS = ["h11", "httpx"]
DIALECTS = ["ollama", "openai"]


def served(
    replies: list[dict[str, Any]], transport: str, dialect: str = "ollama"
) -> AbstractAsyncContextManager[tuple[FakeLLMServer, LLMBackend]]:
    """The fake LLM playing `replies`, and a backend on `make_client`'s client."""
    return llm_served.served(replies, dialect, transport=transport)


async def text_of(backend: LLMBackend, first: float = 90, chunk: float = 60) -> str:
    """The streamed answer's text (through the guard); its last chunk is the DoneChunk."""
    got: list[LLMChunk] = []
    async with guarded_stream(
        backend, REQUEST, first_chunk_timeout=first, chunk_timeout=chunk
    ) as chunks:
        async for c in chunks:
            got.append(c)
    assert isinstance(got[-1], DoneChunk)
    return "".join(c.text for c in got if isinstance(c, TextChunk))


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_streamed_chats_reuse_one_keep_alive_connection(transport: str, dialect: str) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "one two three"},
        {"text": "four"},
        {"text": "five six"},
    ]
    with trio.fail_after(TIMEOUT):
        async with served(replies, transport, dialect) as (server, backend):
            assert [await text_of(backend) for _ in range(3)] == [
                "one two three",
                "four",
                "five six",
            ]
            assert server.connections == 1
            await server.wait_completed(3)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_connection_closed_as_it_is_reused_gets_the_request_sent_once_more(
    transport: str,
) -> None:
    replies: list[dict[str, Any]] = [{"text": "first"}, {"hang_up": True}, {"text": "second"}]
    with trio.fail_after(TIMEOUT):
        async with served(replies, transport) as (server, backend):
            assert await text_of(backend) == "first"
            assert await text_of(backend) == "second"
            assert server.hang_ups == 1
            assert server.connections == 2  # the retry took a fresh one


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_drop_mid_stream_is_a_connection_error_and_its_connection_is_not_reused(
    transport: str,
) -> None:
    replies: list[dict[str, Any]] = [{"text": "a b c d", "drop_after": 2}, {"text": "next"}]
    with trio.fail_after(TIMEOUT):
        async with served(replies, transport) as (server, backend):
            with pytest.raises(LLMConnectionError, match="dropped") as info:
                await text_of(backend)
            assert server.url in str(info.value)
            assert await text_of(backend) == "next"
            assert server.connections == 2


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_garbage_in_the_stream_is_a_malformed_stream_error(transport: str) -> None:
    replies: list[dict[str, Any]] = [{"text": "ok", "malformed": "{not json"}, {"text": "after"}]
    with trio.fail_after(TIMEOUT):
        async with served(replies, transport) as (_, backend):
            with pytest.raises(LLMMalformedStreamError, match="not JSON"):
                await text_of(backend)
            assert await text_of(backend) == "after"


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_error_status_quotes_the_body_and_keeps_the_connection(
    transport: str, dialect: str
) -> None:
    replies: list[dict[str, Any]] = [
        {"status": 503, "error_body": "model is loading"},
        {"text": "ready"},
    ]
    with trio.fail_after(TIMEOUT):
        async with served(replies, transport, dialect) as (server, backend):
            with pytest.raises(LLMStatusError, match="model is loading") as info:
                await text_of(backend)
            assert info.value.status == 503
            assert await text_of(backend) == "ready"
            assert server.connections == 1  # a whole error answer leaves it reusable


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_nobody_listening_is_cannot_connect(transport: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with served([], transport) as (server, _):
            url = server.url
        # The server is gone: its port refuses.
        async with make_client(Settings(llm_transport=transport, llm_connect_timeout=5)) as c:
            with pytest.raises(LLMConnectionError, match="cannot connect"):
                await text_of(OllamaBackend(c, url))


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_guards_first_chunk_and_chunk_timeouts_fire_and_close_the_connection(
    autojump_clock: trio.testing.MockClock, transport: str, dialect: str
) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "too late", "delay_first": 100},
        {"text": "one two", "stall": True, "delay_chunk": 1},
        {"text": "fine"},
    ]
    with trio.fail_after(LIMIT):
        async with served(replies, transport, dialect) as (server, backend):
            start = trio.current_time()
            with pytest.raises(LLMFirstChunkTimeout):
                await text_of(backend, first=90, chunk=60)
            assert trio.current_time() - start == pytest.approx(90, abs=1)
            await server.wait_disconnects(1)
            start = trio.current_time()
            with pytest.raises(LLMChunkTimeout):
                await text_of(backend, first=90, chunk=30)
            await server.wait_disconnects(2)
            assert trio.current_time() - start == pytest.approx(31, abs=1)
            assert await text_of(backend) == "fine"
            assert server.connections == 3  # neither cut connection was reused


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_stop_mid_stream_closes_the_connection_at_once(
    autojump_clock: trio.testing.MockClock, transport: str
) -> None:
    replies: list[dict[str, Any]] = [{"text": "a b c d e f", "delay_chunk": 1}, {"text": "again"}]
    with trio.fail_after(LIMIT):
        async with served(replies, transport) as (server, backend):
            with trio.CancelScope() as stop:
                async with backend.stream_chat(REQUEST) as chunks:
                    async for chunk in chunks:
                        if isinstance(chunk, TextChunk):
                            stop.cancel()  # the user's Stop
            assert stop.cancelled_caught
            await server.wait_disconnects(1)
            assert server.disconnects[0]["chunks_sent"] < 6
            assert await text_of(backend) == "again"


# --- the setting ------------------------------------------------------------------------


def test_the_default_transport_is_our_own_on_h11(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("all_proxy", raising=False)
    client = make_client(Settings.from_env({}))
    assert type(client) is LLMClient
    assert isinstance(client._transport, H11Transport)
    httpx_one = make_client(Settings.from_env({"NAVI_LLM_TRANSPORT": "httpx"}))
    assert isinstance(httpx_one, ShardedClient)
    assert Settings.from_env({"NAVI_LLM_TRANSPORT": " H11 "}).llm_transport == "h11"


def test_an_unknown_transport_is_refused_naming_the_variable_and_the_choices() -> None:
    with pytest.raises(
        ConfigError, match=r"NAVI_LLM_TRANSPORT='curl': expected one of: h11, httpx"
    ):
        Settings.from_env({"NAVI_LLM_TRANSPORT": "curl"})
    with pytest.raises(ConfigError, match="NAVI_LLM_TRANSPORT"):
        Settings(llm_transport="h2")


def test_a_proxy_in_the_environment_keeps_httpxs_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ours speaks to no proxy, and httpx ignores the proxy variables once a client is
    given a transport: with one set, the client must stay on httpx's."""
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    client = make_client(Settings.from_env({}))
    assert isinstance(client, ShardedClient)
    assert isinstance(client, httpx.AsyncClient)
