"""The fake LLM server's HTTP/1.1 steps on h11: read one request, send one whole response."""

from __future__ import annotations

import json
from typing import Any

import h11
import trio

MAX_BODY = 64 * 1024 * 1024  # the largest request body (and header block) accepted


async def next_event(stream: trio.SocketStream, conn: h11.Connection) -> Any:
    """The connection's next h11 event, reading from `stream` as it needs."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.receive_some(65536))


async def read_request(
    stream: trio.SocketStream, conn: h11.Connection
) -> tuple[h11.Request, bytes] | None:
    """The next request and its whole body; None when the client closed instead."""
    event = await next_event(stream, conn)
    if not isinstance(event, h11.Request):
        return None
    body = bytearray()
    while True:
        part = await next_event(stream, conn)
        if isinstance(part, h11.Data):
            body += part.data
        elif isinstance(part, h11.EndOfMessage):
            return event, bytes(body)
        else:
            return None


async def send_whole(
    stream: trio.SocketStream, conn: h11.Connection, status: int, data: bytes, ctype: str
) -> bool:
    """A response with a Content-Length, in one write; True (the connection may be kept).
    Not a write per part: the last, empty one would be a cancel point after the client has
    the whole answer, where shutting the server down loses the answer's `completed`."""
    headers = [("Content-Type", ctype), ("Content-Length", str(len(data)))]
    events = [h11.Response(status_code=status, headers=headers), h11.Data(data=data)]
    await stream.send_all(b"".join(conn.send(e) or b"" for e in [*events, h11.EndOfMessage()]))
    return True


async def send_json(stream: trio.SocketStream, conn: h11.Connection, status: int, obj: Any) -> bool:
    return await send_whole(stream, conn, status, json.dumps(obj).encode(), "application/json")
