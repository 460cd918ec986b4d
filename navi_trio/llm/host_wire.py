"""The model host's wire: length-prefixed JSON frames on the child's stdin and stdout.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON (one object
with a ``type``). The daemon writes to the child's stdin::

    load   {model_file, n_ctx, threads, seed, args_max_tokens, extra_buffers, probe, start}
    chat   {id, request: {messages, tools, options}}
    ack    {id, taken}     the consumer has taken `taken` chunks (the child's credit)
    stop   {id}            the consumer left: end the generation at the next token

and reads from its stdout::

    probing {}             loaded with extra buffer types; a one-token probe runs now
    ready   {model, extra_buffers, threads, llama_cpp, system_info, load_s}
    fatal   {message}      the model cannot load (then the child exits 1)
    working {id, step, tokens}   a step that streams nothing goes on (choosing a tool,
                           writing its arguments): progress, outside the window
    chunk   {id, chunk}    text, a tool call or the usage (`chunk_from_wire`)
    error   {id, message}  the generation failed (the prompt is too large …)
    end     {id, tokens, stopped}   the generation is over: the next chat may come

The child writes at most `WINDOW` chunks of a generation ahead of the consumer's acks,
as the in-process worker did with its bounded channel: a stop is heard within one token
and never behind a pipe full of tokens nobody will read.

Both sides use these functions: the daemon through trio streams (`FrameReader`,
`encode`), the child with blocking files (`read_frame_sync`).
"""

from __future__ import annotations

import json
import struct
from typing import IO, Any

import trio

from navi_trio.llm.base import ChatRequest, DoneChunk, LLMChunk, TextChunk, ToolCallsChunk

HEADER = struct.Struct(">I")
# What the child may send in one frame: a token, or a tool call's arguments (512 tokens).
CHILD_FRAME_MAX = 1 << 20
# What the daemon may send: a whole prompt (the window bounds it; this is the backstop).
PARENT_FRAME_MAX = 256 << 20
WINDOW = 32  # chunks the child may be ahead of the consumer
ACK_EVERY = 8  # the consumer acks after this many chunks


class WireError(Exception):
    """The other side sent something that is not a frame of this wire."""


def encode(frame: dict[str, Any]) -> bytes:
    data = json.dumps(frame, separators=(",", ":")).encode()
    return HEADER.pack(len(data)) + data


def _decode(data: bytes) -> dict[str, Any]:
    try:
        frame = json.loads(data)
    except ValueError as exc:
        raise WireError(f"a frame that is not JSON: {exc}") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise WireError("a frame that is not an object with a type")
    return frame


class FrameReader:
    """Frames from a trio stream (the child's stdout), each at most `limit` bytes."""

    def __init__(self, stream: trio.abc.ReceiveStream, limit: int = CHILD_FRAME_MAX) -> None:
        self._stream = stream
        self._limit = limit
        self._buf = bytearray()

    async def _fill(self, size: int) -> bool:
        while len(self._buf) < size:
            data = await self._stream.receive_some(65536)
            if not data:
                return False
            self._buf += data
        return True

    async def read(self) -> dict[str, Any] | None:
        """The next frame, or None at the end of the stream (between frames)."""
        if not await self._fill(HEADER.size):
            if self._buf:
                raise WireError("the stream ended inside a frame header")
            return None
        (size,) = HEADER.unpack_from(self._buf)
        if size > self._limit:
            raise WireError(f"a frame of {size} bytes (at most {self._limit})")
        if not await self._fill(HEADER.size + size):
            raise WireError("the stream ended inside a frame")
        data = bytes(self._buf[HEADER.size : HEADER.size + size])
        del self._buf[: HEADER.size + size]
        return _decode(data)


def read_frame_sync(stream: IO[bytes], limit: int = PARENT_FRAME_MAX) -> dict[str, Any] | None:
    """The child's side: the next frame from a blocking file, None at its end."""
    head = stream.read(HEADER.size)
    if not head:
        return None
    if len(head) < HEADER.size:
        raise WireError("the stream ended inside a frame header")
    (size,) = HEADER.unpack(head)
    if size > limit:
        raise WireError(f"a frame of {size} bytes (at most {limit})")
    data = stream.read(size)
    if len(data) < size:
        raise WireError("the stream ended inside a frame")
    return _decode(data)


# -- the things a frame carries -------------------------------------------------------


def request_to_wire(request: ChatRequest) -> dict[str, Any]:
    return {"messages": request.messages, "tools": request.tools, "options": request.options}


def request_from_wire(data: dict[str, Any]) -> ChatRequest:
    return ChatRequest(
        messages=list(data.get("messages") or []),
        model="local",
        tools=list(data.get("tools") or []),
        options=dict(data.get("options") or {}),
    )


def text_wire(text: str) -> dict[str, Any]:
    return {"kind": "text", "text": text}


def call_wire(name: str, arguments: str) -> dict[str, Any]:
    """A tool call: its name and the arguments as the model wrote them (JSON text)."""
    return {"kind": "tool_call", "name": name, "arguments": arguments}


def done_wire(model: str, prompt: int, completion: int, reason: str) -> dict[str, Any]:
    return {
        "kind": "done",
        "model": model,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "done_reason": reason,
    }


def chunk_from_wire(data: Any) -> LLMChunk:
    """The chunk a child sent; `WireError` for anything else."""
    from navi_trio.llm.http import make_tool_call  # the daemon's side only (httpx is loaded)

    try:
        kind = data["kind"]
        if kind == "text":
            return TextChunk(str(data["text"]))
        if kind == "tool_call":
            return ToolCallsChunk((make_tool_call(None, data["name"], str(data["arguments"])),))
        if kind == "done":
            return DoneChunk(
                model=str(data.get("model", "")),
                prompt_tokens=int(data.get("prompt_tokens", 0)),
                completion_tokens=int(data.get("completion_tokens", 0)),
                done_reason=data.get("done_reason"),
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"a chunk that cannot be read: {exc!r}") from None
    raise WireError(f"a chunk of unknown kind {kind!r}")
