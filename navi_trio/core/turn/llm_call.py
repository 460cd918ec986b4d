"""One guarded LLM call, turned into AgentEvents and a collected reply."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from navi_trio.errors import LLMAnswerTooLongError
from navi_trio.events import AgentEvent, ModelWorking, TextDelta, ThinkingDelta, ThinkingEnd
from navi_trio.llm.base import (
    ChatRequest,
    DoneChunk,
    LLMBackend,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallsChunk,
    WorkingChunk,
)
from navi_trio.llm.guard import guarded_stream
from navi_trio.profiles import AgentProfile
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
    *,
    first_chunk: Callable[[], None] | None = None,
) -> StreamedReply:
    """Stream `request` into `reply`, emitting thinking/text deltas through `emit` (and
    `ModelWorking` for the model's silent steps); `first_chunk` is called when the first
    chunk of output of any kind arrives.

    An answer longer than ``settings.answer_max_chars`` (text + thinking) raises
    `LLMAnswerTooLongError`: leaving the ``async with`` closes the connection, so the
    server stops generating; `reply` keeps what came (the partial answer).
    """
    thinking = False
    size = 0
    async with guarded_stream(
        backend,
        request,
        first_chunk_timeout=settings.first_chunk_timeout,
        chunk_timeout=settings.chunk_timeout,
    ) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, WorkingChunk):  # progress, no output yet
                if emit:
                    emit(ModelWorking(chunk.step, chunk.tokens))
                continue
            if first_chunk is not None:
                first_chunk()
                first_chunk = None
            if isinstance(chunk, ThinkingChunk | TextChunk):
                size += len(chunk.text)
                if size > settings.answer_max_chars:
                    raise LLMAnswerTooLongError(settings.answer_max_chars)
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
    max_tokens: int | None = None,
) -> ChatRequest:
    """One request; it always carries an output cap (`max_tokens`, else the answer's).

    ``num_predict`` is Ollama's name; the OpenAI dialect sends it as ``max_tokens``.
    """
    cap = settings.answer_max_tokens if max_tokens is None else max_tokens
    if cap < 1:
        raise ValueError(f"max_tokens must be 1 or more, got {cap}")
    return ChatRequest(
        messages=messages,
        model=model,
        tools=tools or [],
        think=think,
        options={"num_ctx": settings.num_ctx, "num_predict": cap},
    )


PLANNING_PURPOSES = ("analysis", "review", "plan")


def output_cap(settings: Settings, profile: AgentProfile, purpose: str) -> int:
    """The output cap of a call made for `purpose`: a planning phase, compression or
    anything else (the answer). The profile's field wins over the setting."""
    if purpose in PLANNING_PURPOSES:
        value, default = profile.plan_max_tokens, settings.plan_max_tokens
    elif purpose == "compression":
        value, default = profile.compression_max_tokens, settings.compression_max_tokens
    else:
        value, default = profile.answer_max_tokens, settings.answer_max_tokens
    return default if value is None else value
