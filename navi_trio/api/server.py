"""The WebSocket server: accepts connections and runs one `Connection` actor each.

    server = ApiServer(runtime, host="127.0.0.1", port=0)
    port = await nursery.start(server.run)

Cancelling the task that runs `server.run` stops accepting and ends every connection
(their subscriptions close; the runs go on in the runtime until it closes). The
handshake refuses a browser page from another origin (HTTP 403) before any frame.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

import trio
from trio_websocket import WebSocketRequest, serve_websocket

from navi_trio.api.auth import User, origin_allowed
from navi_trio.api.connection import Connection
from navi_trio.errors import LimitError

if TYPE_CHECKING:
    from navi_trio.runtime import Runtime

log = logging.getLogger(__name__)

# trio-websocket closes the connection on a frame over its own limit; ours is lower so
# that an oversized frame up to this factor gets an error frame and the connection goes on.
HARD_FRAME_FACTOR = 4


class ApiServer:
    def __init__(self, runtime: Runtime, *, host: str = "127.0.0.1", port: int = 8765) -> None:
        self.runtime = runtime
        self.host = host
        self.port = port
        self._connections: dict[str, int] = {}

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        settings = self.runtime.settings
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                partial(
                    serve_websocket,
                    self._handle,
                    self.host,
                    self.port,
                    None,
                    max_message_size=settings.ws_frame_max_bytes * HARD_FRAME_FACTOR,
                    message_queue_size=4,
                )
            )
            port = server.port
            log.info("listening on ws://%s:%d/", self.host, port)
            task_status.started(port)

    async def _handle(self, request: WebSocketRequest) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        origin = headers.get("origin")
        if not origin_allowed(origin):
            log.warning("refused a WebSocket from origin %r", origin)
            await request.reject(403, body=f"origin {origin!r} is not allowed".encode())
            return
        ws = await request.accept()
        peer = ws.remote
        where = str(peer) if isinstance(peer, str) else f"{peer.address}:{peer.port}"
        try:
            await Connection(self, ws, where).run()
        except* Exception:  # one connection's failure must not end the server
            log.exception("connection %s failed", where)

    # -- connections per user ------------------------------------------------------------

    def connected(self, user: User) -> None:
        limit = self.runtime.settings.ws_connections_per_user
        count = self._connections.get(user.id, 0)
        if count >= limit:
            raise LimitError(
                f"user {user.name} already has {count} connections "
                "(NAVI_WS_CONNECTIONS_PER_USER): close one first"
            )
        self._connections[user.id] = count + 1

    def disconnected(self, user: User) -> None:
        count = self._connections.get(user.id, 0) - 1
        if count > 0:
            self._connections[user.id] = count
        else:
            self._connections.pop(user.id, None)

    def connection_count(self, user_id: str) -> int:
        return self._connections.get(user_id, 0)
