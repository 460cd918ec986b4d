"""A TCP proxy in front of a PostgreSQL server that loses the answer to one commit.

    async with cut_proxy(pg_url) as proxy:     # clients connect to proxy.url instead
        proxy.arm(b"marker")                    # the next append whose rows hold it ...
        ...
        await proxy.cut.wait()                  # ... was committed, and its connection cut

What a client sees when the connection drops just as its commit's answer comes back (a
server restart, ``pg_terminate_backend``, a network cut at that moment): an error, for
a write that is in the database. Armed, the proxy watches what each client connection
sends; once a statement calling ``navi_append`` with the marker in its rows went out
(the store's append, `store/postgres/_history.py`), the server's next ReadyForQuery
saying "idle" on that connection (the transaction is over: committed) is not passed on:
both ends are closed instead. Deterministic: the cut follows the server's own answer.
Real TCP on 127.0.0.1, real PostgreSQL; every connection is closed on the way out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from urllib.parse import urlsplit, urlunsplit

import trio

WINDOW = 256 * 1024  # what a connection sent lately, searched for the marker
IDLE = b"Z\x00\x00\x00\x05I"  # ReadyForQuery, transaction status idle
APPEND = b"navi_append"


class CutProxy:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.url = ""
        self.marker: bytes | None = None
        self.cut = trio.Event()

    def arm(self, marker: bytes) -> None:
        """Cut the connection whose append carries `marker`, once its commit answers."""
        self.marker, self.cut = marker, trio.Event()

    async def handle(self, client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream(self.host, self.port)
        doomed = trio.Event()  # this connection's append carried the marker
        async with client, server, trio.open_nursery() as nursery:
            nursery.start_soon(self._upstream, client, server, doomed, nursery.cancel_scope)
            nursery.start_soon(self._downstream, server, client, doomed, nursery.cancel_scope)

    async def _upstream(
        self, client: trio.SocketStream, server: trio.SocketStream, doomed: trio.Event,
        done: trio.CancelScope,
    ) -> None:  # fmt: skip
        sent = b""
        try:
            while data := await client.receive_some():
                if self.marker is not None and not doomed.is_set():
                    sent = (sent + data)[-WINDOW:]
                    if self.marker in sent and APPEND in sent:
                        self.marker = None
                        doomed.set()
                await server.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()

    async def _downstream(
        self, server: trio.SocketStream, client: trio.SocketStream, doomed: trio.Event,
        done: trio.CancelScope,
    ) -> None:  # fmt: skip
        try:
            while data := await server.receive_some():
                if doomed.is_set() and IDLE in data:
                    self.cut.set()  # committed; its answer never reaches the client
                    break
                await client.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()


@asynccontextmanager
async def cut_proxy(pg_url: str) -> AsyncIterator[CutProxy]:
    """A proxy on a free 127.0.0.1 port in front of `pg_url`'s server; its `url` is
    `pg_url` through it."""
    parts = urlsplit(pg_url)
    assert parts.hostname is not None and parts.port is not None, pg_url
    proxy = CutProxy(parts.hostname, parts.port)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, proxy.handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        netloc = f"{parts.username}@127.0.0.1:{port}" if parts.username else f"127.0.0.1:{port}"
        proxy.url = urlunsplit(parts._replace(netloc=netloc))
        yield proxy
        nursery.cancel_scope.cancel()
