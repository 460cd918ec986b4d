"""The stream guard: hard timeouts on an LLM stream, done with cancel scopes.

Ollama sends nothing while it prefills a long prompt, and a stuck GPU can go silent
mid-answer. The guard bounds the wait for the first chunk by ``first_chunk_timeout``
and every later gap by ``chunk_timeout`` (``LLM_STREAM_FIRST_CHUNK_TIMEOUT`` /
``LLM_STREAM_CHUNK_TIMEOUT``). A timeout is for silence, not work: a `WorkingChunk`
(the embedded model's own steps) restarts the wait it came in, and the first chunk of
output is still awaited under the first-chunk timeout. On a timeout it raises
`LLMFirstChunkTimeout` / `LLMChunkTimeout`; on that or any cancellation (the user's Stop
cancels the run's scope) the backend's ``async with`` exits, which closes the HTTP
response: the server sees the connection go and the GPU goes idle. No polling: Stop
during prefill is just a cancel scope, effective at once.

The guard is a wrapper around the backend's channel, not a channel of its own: each
``receive`` runs in the consumer's task under the stream's one cancel scope, its
deadline moved for that wait, so a chunk costs no extra task hop and no scope of its
own (a second producer task would add a nursery per call and two task switches per
chunk, for nothing the cancel scope does not already give).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from navi_trio.errors import LLMChunkTimeout, LLMFirstChunkTimeout
from navi_trio.llm.base import ChatRequest, LLMBackend, LLMChunk, WorkingChunk


class _Guarded(trio.abc.ReceiveChannel[LLMChunk]):
    """The backend's channel, each receive bounded by the first-chunk or chunk timeout.

    One cancel scope for the whole stream (a scope a receive would cost more than the
    rest of the guard): a receive moves its deadline to now + the limit, and an error or
    the end moves it back to never. A chunk received leaves it where it is: a consumer
    that works on the chunk without waiting (the turn's stream loop only emits, a plain
    call) meets no checkpoint before its next receive moves the deadline again, so
    that time never counts; a consumer that waits between receives waits under the
    deadline of the receive before. So receive in the task that entered the stream, or
    in a task it started inside.
    """

    def __init__(
        self, chunks: trio.abc.ReceiveChannel[LLMChunk], first: float, later: float
    ) -> None:
        self._chunks = chunks
        self._limit = first
        self._later = later
        self._first = True
        self.scope = trio.CancelScope()
        self._now = trio.lowlevel.current_clock().current_time  # trio.current_time's

    async def receive(self) -> LLMChunk:
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            raise trio.EndOfChannel from None

    async def __anext__(self) -> LLMChunk:
        # The receive itself, for ``async for`` (the turn's loop): one coroutine less a
        # chunk than trio's ``__anext__`` around ``receive``.
        scope = self.scope
        scope.deadline = self._now() + self._limit
        try:
            # The channel's ``__anext__``: the HTTP backends' is their receive itself
            # (`inline_chunk_channel`), trio's own calls ``receive``.
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            scope.deadline = math.inf  # the end leaves no deadline behind, nor an error
            raise
        except BaseException:
            scope.deadline = math.inf
            raise
        if self._first and not isinstance(chunk, WorkingChunk):  # work restarts the wait
            self._limit = self._later
            self._first = False
        return chunk

    def timeout(self) -> LLMFirstChunkTimeout | LLMChunkTimeout:
        """The error of the wait the scope ended."""
        return LLMFirstChunkTimeout(self._limit) if self._first else LLMChunkTimeout(self._limit)

    async def aclose(self) -> None:
        await self._chunks.aclose()


@asynccontextmanager
async def guarded_stream(
    backend: LLMBackend,
    request: ChatRequest,
    *,
    first_chunk_timeout: float,
    chunk_timeout: float,
) -> AsyncIterator[trio.abc.ReceiveChannel[LLMChunk]]:
    """``async with guarded_stream(...) as chunks:`` — the backend's stream, with timeouts.

    Each wait is measured from when the consumer asks for the next chunk, so time the
    consumer spends on a chunk never counts against the model, as long as it does not
    wait between receives (a wait there is under the last receive's deadline). No task
    of its own: a receive is the backend's receive under the stream's cancel scope. A
    timeout cancels the consumer's body and comes out of the ``async with`` as the
    timeout's error, inside the backend's (which closes the connection as for any error).
    """
    async with backend.stream_chat(request) as chunks:
        guarded = _Guarded(chunks, first_chunk_timeout, chunk_timeout)
        with guarded.scope:
            yield guarded
        if guarded.scope.cancelled_caught:
            raise guarded.timeout()
