"""Ollama's native ``/api/chat`` dialect: one JSON object per line (NDJSON).

A stream looks like::

    {"model": "qwen3:8b", "message": {"role": "assistant", "thinking": "Hm"}, "done": false}
    {"model": "qwen3:8b", "message": {"role": "assistant", "content": "Hi"}, "done": false}
    {"model": "qwen3:8b", "message": {"role": "assistant",
        "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}, "done": false}
    {"model": "qwen3:8b", "message": {...}, "done": true, "done_reason": "stop",
        "prompt_eval_count": 26, "eval_count": 290}

Tool calls arrive whole, usually without ids (we make them). An ``{"error": ...}`` line in
a 200 stream is an error; a stream that ends before ``done`` means the connection dropped.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import trio

from navi_trio.errors import LLMMalformedStreamError, LLMStreamError
from navi_trio.llm.base import (
    ChatRequest,
    DoneChunk,
    LLMChunk,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallsChunk,
)
from navi_trio.llm.body_cache import BodyCache
from navi_trio.llm.http import (
    ended_early,
    excerpt,
    inline_chunk_channel,
    int_or_zero,
    make_tool_call,
    parse_json_object,
    stream_chunks,
    stream_error_text,
)


def _tool_call_out(call: Any) -> dict[str, Any]:
    if isinstance(call, ToolCall):
        call = call.to_message()
    args = call.get("arguments")
    if isinstance(args, str):  # JSON text (e.g. kept from an OpenAI-dialect history)
        try:
            args = json.loads(args)
        except ValueError:
            args = {}
    return {
        "function": {
            "name": call.get("name", ""),
            "arguments": args if isinstance(args, dict) else {},
        }
    }


def to_ollama_message(msg: dict[str, Any]) -> dict[str, Any]:
    """One internal message in Ollama's shape; internal-only keys are dropped."""
    out: dict[str, Any] = {"role": msg.get("role", "user"), "content": msg.get("content") or ""}
    if msg.get("tool_calls"):
        out["tool_calls"] = [_tool_call_out(c) for c in msg["tool_calls"]]
    if out["role"] == "tool" and (msg.get("name") or msg.get("tool_name")):
        out["tool_name"] = msg.get("name") or msg.get("tool_name")
    if msg.get("images"):
        out["images"] = msg["images"]
    return out


def ollama_body(request: ChatRequest, keep_alive: str, *, messages: bool = True) -> dict[str, Any]:
    """The chat body of `request`; `messages=False`: with an empty ``"messages"`` (the
    backend's `BodyCache` adds their kept JSON)."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [to_ollama_message(m) for m in request.messages] if messages else [],
        "stream": True,
    }
    if request.tools:
        body["tools"] = request.tools
    if request.think:
        body["think"] = True
    if request.options:
        body["options"] = dict(request.options)
    if keep_alive:
        body["keep_alive"] = keep_alive
    return body


def _opt_str(obj: dict[str, Any], key: str, line: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise LLMMalformedStreamError(
            f"the LLM sent {key!r} that is not a string: {excerpt(line)!r}"
        )
    return value


class OllamaParser:
    """Turns NDJSON lines into chunks. Pure: no I/O, so it can be fuzzed."""

    def __init__(self, model: str, url: str = "") -> None:
        self.model = model
        self.url = url
        self.done = False
        self.received = False  # any line at all (an empty body says something else)

    def feed(self, line: str) -> list[LLMChunk]:
        if not line.strip():
            return []
        self.received = True
        if self.done:
            return []
        obj = parse_json_object(line)
        if "error" in obj:
            raise LLMStreamError(f"the LLM reported an error: {stream_error_text(obj['error'])}")
        if isinstance(obj.get("model"), str) and obj["model"]:
            self.model = obj["model"]
        message = obj.get("message") or {}
        if not isinstance(message, dict):
            raise LLMMalformedStreamError(
                f"the LLM sent a 'message' that is not an object: {excerpt(line)!r}"
            )
        out: list[LLMChunk] = []
        thinking = _opt_str(message, "thinking", line)
        if thinking:
            out.append(ThinkingChunk(thinking))
        content = _opt_str(message, "content", line)
        if content:
            out.append(TextChunk(content))
        raw_calls = message.get("tool_calls")
        if raw_calls:
            if not isinstance(raw_calls, list):
                raise LLMMalformedStreamError(
                    f"the LLM sent 'tool_calls' that is not a list: {excerpt(line)!r}"
                )
            out.append(ToolCallsChunk(tuple(self._tool_call(c) for c in raw_calls)))
        if obj.get("done") is True:
            self.done = True
            reason = obj.get("done_reason")
            out.append(
                DoneChunk(
                    model=self.model,
                    prompt_tokens=int_or_zero(obj.get("prompt_eval_count")),
                    completion_tokens=int_or_zero(obj.get("eval_count")),
                    done_reason=reason if isinstance(reason, str) else None,
                )
            )
        return out

    def _tool_call(self, raw: Any) -> ToolCall:
        if not isinstance(raw, dict):
            return make_tool_call(None, None, None)
        fn = raw.get("function")
        if not isinstance(fn, dict):
            fn = {}
        return make_tool_call(raw.get("id"), fn.get("name"), fn.get("arguments"))

    def finish(self) -> list[LLMChunk]:
        """Called at the end of the body: a stream without ``done`` was cut."""
        if not self.done:
            raise ended_early(self.url, self.received)
        return []


class OllamaBackend:
    """Streams chat completions from Ollama's ``/api/chat``.

    The backend owns `client` (one per backend): `aclose` closes it.
    """

    def __init__(
        self, client: httpx.AsyncClient, base_url: str, *, keep_alive: str = "30m"
    ) -> None:
        self._client = client
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/api/chat"
        self.keep_alive = keep_alive
        self._bodies = BodyCache(to_ollama_message)

    def stream_chat(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[LLMChunk]]:
        return self._stream(request)

    @inline_chunk_channel
    def _stream(self, request: ChatRequest) -> AsyncGenerator[LLMChunk, None]:
        # The stream's own generator, not one around it: a layer less at every chunk.
        parser = OllamaParser(request.model, self.url)
        rest = ollama_body(request, self.keep_alive, messages=False)
        body = self._bodies.body(rest, request.messages)
        return stream_chunks(self._client, self.url, body, parser)

    async def aclose(self) -> None:
        await self._client.aclose()
