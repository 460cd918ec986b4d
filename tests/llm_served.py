"""The fake LLM over real HTTP with a backend talking to it, for the backends' tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx

from navi_trio.llm.base import ChatRequest, LLMChunk
from navi_trio.llm.factory import make_client
from navi_trio.llm.ollama import OllamaBackend
from navi_trio.llm.openai import OpenAIBackend
from navi_trio.settings import Settings
from navi_trio.testing.fake_llm import FakeLLMServer, open_fake_llm


@asynccontextmanager
async def served(
    replies: list[dict[str, Any]],
    dialect: str = "ollama",
    *,
    server: Mapping[str, Any] | None = None,
    transport: str | None = None,
    **backend_options: Any,
) -> AsyncIterator[tuple[FakeLLMServer, Any]]:
    """The fake LLM playing `replies` (`server`: its options), and a backend of `dialect`
    (`backend_options`: its options) on a plain httpx client, or on `make_client`'s client
    for `transport`."""
    async with open_fake_llm(replies, **(server or {})) as fake, _client(transport) as client:
        backend = OllamaBackend if dialect == "ollama" else OpenAIBackend
        yield fake, backend(client, fake.url, **backend_options)


def _client(transport: str | None) -> AbstractAsyncContextManager[httpx.AsyncClient]:
    if transport is None:
        return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5))
    return make_client(Settings(llm_transport=transport, llm_connect_timeout=5))


async def collect(backend: Any, req: ChatRequest) -> list[LLMChunk]:
    """Every chunk of one streamed answer."""
    async with backend.stream_chat(req) as chunks:
        return [chunk async for chunk in chunks]
