"""One guarded LLM call, turned into AgentEvents and a collected reply."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from navi_trio.events import AgentEvent, TextDelta, ThinkingDelta, ThinkingEnd
from navi_trio.llm.base import (
    ChatRequest,
    DoneChunk,
    LLMBackend,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallsChunk,
)
from navi_trio.llm.guard import guarded_stream
from navi_trio.settings import Settings


@attrs.define
class StreamedReply:
    """What one call produced so far. Filled while streaming, so a stop mid-stream still
    finds the partial text here."""

    text: list[str] = attrs.field(factory=list)
    thinking: list[str] = attrs.field(factory=list)
    tool_calls: list[ToolCall] = attrs.field(factory=list)
    done: DoneChunk | None = None

    @property
    def content(self) -> str:
        return "".join(self.text)

    @property
    def thinking_text(self) -> str:
        return "".join(self.thinking)


async def stream_reply(
    backend: LLMBackend,
    settings: Settings,
    request: ChatRequest,
    reply: StreamedReply,
    emit: Callable[[AgentEvent], None] | None,
) -> StreamedReply:
    """Stream `request` into `reply`, emitting thinking/text deltas through `emit`."""
    thinking = False
    async with guarded_stream(
        backend,
        request,
        first_chunk_timeout=settings.first_chunk_timeout,
        chunk_timeout=settings.chunk_timeout,
    ) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, ThinkingChunk):
                reply.thinking.append(chunk.text)
                thinking = True
                if emit:
                    emit(ThinkingDelta(chunk.text))
            elif isinstance(chunk, TextChunk):
                if thinking and emit:
                    emit(ThinkingEnd())
                thinking = False
                reply.text.append(chunk.text)
                if emit:
                    emit(TextDelta(chunk.text))
            elif isinstance(chunk, ToolCallsChunk):
                reply.tool_calls.extend(chunk.calls)
            elif isinstance(chunk, DoneChunk):
                reply.done = chunk
    if thinking and emit:
        emit(ThinkingEnd())
    return reply


def chat_request(
    settings: Settings,
    messages: list[dict[str, Any]],
    model: str,
    *,
    tools: list[dict[str, Any]] | None = None,
    think: bool = False,
) -> ChatRequest:
    return ChatRequest(
        messages=messages,
        model=model,
        tools=tools or [],
        think=think,
        options={"num_ctx": settings.num_ctx},
    )
