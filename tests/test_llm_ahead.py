"""The HTTP backends read ahead of a slow consumer and merge the deltas that wait.

Rules for this module: loopback only, port 0 (the fake LLM server in the same trio run);
no sleeps: "the consumer is behind" is `wait_all_tasks_blocked` after its first chunk
(by then the whole body has been read); every test has an absolute timeout.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from navi_trio.errors import LLMConnectionError
from navi_trio.llm.ahead import MAX_WAITING, merge_chunks
from navi_trio.llm.base import (
    ChatRequest,
    DoneChunk,
    LLMBackend,
    LLMChunk,
    TextChunk,
    ThinkingChunk,
    ToolCallsChunk,
)
from navi_trio.llm.guard import guarded_stream
from navi_trio.llm.ollama import OllamaBackend
from navi_trio.llm.openai import OpenAIBackend
from navi_trio.testing.fake_llm import open_fake_llm

REQUEST = ChatRequest(messages=[{"role": "user", "content": "hi"}], model="m")
WORDS = [f"w{i}" for i in range(500)]
DIALECTS = ["ollama", "openai"]


@asynccontextmanager
async def backend_for(replies: list[dict[str, Any]], dialect: str) -> AsyncIterator[LLMBackend]:
    async with open_fake_llm(replies) as server:
        async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5)) as client:
            if dialect == "ollama":
                yield OllamaBackend(client, server.url)
            else:
                yield OpenAIBackend(client, server.url)


async def read_behind(backend: LLMBackend) -> tuple[list[LLMChunk], BaseException | None]:
    """Take one chunk, fall behind until the whole body is read, then drain."""
    got: list[LLMChunk] = []
    error: BaseException | None = None
    try:
        async with guarded_stream(
            backend, REQUEST, first_chunk_timeout=30, chunk_timeout=30
        ) as chunks:
            got.append(await chunks.receive())
            await trio.testing.wait_all_tasks_blocked()
            async for chunk in chunks:
                got.append(chunk)
    except LLMConnectionError as exc:
        error = exc
    return got, error


def texts(chunks: list[LLMChunk], kind: type[TextChunk | ThinkingChunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, kind))


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_consumer_behind_gets_the_waiting_deltas_merged_in_order(dialect: str) -> None:
    reply = {"thinking": "hmm let me see", "text": " ".join(WORDS)}
    with trio.fail_after(30):
        async with backend_for([reply], dialect) as backend:
            got, error = await read_behind(backend)
    assert error is None
    assert texts(got, ThinkingChunk) == "hmm let me see"
    assert texts(got, TextChunk) == " ".join(WORDS)
    # Far fewer chunks than words: the deltas that waited came as one.
    deltas = [c for c in got if isinstance(c, TextChunk | ThinkingChunk)]
    assert len(deltas) < len(WORDS) // 10
    # Thinking never merges with the text after it, and the done chunk comes last.
    kinds = [type(c) for c in deltas]
    assert kinds.index(TextChunk) > max(i for i, k in enumerate(kinds) if k is ThinkingChunk)
    assert isinstance(got[-1], DoneChunk)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_consumer_that_keeps_up_gets_every_chunk_as_parsed(dialect: str) -> None:
    with trio.fail_after(30):
        async with backend_for([{"text": " ".join(WORDS[:50])}], dialect) as backend:
            got: list[LLMChunk] = []
            async with guarded_stream(
                backend, REQUEST, first_chunk_timeout=30, chunk_timeout=30
            ) as chunks:
                async for chunk in chunks:
                    got.append(chunk)
    words = [c for c in got if isinstance(c, TextChunk)]
    assert "".join(c.text for c in words) == " ".join(WORDS[:50])


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_dropped_stream_delivers_what_came_before_its_error(dialect: str) -> None:
    with trio.fail_after(30):
        async with backend_for([{"text": " ".join(WORDS), "drop_after": 200}], dialect) as be:
            got, error = await read_behind(be)
    assert isinstance(error, LLMConnectionError)
    assert texts(got, TextChunk) == "".join(w + " " for w in WORDS[:200])


async def test_tool_calls_and_deltas_of_other_kinds_never_merge() -> None:
    call = ToolCallsChunk(())
    assert merge_chunks(TextChunk("a"), TextChunk("b")) == TextChunk("ab")
    assert merge_chunks(ThinkingChunk("a"), ThinkingChunk("b")) == ThinkingChunk("ab")
    assert merge_chunks(TextChunk("a"), ThinkingChunk("b")) is None
    assert merge_chunks(call, call) is None
    assert merge_chunks(TextChunk("a"), DoneChunk()) is None
    assert MAX_WAITING >= 2
