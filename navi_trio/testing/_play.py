"""Playing one scripted reply on the wire: streamed chunks, or one whole answer.

- Text and thinking stream one word per chunk, one write each, ``delay_first`` before
  the first and ``delay_chunk`` before each later one (a test's MockClock applies);
  before each chunk, `hold` may keep the reply waiting (the server's `hold_after`),
  and a reply let go from there writes the rest at once.
- Ollama: tool calls arrive whole, without ids. OpenAI: each call's arguments go out
  in two fragments, to exercise assembly; arguments given as a string go as-is.
- ``"stream": false`` (OpenAI): one ``chat.completion`` body after the delays.
- Every complete stream ends with usage and the finish reason.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import h11
import trio

from navi_trio.llm.script import ContentItem, Reply, rough_tokens, split_words
from navi_trio.testing._dialects import _Dialect, _OpenAI
from navi_trio.testing._http import send_json, send_whole


class Dropped(Exception):
    """The reply asked to drop the connection."""


def _usage(reply: Reply, body: Any, chunks: int) -> tuple[int, int]:
    """(prompt, completion) tokens to report: the script's, else a rough count of the
    prompt and one token per content chunk."""
    messages = body.get("messages")
    prompt = reply.prompt_tokens
    if prompt is None:
        prompt = rough_tokens(messages if isinstance(messages, list) else [])
    completion = reply.completion_tokens
    if completion is None:
        completion = chunks
    return prompt, completion


async def stream_reply(
    stream: trio.SocketStream,
    conn: h11.Connection,
    dialect: _Dialect,
    body: dict[str, Any],
    progress: dict[str, int],
    completed: Callable[[], None],
    hold: Callable[[int], Awaitable[bool]],
) -> bool:
    """Play `dialect.reply` as the answer to a chat request; True when it was answered
    whole (`completed` is called once the end is written). Raises `Dropped` when the
    reply drops the connection; `progress["chunks"]` counts the chunks written.
    `hold(chunks)` is awaited before each one; once it held the reply, the rest of it
    is written without its delays."""
    reply = dialect.reply

    paced = True

    async def pause() -> None:
        nonlocal paced
        if await hold(progress["chunks"]) and not reply.endless:
            paced = False  # the hold stood in for the pacing: the rest goes at once
        if paced:
            await trio.sleep(reply.delay_first if progress["chunks"] == 0 else reply.delay_chunk)

    async def send(pieces: Sequence[bytes]) -> None:
        for piece in pieces:
            await stream.send_all(conn.send(h11.Data(data=piece)))
        progress["chunks"] += 1

    if reply.status is not None:
        await trio.sleep(reply.delay_first)
        if reply.error_raw or isinstance(reply.error_body, dict):
            data = (
                reply.error_body.encode()
                if isinstance(reply.error_body, str)
                else json.dumps(reply.error_body).encode()
            )
            ctype = "text/plain" if isinstance(reply.error_body, str) else "application/json"
            await send_whole(stream, conn, reply.status, data, ctype)
        else:
            await send_json(stream, conn, reply.status, dialect.error_body(reply.error_message()))
        return True

    headers = [("Content-Type", dialect.content_type), ("Transfer-Encoding", "chunked")]
    if reply.empty_body:
        # As llama-cpp-python answers a prompt over its window when streaming: 200,
        # chunked, and at once the last (empty) chunk.
        await trio.sleep(reply.delay_first)
        await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)))
        await stream.send_all(conn.send(h11.EndOfMessage()))
        completed()
        return True
    if isinstance(dialect, _OpenAI) and body.get("stream") is False:
        return await whole_reply(stream, conn, dialect, body, completed)
    await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)))
    items = reply.content()
    for item in items:
        if reply.drop_after is not None and progress["chunks"] >= reply.drop_after:
            raise Dropped
        await pause()
        await send(dialect.content(item))
    if reply.endless:
        words = split_words(reply.text) or ["more "]
        for word in itertools.cycle(words):
            await pause()
            await send(dialect.content(ContentItem("text", word)))
    if reply.drop_after is not None:
        raise Dropped
    if reply.stall:
        await trio.sleep_forever()
    await pause()
    line = reply.malformed_line()
    if line is not None:
        await send([dialect.malformed(line)])
    elif reply.error_line is not None:
        await send([dialect.error_line(reply.error_line)])
    else:
        prompt, completion = _usage(reply, body, len(items))
        await send(dialect.final(prompt, completion))
    await stream.send_all(conn.send(h11.EndOfMessage()))
    # Counted here, not after the watcher stops: a client that read the end of the
    # body must already see it counted.
    completed()
    return True


async def whole_reply(
    stream: trio.SocketStream,
    conn: h11.Connection,
    dialect: _OpenAI,
    body: Any,
    completed: Callable[[], None],
) -> bool:
    """A non-streamed answer: one JSON body after all the delays; ``stall`` and ``endless``
    never answer; ``drop_after`` closes without an answer.
    """
    reply = dialect.reply
    items = reply.content()
    await trio.sleep(reply.delay_first + reply.delay_chunk * max(0, len(items) - 1))
    if reply.stall or reply.endless:
        await trio.sleep_forever()
    if reply.drop_after is not None:
        raise Dropped
    line = reply.malformed_line()
    if line is not None:
        await send_whole(stream, conn, 200, line.encode(), "application/json")
    elif reply.error_line is not None:
        await send_json(stream, conn, 200, {"error": {"message": reply.error_line}})
    else:
        prompt, completion = _usage(reply, body, len(items))
        await send_json(stream, conn, 200, dialect.whole(items, prompt, completion))
    completed()
    return True
