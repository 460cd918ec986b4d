"""The stream guard: hard timeouts on an LLM stream, done with cancel scopes.

Ollama sends nothing while it prefills a long prompt, and a stuck GPU can go silent
mid-answer. The guard bounds the wait for the first chunk by ``first_chunk_timeout``
and every later gap by ``chunk_timeout`` (``LLM_STREAM_FIRST_CHUNK_TIMEOUT`` /
``LLM_STREAM_CHUNK_TIMEOUT``). On a timeout it raises `LLMFirstChunkTimeout` /
`LLMChunkTimeout`; on that or any cancellation (the user's Stop cancels the run's
scope) the backend's ``async with`` exits, which closes the HTTP response: the server
sees the connection go and the GPU goes idle. No polling: Stop during prefill is just
a cancel scope, effective at once.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import trio

from navi_trio.errors import LLMChunkTimeout, LLMFirstChunkTimeout
from navi_trio.llm.base import ChatRequest, LLMBackend, LLMChunk
from navi_trio.llm.http import chunk_channel


@chunk_channel
async def guarded_stream(
    backend: LLMBackend,
    request: ChatRequest,
    *,
    first_chunk_timeout: float,
    chunk_timeout: float,
) -> AsyncGenerator[LLMChunk, None]:
    """``async with guarded_stream(...) as chunks:`` — the backend's stream, with timeouts.

    Each wait is measured from when the consumer asks for the next chunk, so time the
    consumer spends on a chunk never counts against the model.
    """
    async with backend.stream_chat(request) as chunks:
        first = True
        while True:
            limit = first_chunk_timeout if first else chunk_timeout
            with trio.move_on_after(limit) as scope:
                try:
                    chunk = await chunks.receive()
                except trio.EndOfChannel:
                    return
            if scope.cancelled_caught:
                raise LLMFirstChunkTimeout(limit) if first else LLMChunkTimeout(limit)
            first = False
            yield chunk
