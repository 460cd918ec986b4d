"""An in-process backend that plays a reply script (see `navi_trio.llm.script`).

It behaves like the HTTP backends against the fake LLM server, minus the sockets:
the same chunks (one word per chunk, tool calls whole, `DoneChunk` last), delays with
`trio.sleep` (so `MockClock` applies), ``stall`` waits forever, and every failure a
reply can script raises the error the HTTP backends would raise for it.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from navi_trio.errors import (
    LLMConnectionError,
    LLMEmptyResponseError,
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
from navi_trio.llm.http import chunk_channel, excerpt, make_tool_call
from navi_trio.llm.script import Reply, parse_reply, rough_tokens, split_words

SCRIPTED_URL = "scripted://llm"


class ScriptedBackend:
    """Answers each request with the next reply; `requests` records what it was asked.

    Past the end of the script a request fails like the fake server's HTTP 500
    ``script exhausted``, unless `loop` is true (the script then cycles).
    """

    def __init__(
        self, replies: Iterable[Reply | dict[str, Any]] = (), *, loop: bool = False
    ) -> None:
        self.replies: list[Reply] = []
        self.loop = loop
        self.requests: list[ChatRequest] = []
        self.completed = 0
        self._next = 0
        self.add_replies(*replies)

    def add_replies(self, *replies: Reply | dict[str, Any]) -> None:
        start = len(self.replies)
        self.replies += [parse_reply(r, f"reply {start + i}") for i, r in enumerate(replies)]

    def _take(self) -> Reply:
        if self._next >= len(self.replies):
            if not self.loop or not self.replies:
                raise LLMStatusError(500, "script exhausted", SCRIPTED_URL)
            self._next = 0
        reply = self.replies[self._next]
        self._next += 1
        return reply

    def stream_chat(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[LLMChunk]]:
        self.requests.append(request)
        return self._stream(request)

    @chunk_channel
    async def _stream(self, request: ChatRequest) -> AsyncGenerator[LLMChunk, None]:
        reply = self._take()
        if reply.hang_up:  # as over HTTP: retried once, the next reply answers
            reply = self._take()
            if reply.hang_up:
                raise LLMConnectionError(
                    f"the LLM at {SCRIPTED_URL} closed the connection without answering, twice"
                )
        if reply.status is not None:
            raise LLMStatusError(reply.status, reply.error_message(), SCRIPTED_URL)
        if reply.empty_body:
            await trio.sleep(reply.delay_first)
            raise LLMEmptyResponseError(SCRIPTED_URL)
        sent = 0
        for item in reply.content():
            if reply.drop_after is not None and sent >= reply.drop_after:
                raise LLMConnectionError(
                    f"the connection to the LLM at {SCRIPTED_URL} dropped mid-stream"
                )
            await trio.sleep(reply.delay_first if sent == 0 else reply.delay_chunk)
            sent += 1
            if item.kind == "thinking":
                yield ThinkingChunk(item.text)
            elif item.kind == "text":
                yield TextChunk(item.text)
            else:
                # Through the same parser as HTTP: string arguments may be cut JSON.
                yield ToolCallsChunk(
                    tuple(make_tool_call(None, c.name, c.arguments) for c in item.calls)
                )
        if reply.drop_after is not None:
            raise LLMConnectionError(
                f"the connection to the LLM at {SCRIPTED_URL} dropped mid-stream"
            )
        if reply.endless:
            for word in itertools.cycle(split_words(reply.text) or ["more "]):
                await trio.sleep(reply.delay_first if sent == 0 else reply.delay_chunk)
                sent += 1
                yield TextChunk(word)
        if reply.stall:
            await trio.sleep_forever()
        await trio.sleep(reply.delay_first if sent == 0 else reply.delay_chunk)
        line = reply.malformed_line()
        if line is not None:
            raise LLMMalformedStreamError(
                f"the LLM sent a line that is not JSON: {excerpt(line)!r}"
            )
        if reply.error_line is not None:
            raise LLMStreamError(f"the LLM reported an error: {reply.error_line}")
        self.completed += 1
        yield DoneChunk(
            model=reply.model or request.model,
            prompt_tokens=(
                reply.prompt_tokens
                if reply.prompt_tokens is not None
                else rough_tokens(request.messages)
            ),
            completion_tokens=(
                reply.completion_tokens
                if reply.completion_tokens is not None
                else len(reply.content())
            ),
            done_reason=reply.done_reason,
        )

    async def aclose(self) -> None:
        """Nothing to release; here to satisfy `LLMBackend`."""
