"""The OpenAI-compatible ``/v1/chat/completions`` dialect: server-sent events.

A stream is ``data: {chunk}`` lines, ending with ``data: [DONE]``. Each chunk carries
``choices[0].delta`` with ``content``, reasoning (``reasoning`` from Ollama,
``reasoning_content`` from vLLM / DeepSeek) or ``tool_calls`` fragments: a call's
``id`` and name come first, its JSON arguments in pieces, all keyed by ``index``. We
assemble them and emit one `ToolCallsChunk` at the end. Usage comes in a last chunk
with empty ``choices`` (we ask for it with ``stream_options.include_usage``).

`ChatRequest.think` has no standard field in this dialect and is not sent
(``reasoning_effort`` is refused by models that do not reason).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager, aclosing
from typing import Any

import httpx
import trio

from navi_trio.errors import LLMConnectionError, LLMMalformedStreamError, LLMStreamError
from navi_trio.llm.base import (
    ChatRequest,
    DoneChunk,
    LLMChunk,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallsChunk,
)
from navi_trio.llm.http import (
    chunk_channel,
    excerpt,
    int_or_zero,
    make_tool_call,
    parse_json_object,
    stream_chunks,
    stream_error_text,
)

# Ollama-style options that have an OpenAI name; the rest (num_ctx …) has none.
_OPTION_NAMES = {
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "stop": "stop",
    "num_predict": "max_tokens",
    "max_tokens": "max_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
_SSE_FIELDS = ("data", "event", "id", "retry")
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def _tool_call_out(call: Any) -> dict[str, Any]:
    if isinstance(call, ToolCall):
        call = call.to_message()
    args = call.get("arguments")
    return {
        "id": call.get("id", ""),
        "type": "function",
        "function": {
            "name": call.get("name", ""),
            "arguments": args if isinstance(args, str) else json.dumps(args or {}),
        },
    }


def to_openai_message(msg: dict[str, Any]) -> dict[str, Any]:
    """One internal message in OpenAI's shape; internal-only keys are dropped."""
    role = msg.get("role", "user")
    out: dict[str, Any] = {"role": role, "content": msg.get("content") or ""}
    if msg.get("tool_calls"):
        out["tool_calls"] = [_tool_call_out(c) for c in msg["tool_calls"]]
    if role == "tool":
        if msg.get("tool_call_id"):
            out["tool_call_id"] = msg["tool_call_id"]
    elif isinstance(msg.get("name"), str) and msg["name"]:
        out["name"] = msg["name"]
    return out


def openai_body(request: ChatRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [to_openai_message(m) for m in request.messages],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = request.tools
    for key, value in request.options.items():
        if key in _OPTION_NAMES:
            body[_OPTION_NAMES[key]] = value
    return body


class _PendingCall:
    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str = ""
        self.arguments: list[str] = []


class OpenAIParser:
    """Turns SSE lines into chunks. Pure: no I/O, so it can be fuzzed."""

    def __init__(self, model: str, url: str = "") -> None:
        self.model = model
        self.url = url
        self.finished = False  # saw [DONE]
        self.finish_reason: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._calls: dict[int, _PendingCall] = {}

    def feed(self, line: str) -> list[LLMChunk]:
        line = line.rstrip("\r")
        if not line.strip() or line.startswith(":") or self.finished:
            return []
        field, _, value = line.partition(":")
        if field not in _SSE_FIELDS:
            raise LLMMalformedStreamError(
                f"the LLM sent a line that is not server-sent events: {excerpt(line)!r}"
            )
        if field != "data":
            return []
        payload = value[1:] if value.startswith(" ") else value
        if not payload.strip():
            return []
        if payload.strip() == "[DONE]":
            self.finished = True
            return self._final()
        return self._chunk(parse_json_object(payload), payload)

    def _chunk(self, obj: dict[str, Any], payload: str) -> list[LLMChunk]:
        if "error" in obj:
            raise LLMStreamError(f"the LLM reported an error: {stream_error_text(obj['error'])}")
        if isinstance(obj.get("model"), str) and obj["model"]:
            self.model = obj["model"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = int_or_zero(usage.get("prompt_tokens"))
            self.completion_tokens = int_or_zero(usage.get("completion_tokens"))
        choices = obj.get("choices") or []
        if not isinstance(choices, list):
            raise LLMMalformedStreamError(
                f"the LLM sent 'choices' that is not a list: {excerpt(payload)!r}"
            )
        out: list[LLMChunk] = []
        for choice in choices[:1]:  # we never ask for n > 1
            if not isinstance(choice, dict):
                raise LLMMalformedStreamError(
                    f"the LLM sent a choice that is not an object: {excerpt(payload)!r}"
                )
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise LLMMalformedStreamError(
                    f"the LLM sent a delta that is not an object: {excerpt(payload)!r}"
                )
            for key in _REASONING_KEYS:
                if isinstance(delta.get(key), str) and delta[key]:
                    out.append(ThinkingChunk(delta[key]))
                    break
            if isinstance(delta.get("content"), str) and delta["content"]:
                out.append(TextChunk(delta["content"]))
            tool_calls = delta.get("tool_calls")
            if tool_calls:
                if not isinstance(tool_calls, list):
                    raise LLMMalformedStreamError(
                        f"the LLM sent 'tool_calls' that is not a list: {excerpt(payload)!r}"
                    )
                for position, frag in enumerate(tool_calls):
                    self._add_fragment(position, frag)
        return out

    def _add_fragment(self, position: int, frag: Any) -> None:
        if not isinstance(frag, dict):
            return
        index = frag.get("index", position)
        if not isinstance(index, int):
            index = position
        call = self._calls.setdefault(index, _PendingCall())
        if isinstance(frag.get("id"), str) and frag["id"]:
            call.id = frag["id"]
        fn = frag.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str):
                call.name += fn["name"]
            args = fn.get("arguments")
            if isinstance(args, str):
                call.arguments.append(args)
            elif isinstance(args, dict):  # some servers send the object whole
                call.arguments.append(json.dumps(args))

    def _final(self) -> list[LLMChunk]:
        out: list[LLMChunk] = []
        if self._calls:
            calls = tuple(
                make_tool_call(c.id, c.name, "".join(c.arguments))
                for _, c in sorted(self._calls.items())
            )
            out.append(ToolCallsChunk(calls))
            self._calls = {}
        out.append(
            DoneChunk(
                model=self.model,
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens,
                done_reason=self.finish_reason,
            )
        )
        return out

    def finish(self) -> list[LLMChunk]:
        """Called at the end of the body: the chunks still owed, or an error if cut."""
        if self.finished:
            return []
        if self.finish_reason is not None:
            # Some servers omit [DONE]; a finish_reason means the answer is complete.
            self.finished = True
            return self._final()
        raise LLMConnectionError(
            f"the stream from the LLM at {self.url} ended before the model was done "
            "(connection dropped?)"
        )


def chat_completions_url(base_url: str) -> str:
    """``{base}/v1/chat/completions``, also when `base_url` already ends in ``/v1``."""
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return f"{base}/v1/chat/completions"


class OpenAIBackend:
    """Streams chat completions from an OpenAI-compatible ``/v1/chat/completions``.

    The backend owns `client` (one per backend): `aclose` closes it.
    """

    def __init__(self, client: httpx.AsyncClient, base_url: str, *, api_key: str = "") -> None:
        self._client = client
        self.base_url = base_url.rstrip("/")
        self.url = chat_completions_url(base_url)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def stream_chat(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[LLMChunk]]:
        return self._stream(request)

    @chunk_channel
    async def _stream(self, request: ChatRequest) -> AsyncGenerator[LLMChunk, None]:
        parser = OpenAIParser(request.model, self.url)
        body = openai_body(request)
        stream = stream_chunks(self._client, self.url, body, parser, self._headers)
        async with aclosing(stream) as chunks:
            async for chunk in chunks:
                yield chunk

    async def aclose(self) -> None:
        await self._client.aclose()
