"""The OpenAI-compatible ``/v1/chat/completions`` dialect: server-sent events.

A stream is ``data: {chunk}`` lines, ending with ``data: [DONE]``. Each chunk carries
``choices[0].delta`` with ``content``, reasoning (``reasoning`` from Ollama,
``reasoning_content`` from vLLM / DeepSeek) or ``tool_calls`` fragments: a call's
``id`` and name come first, its JSON arguments in pieces, all keyed by ``index``. We
assemble them and emit one `ToolCallsChunk` at the end. Usage comes in a last chunk
with empty ``choices`` (we ask for it with ``stream_options.include_usage``).

`ChatRequest.think` has no standard field in this dialect and is not sent
(``reasoning_effort`` is refused by models that do not reason).

With ``tool_stream=False`` (``NAVI_OPENAI_TOOL_STREAM=false``) a request that offers
tools is sent non-streamed, with ``tool_choice: "auto"`` said out loud: llama-cpp-python's
function-calling chat format only calls tools on such requests (streamed with automatic
choice, it always answers in text). `parse_completion` turns the JSON body into the same
chunks a stream gives, so nothing above the backend can tell the difference; the stream
guard's first-chunk timeout then bounds the whole answer, and Stop closes the request.
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
    fetch_whole,
    finite_only,
    inline_chunk_channel,
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
            "arguments": args if isinstance(args, str) else json.dumps(finite_only(args or {})),
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


def openai_body(
    request: ChatRequest, *, stream: bool = True, messages: bool = True
) -> dict[str, Any]:
    """The chat body of `request`; `messages=False`: with an empty ``"messages"`` (the
    backend's `BodyCache` adds their kept JSON)."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [to_openai_message(m) for m in request.messages] if messages else [],
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if request.tools:
        body["tools"] = request.tools
        if not stream:
            body["tool_choice"] = "auto"  # llama-cpp-python ignores the tools without it
    for key, value in request.options.items():
        if key in _OPTION_NAMES:
            body[_OPTION_NAMES[key]] = value
    return body


def tool_names(request: ChatRequest) -> frozenset[str]:
    """The function names offered in `request.tools` (OpenAI-style schemas)."""
    names = set()
    for tool in request.tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return frozenset(names)


def _text_chunks(part: dict[str, Any]) -> list[LLMChunk]:
    """The reasoning and the text of a streamed delta or a whole message, in that order."""
    out: list[LLMChunk] = []
    for key in _REASONING_KEYS:
        if isinstance(part.get(key), str) and part[key]:
            out.append(ThinkingChunk(part[key]))
            break
    if isinstance(part.get("content"), str) and part["content"]:
        out.append(TextChunk(part["content"]))
    return out


class _PendingCall:
    """One tool call being assembled from its fragments.

    Servers disagree on how a name is streamed: OpenAI sends it once, some servers send
    it in pieces (``"file"``, ``"system"``), llama-cpp-python repeats it whole in every
    fragment. `name` follows the rules in `add_name`; `glued` is the plain concatenation,
    kept so that a known tool name can settle the rare ambiguous case (``"ab"`` + ``"ab"``
    is ``"ab"`` repeated, unless the tools offered include ``"abab"``).
    """

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str = ""
        self.glued: str = ""
        self.arguments: list[str] = []

    def add_name(self, piece: str) -> None:
        if not piece:
            return
        self.glued += piece
        if not self.name or (piece.startswith(self.name) and piece != self.name):
            self.name = piece  # the first piece, or a server that resends the name so far
        elif piece != self.name:
            self.name += piece  # a name sent in pieces
        # else: the whole name repeated (llama-cpp-python): nothing new

    def final_name(self, known: frozenset[str]) -> str:
        if known and self.name not in known and self.glued in known:
            return self.glued
        return self.name


class OpenAIParser:
    """Turns SSE lines into chunks. Pure: no I/O, so it can be fuzzed."""

    def __init__(self, model: str, url: str = "", tool_names: frozenset[str] = frozenset()) -> None:
        self.model = model
        self.url = url
        self.tool_names = tool_names  # the tools offered: settle an ambiguous glued name
        self.finished = False  # saw [DONE]
        self.received = False  # any line at all (an empty body says something else)
        self.finish_reason: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._calls: dict[int, _PendingCall] = {}
        self._index_of_id: dict[str, int] = {}
        self._last: int | None = None

    def feed(self, line: str) -> list[LLMChunk]:
        line = line.rstrip("\r")
        if line.strip():
            self.received = True
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
            out += _text_chunks(delta)
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
        call_id = frag["id"] if isinstance(frag.get("id"), str) and frag["id"] else None
        index = frag.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            # No index: a known id points at its call, a new id opens a new one, and a
            # lone fragment without either continues the call opened last.
            if call_id is not None and call_id in self._index_of_id:
                index = self._index_of_id[call_id]
            elif call_id is not None:
                index = max(self._calls) + 1 if position in self._calls else position
            elif position == 0 and self._last is not None:
                index = self._last
            else:
                index = position
        self._last = index
        call = self._calls.setdefault(index, _PendingCall())
        if call_id is not None:
            call.id = call_id
            self._index_of_id.setdefault(call_id, index)
        fn = frag.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str):
                call.add_name(fn["name"])
            args = fn.get("arguments")
            if isinstance(args, str):
                call.arguments.append(args)
            elif isinstance(args, dict):  # some servers send the object whole
                call.arguments.append(json.dumps(args))

    def _final(self) -> list[LLMChunk]:
        out: list[LLMChunk] = []
        if self._calls:
            calls = tuple(
                make_tool_call(c.id, c.final_name(self.tool_names), "".join(c.arguments))
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
        raise ended_early(self.url, self.received)


def parse_completion(
    data: bytes, model: str, url: str = "", known: frozenset[str] = frozenset()
) -> list[LLMChunk]:
    """A non-streamed ``chat.completion`` body as the chunks a stream would give.

    Reasoning, text, the tool calls (whole: names are not repeated here) and a last
    `DoneChunk` with usage and finish_reason. No body at all is `LLMEmptyResponseError`
    (llama.cpp's answer to a prompt over its window), anything unreadable an error quoting it.
    """
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        raise ended_early(url, received=False)
    obj = parse_json_object(text)
    if "error" in obj:
        raise LLMStreamError(f"the LLM reported an error: {stream_error_text(obj['error'])}")
    raw_usage = obj.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise LLMMalformedStreamError(
            f"the LLM sent a completion without a choice: {excerpt(text)!r}"
        )
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise LLMMalformedStreamError(
            f"the LLM sent a choice without a message object: {excerpt(text)!r}"
        )
    out: list[LLMChunk] = _text_chunks(message)
    raw_calls = message.get("tool_calls")
    if raw_calls:
        if not isinstance(raw_calls, list):
            raise LLMMalformedStreamError(
                f"the LLM sent 'tool_calls' that is not a list: {excerpt(text)!r}"
            )
        out.append(ToolCallsChunk(tuple(_whole_call(c, known) for c in raw_calls)))
    finish = choice.get("finish_reason")
    served = obj.get("model")
    out.append(
        DoneChunk(
            model=served if isinstance(served, str) and served else model,
            prompt_tokens=int_or_zero(usage.get("prompt_tokens")),
            completion_tokens=int_or_zero(usage.get("completion_tokens")),
            done_reason=finish if isinstance(finish, str) else None,
        )
    )
    return out


def _whole_call(raw: Any, known: frozenset[str]) -> ToolCall:
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict):
        return make_tool_call(None, None, None)  # a parse_error naming the problem
    call = _PendingCall()
    if isinstance(fn.get("name"), str):
        call.add_name(fn["name"])
    args = fn.get("arguments")
    return make_tool_call(raw.get("id"), call.final_name(known), args)


def chat_completions_url(base_url: str) -> str:
    """``{base}/v1/chat/completions``, also when `base_url` already ends in ``/v1``."""
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return f"{base}/v1/chat/completions"


class OpenAIBackend:
    """Streams chat completions from an OpenAI-compatible ``/v1/chat/completions``.

    The backend owns `client` (one per backend): `aclose` closes it. With
    `tool_stream` False, requests that offer tools go non-streamed (module docstring).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        *,
        api_key: str = "",
        tool_stream: bool = True,
    ) -> None:
        self._client = client
        self.tool_stream = tool_stream
        self.base_url = base_url.rstrip("/")
        self.url = chat_completions_url(base_url)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._bodies = BodyCache(to_openai_message)

    def stream_chat(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[LLMChunk]]:
        return self._stream(request)

    @inline_chunk_channel
    def _stream(self, request: ChatRequest) -> AsyncGenerator[LLMChunk, None]:
        # The stream's own generator, not one around it: a layer less at every chunk.
        names = tool_names(request)
        if request.tools and not self.tool_stream:
            return self._whole(request, names)
        parser = OpenAIParser(request.model, self.url, names)
        body = self._body(request, stream=True)
        return stream_chunks(self._client, self.url, body, parser, self._headers)

    async def _whole(
        self, request: ChatRequest, names: frozenset[str]
    ) -> AsyncGenerator[LLMChunk, None]:
        """A request with tools to a server that cannot stream them: asked whole."""
        body = self._body(request, stream=False)
        data = await fetch_whole(self._client, self.url, body, self._headers)
        for chunk in parse_completion(data, request.model, self.url, names):
            yield chunk

    def _body(self, request: ChatRequest, *, stream: bool) -> bytes:
        """`openai_body` as JSON, each message's JSON kept for the next call."""
        rest = openai_body(request, stream=stream, messages=False)
        return self._bodies.body(rest, request.messages)

    async def aclose(self) -> None:
        await self._client.aclose()
