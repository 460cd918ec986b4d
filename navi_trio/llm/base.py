"""The LLM backend protocol: one method, like httpx's transport seam.

A backend streams one chat completion::

    async with backend.stream_chat(request) as chunks:
        async for chunk in chunks:
            ...

`stream_chat` returns an async context manager yielding a trio receive channel (never
a bare async generator across a nursery, PEP 789). Leaving the `async with` early —
stop, timeout, error — closes the HTTP response, so the server sees the connection go.

Messages use one internal shape (close to Ollama's), converted by each dialect:
``{"role": "system"|"user"|"assistant"|"tool", "content": str,
   "thinking"?: str, "tool_calls"?: [{"id", "name", "arguments": dict}],
   "tool_call_id"?: str, "name"?: str}``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeAlias, runtime_checkable

import attrs
import trio


@attrs.frozen
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)
    # Set when the model's arguments were not valid JSON (e.g. cut by done_reason=length):
    # the raw text is kept and the agent turns it into an error result for the model.
    parse_error: str | None = None

    def to_message(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": dict(self.arguments)}


@attrs.frozen
class ChatRequest:
    messages: list[dict[str, Any]]
    model: str
    tools: list[dict[str, Any]] = attrs.field(factory=list)  # OpenAI-style function schemas
    think: bool = False
    options: dict[str, Any] = attrs.field(factory=dict)  # e.g. {"num_ctx": 8192}


@attrs.frozen
class ThinkingChunk:
    text: str


@attrs.frozen
class TextChunk:
    text: str


@attrs.frozen
class ToolCallsChunk:
    calls: tuple[ToolCall, ...]


@attrs.frozen
class DoneChunk:
    """Last chunk of a stream: usage and why the model stopped."""

    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    done_reason: str | None = None  # "stop", "length", "tool_calls" ...


@attrs.frozen
class WorkingChunk:
    """Progress, not output: the model works on a step it streams nothing of (the
    embedded model choosing a tool or writing its arguments, or waiting for the model
    another answer holds). It restarts the stream's silence timeout (llm/guard.py)."""

    step: str
    tokens: int = 0  # generated in this step so far


LLMChunk: TypeAlias = ThinkingChunk | TextChunk | ToolCallsChunk | DoneChunk | WorkingChunk


class LLMBackend(Protocol):
    """Anything that can stream a chat completion."""

    def stream_chat(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[LLMChunk]]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class SupervisedBackend(LLMBackend, Protocol):
    """A backend with an actor of its own (the embedded model's process, llm/host.py):
    whoever owns the backend starts ``run`` in its nursery (`open_runtime` does)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...
