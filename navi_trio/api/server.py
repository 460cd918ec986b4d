"""The WebSocket server: accepts connections and runs one `Connection` actor each.

    server = ApiServer(runtime, host="127.0.0.1", port=0)
    port = await nursery.start(server.run)

Cancelling the task that runs `server.run` stops accepting and ends every connection
(their subscriptions close; the runs go on in the runtime until it closes). The
handshake refuses a browser page from another origin, and a Host header that does not
name the daemon (DNS rebinding), with HTTP 403 before any frame (`WebAccess`).

Each TCP connection is served here rather than by trio-websocket's `serve_websocket`
(`wrap_server_stream` is the same code) so that the server keeps the socket: when
trio-websocket refuses a frame over its own limit it sends a close frame (1009, message
too big) and stops reading, and a socket closed with the rest of the client's frame
unread makes the kernel send a TCP reset, which can destroy that close frame before the
client reads it. So after a 1009 the server reads and drops what the client still sends
(`_drain`) until the client closes, and only then closes the socket.

The same port serves the browser client: the server reads each request head
itself; a WebSocket upgrade goes on to trio-websocket with those bytes replayed in front
of the stream, any other request gets the static page (or 404 / 405 / 403).

Before its hello a connection is nobody's: such connections are bounded in count, in
all and per address (`Pending`: a new one past a bound closes the
oldest), and in bytes: until the hello is taken, trio-websocket may hold a message of at
most NAVI_WS_HELLO_MAX_BYTES (more is its close 1009 naming the size), and only then gets
the frame limit of an authenticated connection.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import h11
import trio

from navi_trio.api import web
from navi_trio.api._trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    wrap_server_stream,
)
from navi_trio.api.auth import StoreTokens, Tokens, User, WebAccess
from navi_trio.api.connection import MESSAGE_TOO_BIG, Connection
from navi_trio.api.limits import Pending
from navi_trio.api.signin import SigninCodes
from navi_trio.errors import LimitError
from navi_trio.text import clip

if TYPE_CHECKING:
    from navi_trio.api.metrics import DaemonMetrics
    from navi_trio.api.services import DaemonCore

log = logging.getLogger(__name__)

# trio-websocket closes the connection on a frame over its own limit; ours is lower so
# that an oversized frame up to this factor gets an error frame and the connection goes on.
HARD_FRAME_FACTOR = 4
# The HTTP handshake must come within this (trio-websocket's own default), and the close
# handshake at the end within CLOSE_TIMEOUT_SEC.
HANDSHAKE_TIMEOUT_SEC = 60.0
CLOSE_TIMEOUT_SEC = 10.0
# After a 1009: how long and how much of the client's rest the server reads and drops.
DRAIN_TIMEOUT_SEC = 10.0
LISTEN_BACKLOG = 4096  # trio.serve_tcp's default (capped by net.core.somaxconn)
DRAIN_MAX_BYTES = 256 << 20
_DRAIN_CHUNK = 1 << 16


class ApiServer:
    def __init__(
        self,
        runtime: DaemonCore,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        reuse_port: bool = False,
        tokens: Tokens | None = None,
        metrics: DaemonMetrics | None = None,
    ) -> None:
        self.runtime = runtime
        # `navi serve`'s metrics (api/metrics.py); None for a private server.
        self.metrics = metrics
        # Whose a hello's token is: the store's users, unless told (a private server).
        self.tokens: Tokens = tokens if tokens is not None else StoreTokens(runtime.store)
        self.signin = SigninCodes()  # one-time codes for the browser page (navi web)
        self.host = host
        self.port = port
        # One of `navi serve --workers N`: its own socket in the port's SO_REUSEPORT group.
        self.reuse_port = reuse_port
        self._connections: dict[str, int] = {}
        settings = runtime.settings
        self.access = WebAccess.from_settings(
            settings.ws_allowed_origins, settings.ws_allowed_hosts, host
        )
        self.site = web.StaticSite(self.access, self.tokens, runtime, metrics)
        if metrics is not None:
            metrics.watch(runtime, self.connections)
        self.pending = Pending(settings.ws_pending_max, settings.ws_pending_per_address)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.reuse_port:
                listeners = await nursery.start(
                    trio.serve_listeners, self._serve, [await self._shared_listener()]
                )
            else:
                listeners = await nursery.start(
                    partial(trio.serve_tcp, self._serve, self.port, host=self.host)
                )
            port = int(listeners[0].socket.getsockname()[1])
            log.info(
                "listening on ws://%s:%d/ (the browser client: http://%s:%d/)",
                self.host,
                port,
                self.host,
                port,
            )
            task_status.started(port)

    async def _shared_listener(self) -> trio.SocketListener:
        family = trio.socket.AF_INET6 if ":" in self.host else trio.socket.AF_INET
        sock = trio.socket.socket(family, trio.socket.SOCK_STREAM)
        try:
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEPORT, 1)
            await sock.bind((self.host, self.port))
            sock.listen(LISTEN_BACKLOG)
        except BaseException:
            sock.close()
            raise
        return trio.SocketListener(sock)

    async def _serve(self, stream: trio.SocketStream) -> None:
        """One TCP connection, counted among those without a hello until it says one
        (`Pending`: past a bound the oldest is closed, by its scope)."""
        with trio.CancelScope() as scope:
            key = self.pending.enter(_endpoint(stream, local=False)[0], scope)
            try:
                await self._requests(stream, key)
            finally:
                self.pending.leave(key)

    async def _requests(self, stream: trio.SocketStream, key: int) -> None:
        """Request heads until one is a WebSocket upgrade (or the client goes); plain
        requests are answered with the page (api/web.py)."""
        reader = web.HeadReader(stream)
        local = _endpoint(stream, local=True)
        for count in range(web.REQUESTS_PER_CONNECTION):
            timeout = web.HEAD_TIMEOUT_SEC if count == 0 else web.IDLE_TIMEOUT_SEC
            try:
                head = await reader.next_head(timeout)
            except web.HeadTooLarge as exc:
                await web.answer_error(stream, 431, str(exc))
                return
            except web.BadHead as exc:
                await web.answer_error(stream, 400, str(exc))
                return
            if head is None:
                return
            if head.is_websocket:
                replayed = web.ReplayStream(stream, reader.replay())
                await self._serve_websocket(stream, replayed, key)
                return
            last = count == web.REQUESTS_PER_CONNECTION - 1
            try:
                if not await self.site.answer(stream, head, local[0], last=last):
                    return
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
                return  # the client went, or sent what h11 will not answer: this one ends

    async def _serve_websocket(
        self, stream: trio.SocketStream, replayed: web.ReplayStream, key: int
    ) -> None:
        """The WebSocket handshake (its head replayed), the connection, the close. Until
        the hello a message may be NAVI_WS_HELLO_MAX_BYTES long (`_said_hello`)."""
        settings = self.runtime.settings
        ws: WebSocketConnection | None = None
        async with trio.open_nursery() as nursery:  # trio-websocket's reader task
            request = None
            with trio.move_on_after(HANDSHAKE_TIMEOUT_SEC):
                request = await wrap_server_stream(
                    nursery,
                    replayed,
                    message_queue_size=4,
                    max_message_size=settings.ws_hello_max_bytes,
                )
            if request is not None:
                try:
                    ws = await self._accept(request, _endpoint(stream, local=True))
                except ConnectionClosed:  # the client left mid-handshake
                    ws = None
            if ws is not None:
                try:
                    await self._handle(ws, _endpoint(stream, local=False), key, replayed)
                finally:
                    with trio.move_on_after(CLOSE_TIMEOUT_SEC):
                        await ws.aclose()
            nursery.cancel_scope.cancel()
        if ws is not None and ws.closed is not None and ws.closed.code == MESSAGE_TOO_BIG:
            await _drain(stream)
        # trio.serve_tcp closes the stream.

    async def _accept(
        self, request: WebSocketRequest, local: tuple[str, int]
    ) -> WebSocketConnection | None:
        """The connection, or None when the handshake was refused (HTTP 403). `local` is
        the address and port the client connected to (the stream trio-websocket holds is
        the replaying wrapper, which has no socket to ask)."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        address, port = local
        origin, host = headers.get("origin"), _host_header(request)
        if not self.access.host_allowed(host, address):
            log.warning("refused a WebSocket for host %r", clip(host or ""))
            body = (
                f"host {clip(host or '')!r} is not a name of this daemon: connect to "
                f"{address}, or list the name in NAVI_WS_ALLOWED_HOSTS"
            )
            await request.reject(403, body=body.encode())
            return None
        if not self.access.origin_allowed(origin, host, address, port):
            log.warning("refused a WebSocket from origin %r", clip(origin or ""))
            body = (
                f"origin {clip(origin or '')!r} is not allowed: only this daemon's own pages "
                "and the origins in NAVI_WS_ALLOWED_ORIGINS"
            )
            await request.reject(403, body=body.encode())
            return None
        return await request.accept()

    async def _handle(
        self, ws: WebSocketConnection, peer: tuple[str, int], key: int, wire: web.ReplayStream
    ) -> None:
        where = f"{peer[0]}:{peer[1]}"
        hello = partial(self._said_hello, ws, key)
        try:
            await Connection(self, ws, where, on_hello=hello, wire=wire).run()
        except* Exception:  # one connection's failure must not end the server
            log.exception("connection %s failed", where)

    def _said_hello(self, ws: WebSocketConnection, key: int) -> None:
        """A valid hello: no longer among the pending, and frames up to the daemon's limit."""
        self.pending.leave(key)
        _allow_messages(ws, self.runtime.settings.ws_frame_max_bytes * HARD_FRAME_FACTOR)

    # -- connections per user ------------------------------------------------------------

    async def connected(self, user: User) -> str | None:
        """Count the connection (here, and across daemons on a shared store: the key of
        its slot, for `disconnected`); LimitError when the user has too many."""
        limit = self.runtime.settings.ws_connections_per_user
        count = self._connections.get(user.id, 0)
        if count >= limit:
            raise LimitError(
                f"user {user.name} already has {count} connections "
                "(NAVI_WS_CONNECTIONS_PER_USER): close one first"
            )
        cluster = self.runtime.cluster
        key = None
        if cluster is not None:
            key, full = await cluster.take("conn", [(user.id, limit)])
            if full is not None:
                raise LimitError(
                    f"user {user.name} already has {limit} connections to the daemons of "
                    "this database (NAVI_WS_CONNECTIONS_PER_USER): close one first"
                )
        self._connections[user.id] = count + 1
        return key

    async def released(self, key: str | None) -> None:
        """The connection's slot across daemons, given back (shielded, bounded)."""
        if key is not None and self.runtime.cluster is not None:
            await self.runtime.cluster.free(key)

    def disconnected(self, user: User) -> None:
        count = self._connections.get(user.id, 0) - 1
        if count > 0:
            self._connections[user.id] = count
        else:
            self._connections.pop(user.id, None)

    def connections(self) -> int:
        """Connections that said hello, of every user."""
        return sum(self._connections.values())


def _endpoint(stream: trio.SocketStream, *, local: bool) -> tuple[str, int]:
    """(address, port) of this end (`local`) or the client's end of the connection."""
    try:
        name = stream.socket.getsockname() if local else stream.socket.getpeername()
    except OSError:  # the client is already gone
        return "", 0
    if isinstance(name, tuple):
        return str(name[0]), int(name[1])
    return str(name), 0


def _allow_messages(ws: WebSocketConnection, size: int) -> None:
    """Let `ws` take messages of up to `size` bytes from now on. trio-websocket (0.12)
    fixes the limit when the connection is made and keeps it without a public setter, so
    this sets it there; tests/test_api_pending.py fails if a new version moves it."""
    limit: Any = ws
    assert isinstance(limit._max_message_size, int), "trio-websocket moved its message limit"
    limit._max_message_size = size


def _host_header(request: WebSocketRequest) -> str:
    """The request's Host header. wsproto takes it out of the headers into its Request
    event (and refuses a request without one); trio-websocket (0.12) keeps that event
    without a public name for it, so this reads it there. tests/test_api_origin.py
    fails if a new version moves it."""
    return request._event.host


async def _drain(stream: trio.SocketStream) -> None:
    """Read and drop what the client still sends until it closes (bounded in time and
    bytes), so that closing the socket sends a FIN, not a reset that would destroy the
    close frame the client has not read yet."""
    received = 0
    with trio.move_on_after(DRAIN_TIMEOUT_SEC):
        try:
            await stream.send_eof()
            while received < DRAIN_MAX_BYTES:
                data = await stream.receive_some(_DRAIN_CHUNK)
                if not data:
                    return
                received += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
