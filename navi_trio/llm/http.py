"""Helpers shared by both wire dialects (Ollama NDJSON, OpenAI-compatible SSE).

Error mapping lives here, in one place, like httpx's own ``_exceptions.py``:

    httpx.ConnectError / ConnectTimeout      -> LLMConnectionError ("cannot connect to URL")
    httpx.RemoteProtocolError / ReadError …  -> LLMConnectionError ("connection to URL dropped")
    any other httpx.HTTPError                -> LLMConnectionError
    HTTP status >= 400                       -> LLMStatusError (quotes the body's error text;
                                                a 404 with no word of a model suggests the
                                                other dialect: wrong --backend)
    HTTP 200 and no body at all              -> LLMEmptyResponseError (prompt over the window?)
    disconnected before any answer           -> sent once more (a stale keep-alive connection)
    a body cut before the model was done     -> LLMConnectionError ("connection dropped?")

Also here: `chunk_channel` and `inline_chunk_channel`, the two ways a backend exposes a
stream (a producer task, or none for a generator that never yields inside a cancel
scope or nursery: the HTTP backends); turning a model's raw tool call into a `ToolCall`
(never a crash on bad arguments).
"""

from __future__ import annotations

import functools
import json
import math
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from typing import Any, ParamSpec, Protocol, TypeVar

import httpx
import trio

from navi_trio.errors import (
    LLMConnectionError,
    LLMEmptyResponseError,
    LLMError,
    LLMMalformedStreamError,
    LLMStatusError,
)
from navi_trio.jsonenc import dumps_with
from navi_trio.llm.base import DoneChunk, LLMChunk, ToolCall
from navi_trio.llm.client import LLMClient
from navi_trio.llm.lines import LINE_MAX_BYTES, LineSplitter
from navi_trio.llm.transport import direct_body
from navi_trio.text import clean_text, clip, loads_clean

EXCERPT = 200
P = ParamSpec("P")
T = TypeVar("T")


def chunk_channel(
    fn: Callable[P, AsyncGenerator[T, None]],
) -> Callable[P, AbstractAsyncContextManager[trio.abc.ReceiveChannel[T]]]:
    """`trio.as_safe_channel`, plus: a producer's error comes out alone.

    When the generator raises, trio closes the channel before it cancels the consumer,
    so a consumer blocked in ``await chunks.receive()`` may get `EndOfChannel` and the
    ``async with`` would raise both in a group. The `EndOfChannel` is only the echo of
    the producer's error, so we drop it and raise the error itself (LLMStatusError …).
    """
    safe = trio.as_safe_channel(fn)

    @asynccontextmanager
    @functools.wraps(fn)
    async def context_manager(
        *args: P.args, **kwargs: P.kwargs
    ) -> AsyncIterator[trio.abc.ReceiveChannel[T]]:
        sole: BaseException | None = None
        try:
            async with safe(*args, **kwargs) as channel:
                yield channel
        except BaseExceptionGroup as group:
            _, rest = group.split(trio.EndOfChannel)
            if (
                rest is None
                or len(rest.exceptions) != 1
                or isinstance(rest.exceptions[0], BaseExceptionGroup)
            ):
                raise
            sole = rest.exceptions[0]
        if sole is not None:
            raise sole

    return context_manager


class _InlineChannel(trio.abc.ReceiveChannel[T]):
    """A generator's items, produced in the receiving task (see `inline_chunk_channel`)."""

    def __init__(self, agen: AsyncGenerator[T, None]) -> None:
        self._agen = agen

    async def receive(self) -> T:
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            raise trio.EndOfChannel from None

    async def __anext__(self) -> T:
        # The receive itself, for the guard and ``async for``: one coroutine less a
        # chunk than trio's ``__anext__`` around ``receive``. A stop lands here too,
        # not only where the generator next waits for the socket.
        await trio.lowlevel.checkpoint_if_cancelled()
        return await self._agen.__anext__()

    async def aclose(self) -> None:
        await self._agen.aclose()


def inline_chunk_channel(
    fn: Callable[P, AsyncGenerator[T, None]],
) -> Callable[P, AbstractAsyncContextManager[trio.abc.ReceiveChannel[T]]]:
    """`chunk_channel` without the producer task: for a generator that never yields
    inside a cancel scope or a nursery (PEP 789), such as an HTTP stream's.

    Each ``receive`` runs the generator up to its next item in the consumer's task, under
    the consumer's cancel scopes (the guard's timeouts, the run's Stop): a chunk costs no
    task switch and a call no nursery. An error of the generator comes out of `receive`
    alone, as from `chunk_channel`. Leaving the ``async with`` closes the generator,
    which closes the HTTP response (the server sees the connection go)."""

    @asynccontextmanager
    @functools.wraps(fn)
    async def context_manager(
        *args: P.args, **kwargs: P.kwargs
    ) -> AsyncIterator[trio.abc.ReceiveChannel[T]]:
        agen = fn(*args, **kwargs)
        try:
            yield _InlineChannel(agen)
        finally:
            await agen.aclose()

    return context_manager


class LineParser(Protocol):
    """A dialect's pure parser: body lines in, chunks out."""

    def feed(self, line: str) -> list[LLMChunk]: ...

    def finish(self) -> list[LLMChunk]:
        """At the end of the body: the chunks still owed, or an error if it was cut."""
        ...


async def stream_chunks(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any] | bytes,
    parser: LineParser,
    headers: dict[str, str] | None = None,
    line_max: int = LINE_MAX_BYTES,
) -> AsyncGenerator[LLMChunk, None]:
    """POST `body` and yield the parser's chunks as the lines arrive.

    Lines are cut by `LineSplitter` (LF, CRLF or CR; at most `line_max` bytes) and
    decoded in the response's charset (UTF-8 unless it names another).

    Leaving early (end, error, timeout, cancel) closes the response, so the server sees
    the connection go and stops generating. The DoneChunk comes only once the body has
    ended: a consumer that stops at it leaves a finished response (a reusable
    connection, no disconnect seen by the server).
    """
    done: list[LLMChunk] = []
    request = _json_post(client, url, body, headers)
    with map_http_errors(url):
        async with _send(client, request) as response:
            await raise_for_status(response, url)
            lines = LineSplitter(line_max)
            encoding = _encoding(response)
            # The body's bytes as they came, unless the server compressed them: no
            # text decoder, line decoder and two more generators around each read.
            raw = "content-encoding" not in response.headers
            reads = direct_body(response) if raw else None
            if reads is None:
                reads = response.aiter_raw() if raw else response.aiter_bytes()
            async for data in reads:
                for chunk in _parsed(parser, lines.feed(data), encoding, done):
                    yield chunk
            for chunk in _parsed(parser, lines.finish(), encoding, done):
                yield chunk
            for chunk in parser.finish():
                if isinstance(chunk, DoneChunk):
                    done.append(chunk)
                else:
                    yield chunk
    for chunk in done:
        yield chunk


def _encoding(response: httpx.Response) -> str:
    """``response.encoding``, without httpx's parse of the Content-Type (an email
    message's) when it names no charset: the client's default encoding then, as httpx
    has it for a streamed body."""
    content_type = response.headers.get("content-type")
    default = response.default_encoding
    if (content_type is None or "charset" not in content_type.lower()) and isinstance(default, str):
        return default or "utf-8"
    return response.encoding or "utf-8"


def _parsed(
    parser: LineParser, lines: list[bytes], encoding: str, done: list[LLMChunk]
) -> list[LLMChunk]:
    """The chunks of `lines` to yield now; a DoneChunk goes to `done`, for the end."""
    out: list[LLMChunk] = []
    for line in lines:
        for chunk in parser.feed(line.decode(encoding, "replace")):
            (done if isinstance(chunk, DoneChunk) else out).append(chunk)
    return out


def _json_post(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any] | bytes,
    headers: dict[str, str] | None,
) -> httpx.Request:
    """The POST of a chat request: strict JSON (no NaN) with its content type.

    `body` may come as the JSON bytes already (llm/body_cache.py). An `LLMClient`
    builds it from its per-URL template (the same request, cheaper)."""
    content = body if isinstance(body, bytes) else json_body(body)
    if isinstance(client, LLMClient):
        return client.json_post(url, content, headers)
    return client.build_request(
        "POST",
        url,
        content=content,
        headers={**(headers or {}), "Content-Type": "application/json"},
    )


async def fetch_whole(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any] | bytes,
    headers: dict[str, str] | None = None,
) -> bytes:
    """POST `body` and return the whole answer body (a non-streamed request).

    The same error mapping and retry as `stream_chunks`; a cancel (Stop, the guard's
    first-chunk timeout) while the server generates closes the connection, so the
    server sees it go.
    """
    request = _json_post(client, url, body, headers)
    with map_http_errors(url):
        async with _send(client, request) as response:
            await raise_for_status(response, url)
            return await response.aread()


@asynccontextmanager
async def _send(client: httpx.AsyncClient, request: httpx.Request) -> AsyncIterator[httpx.Response]:
    """Send `request`, streaming the answer; closed on exit.

    A server may close an idle keep-alive connection just as we reuse it: the request
    then fails with "Server disconnected without sending a response" before any byte
    came back. Nothing was answered, so it is sent once more (the failed connection has
    left the pool: the retry gets a fresh one). Anything after the headers is not retried.
    """
    try:
        response = await client.send(request, stream=True)
    except httpx.RemoteProtocolError:
        response = await client.send(request, stream=True)
    try:
        yield response
    finally:
        await response.aclose()


def excerpt(text: str, limit: int = EXCERPT) -> str:
    """A short quotable piece of `text` (for error messages)."""
    return clip(text.strip(), limit)


@contextmanager
def map_http_errors(url: str) -> Iterator[None]:
    """Turn httpx's transport errors into the most specific LLMError, naming `url`."""
    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise LLMConnectionError(
            f"cannot connect to the LLM at {url}: {exc or type(exc).__name__}"
        ) from exc
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        raise LLMConnectionError(
            f"the connection to the LLM at {url} dropped mid-stream: {exc or type(exc).__name__}"
        ) from exc
    except httpx.HTTPError as exc:
        raise LLMConnectionError(
            f"talking to the LLM at {url} failed: {type(exc).__name__}: {exc}"
        ) from exc


def error_text(body: bytes) -> str:
    """The error message in an HTTP error body.

    Ollama sends ``{"error": "model 'x' not found"}``; OpenAI-compatible servers send
    ``{"error": {"message": ...}}``; proxies send plain text. Quote what a person can act on.
    """
    text = body.decode("utf-8", errors="replace")
    try:
        data = loads_clean(text)
    except ValueError:
        return excerpt(text, 500)
    if isinstance(data, dict) and "error" in data:
        err = data["error"]
        return stream_error_text(err)
    return excerpt(text, 500)


# A 404 from one dialect's path usually means the server speaks the other one.
_OTHER_DIALECT = {
    "/api/chat": ("openai", "an OpenAI-compatible server (llama.cpp, vLLM …)"),
    "/v1/chat/completions": ("ollama", "Ollama's native API"),
}


def dialect_hint(status: int, url: str, text: str) -> str:
    """For a 404 on a chat path: which backend the server probably wants, else ""."""
    if status != 404 or "model" in text.lower():  # Ollama: "model 'x' not found"
        return ""
    path = httpx.URL(url).path
    for suffix, (other, what) in _OTHER_DIALECT.items():
        if path.endswith(suffix):
            return (
                f" (the server has no {suffix}: if it is {what}, use "
                f"--backend {other} or NAVI_LLM_BACKEND={other})"
            )
    return ""


async def raise_for_status(response: httpx.Response, url: str) -> None:
    """Raise `LLMStatusError` quoting the body when the response is an HTTP error."""
    if response.status_code < 400:
        return
    body = await response.aread()
    text = error_text(body) or response.reason_phrase
    hint = dialect_hint(response.status_code, url, text)
    raise LLMStatusError(response.status_code, text + hint, url)


def ended_early(url: str, received: bool) -> LLMError:
    """The error for a body that ended before the model was done.

    No bytes at all is what llama.cpp sends for a prompt over its window; a body cut
    after some lines is a dropped connection.
    """
    if not received:
        return LLMEmptyResponseError(url)
    return LLMConnectionError(
        f"the stream from the LLM at {url} ended before the model was done (connection dropped?)"
    )


def json_text(value: Any) -> str:
    """`value` as the JSON text a chat body carries (`json_body`, `BodyCache`).

    Never NaN or Infinity (which no server can parse): arguments are checked when they
    are parsed, but a history saved before that check may still hold such numbers, so
    they go out as null. Never a lone surrogate (which UTF-8 cannot carry): it goes out
    as U+FFFD. Either way the session keeps working.
    """
    try:
        text = _BODY_JSON(value)
    except ValueError:
        text = _BODY_JSON(finite_only(value))
    return clean_text(text)


_BODY_JSON = dumps_with(ensure_ascii=False, allow_nan=False)


def json_body(body: dict[str, Any]) -> bytes:
    """`body` as JSON bytes (see `json_text`)."""
    return json_text(body).encode("utf-8")


def finite_only(value: Any) -> Any:
    """A copy of `value` with every NaN / Infinity replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_only(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_only(v) for v in value]
    return value


def non_finite_path(value: Any, path: str = "") -> str | None:
    """Where in `value` (a parsed JSON value) a NaN or Infinity sits, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "(the value itself)"
    if isinstance(value, dict):
        for k, v in value.items():
            found = non_finite_path(v, f"{path}.{k}" if path else str(k))
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = non_finite_path(v, f"{path}[{i}]")
            if found:
                return found
    return None


def stream_error_text(err: Any) -> str:
    """The message of an ``{"error": ...}`` object sent inside a 200 stream."""
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    return err if isinstance(err, str) else json.dumps(err)


def parse_json_object(line: str) -> dict[str, Any]:
    """One stream line as a JSON object, or `LLMMalformedStreamError` quoting it.

    Both dialects read every line (and OpenAI's whole answer) here: a lone surrogate
    escape (``"\\ud800"``) in a delta becomes U+FFFD, so the answer can be stored."""
    try:
        data = loads_clean(line)
    except ValueError:
        raise LLMMalformedStreamError(
            f"the LLM sent a line that is not JSON: {excerpt(line)!r}"
        ) from None
    if not isinstance(data, dict):
        raise LLMMalformedStreamError(f"the LLM sent JSON that is not an object: {excerpt(line)!r}")
    return data


def new_call_id() -> str:
    """An id for a tool call the server sent without one (Ollama's native dialect)."""
    return f"call_{secrets.token_hex(6)}"


def make_tool_call(call_id: Any, name: Any, arguments: Any) -> ToolCall:
    """A ToolCall from what the model sent; bad arguments become `parse_error`, not a crash.

    `arguments` may be an object (Ollama) or JSON text (OpenAI, possibly cut short).
    """
    cid = call_id if isinstance(call_id, str) and call_id else new_call_id()
    if not isinstance(name, str) or not name:
        return ToolCall(cid, "", {}, parse_error=f"the tool call has no function name: {name!r}")
    if isinstance(arguments, dict):
        return _finite_call(cid, name, arguments, arguments)
    if arguments is None or arguments == "":
        return ToolCall(cid, name, {})
    if not isinstance(arguments, str):
        return ToolCall(
            cid, name, {}, parse_error=f"arguments are not a JSON object: {arguments!r:.200}"
        )
    try:
        parsed = loads_clean(arguments)  # JSON text inside JSON: escapes again
    except ValueError as exc:
        return ToolCall(
            cid,
            name,
            {},
            parse_error=f"arguments are not valid JSON ({exc}): {excerpt(arguments)!r}",
        )
    if not isinstance(parsed, dict):
        return ToolCall(
            cid, name, {}, parse_error=f"arguments are not a JSON object: {excerpt(arguments)!r}"
        )
    return _finite_call(cid, name, parsed, arguments)


def _finite_call(cid: str, name: str, arguments: dict[str, Any], raw: Any) -> ToolCall:
    """Refuse arguments holding NaN or Infinity (``1e400`` parses to inf): JSON cannot
    carry them, so storing or sending them back would break every later turn."""
    where = non_finite_path(arguments)
    if where is None:
        return ToolCall(cid, name, arguments)
    shown = excerpt(raw if isinstance(raw, str) else json.dumps(raw))
    return ToolCall(
        cid,
        name,
        {},
        parse_error=(
            f"arguments hold a number that is not finite at {where!r} (NaN, Infinity or "
            f"too large for a float, like 1e400): use a finite number. Sent: {shown!r}"
        ),
    )


def int_or_zero(value: Any) -> int:
    """A usage count, or 0 when the server sent something else."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
