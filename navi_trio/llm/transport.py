"""`H11Transport`: the LLM client's own HTTP/1.1 transport, h11 over trio sockets.

httpx's default transport is httpcore's connection pool, which is general (HTTP/2,
proxies, any async library through a backend layer, locks around every state change)
and so costs a tool round more CPU than the request itself needs. This transport does
what an LLM backend uses and nothing else:

- one `h11.Connection` per socket (``trio.open_tcp_stream``; ``trio.SSLStream`` for
  https, with the client's SSL context, made once, in a thread, on first use);
- a pool per origin (scheme, host, port): idle connections kept newest first (at most
  `max_idle`, each for `keepalive_expiry` seconds; one the server has closed meanwhile
  reads as readable and is replaced before a byte is sent on it), at most
  `max_connections` in use at once (a request past that waits, bounded by the ``pool``
  timeout, which the backend leaves to the stream guard); taking one is O(1);
- a connection goes back to the pool only when both sides finished the exchange and
  the server did not say ``Connection: close``. Anything else (an error, a cancel, a
  body left half read) closes it at once;
- the response body is streamed as it arrives (chunked or Content-Length or until
  close); the ``connect`` / ``read`` / ``write`` / ``pool`` timeouts of httpx's
  `Timeout` are honoured; the stream guard's cancel scopes work around each receive;
- errors are httpx's own (`httpx.ConnectError`, `ConnectTimeout`, `ReadError`,
  `WriteError`, `RemoteProtocolError` …), so callers map them as before. A server
  that closes or resets a connection before the first byte of its answer (a keep-alive
  connection closed as it was reused) gives ``RemoteProtocolError("Server disconnected without
  sending a response.")``, httpcore's words, which `llm/http.py` retries once;
- a response head is bounded: h11 refuses one still incomplete past `MAX_HEAD_BYTES`.

Proxies are not spoken here (and httpx ignores the environment's proxy variables once a
client is given a transport): with a proxy set in the environment (`env_proxies`) the
backend's client keeps httpx's own transport (llm/factory.py).
"""

from __future__ import annotations

import os
import select
import ssl
import urllib.request
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, cast

import h11
import httpx
import trio

from navi_trio.caches import remember

MAX_CONNECTIONS = 1024  # in use at once per origin (ShardedClient had no cap at all)
MAX_IDLE = 512  # idle keep-alive connections kept per origin
KEEPALIVE_EXPIRY = 4.0  # idle seconds kept: under the 5 s after which uvicorn and llama.cpp close
MAX_HEAD_BYTES = 64 * 1024  # a response's status line and headers
READ_SIZE = 64 * 1024
MAX_CHECKED = 64  # header sets h11 has checked, kept per transport (a backend sends one)
DISCONNECTED = "Server disconnected without sending a response."

Origin = tuple[bytes, str, int]


def _httpx_error(
    exc: BaseException, error: type[httpx.TransportError], timeout: type[httpx.TimeoutException]
) -> BaseException | None:
    """trio's and h11's `exc` as httpx's error (`_mapped`'s rule, for a hot loop's
    ``try``), or None: not one of theirs. Its ``__cause__`` is what to raise it from
    (None for a timeout)."""
    new: BaseException
    if isinstance(exc, trio.TooSlowError):
        return timeout(f"timed out ({timeout.__name__})")
    if isinstance(exc, h11.RemoteProtocolError):
        new = httpx.RemoteProtocolError(str(exc))
    elif isinstance(exc, h11.LocalProtocolError):
        new = httpx.LocalProtocolError(str(exc))
    elif isinstance(exc, OSError | trio.BrokenResourceError | trio.ClosedResourceError):
        # trio's BrokenResourceError carries the reason (an ssl.SSLError: a certificate
        # not trusted …) as its cause: say that.
        cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else None
        new = error(str(cause or exc) or type(exc).__name__)
    else:
        return None
    new.__cause__ = exc
    return new


@contextmanager
def _mapped(
    error: type[httpx.TransportError], timeout: type[httpx.TimeoutException]
) -> Iterator[None]:
    """trio's and h11's errors as httpx's: `error` for a broken socket, `timeout` for
    a deadline passed, RemoteProtocolError for a server breaking HTTP/1.1."""
    try:
        yield
    except Exception as exc:
        mapped = _httpx_error(exc, error, timeout)
        if mapped is None:
            raise
        raise mapped from mapped.__cause__  # (None for a timeout: `from None`)


class _Conn:
    """One socket and its h11 state machine."""

    __slots__ = ("stream", "sock", "plain", "h11", "origin", "idle_since", "used", "busy")

    def __init__(self, stream: trio.abc.Stream, sock: trio.socket.SocketType, origin: Origin):
        self.stream = stream
        self.sock = sock
        self.plain = isinstance(stream, trio.SocketStream)  # no TLS: `_read` reads `sock`
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.origin = origin
        self.idle_since = 0.0
        self.used = 0  # requests sent on it
        self.busy = True  # in use: holds one of its origin's slots

    def close(self) -> None:
        """Close the socket now (no await: safe in a cancelled scope and in finally).
        trio wakes any task waiting on it with ClosedResourceError."""
        self.sock.close()

    def looks_dead(self) -> bool:
        """An idle connection the server closed (or wrote to): readable means EOF or
        bytes nobody asked for; either way it cannot carry a request."""
        poll = select.poll()  # not select.select: it fails for descriptors past 1023
        try:
            poll.register(self.sock.fileno(), select.POLLIN)
            return bool(poll.poll(0))
        except (OSError, ValueError):
            return True

    async def receive(self, read_timeout: float | None) -> object:
        """The next h11 event (an `h11.Event`, or `h11.PAUSED`), reading from the
        socket as needed. EOF before any byte of the answer is `DISCONNECTED`."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            if read_timeout is None:  # the backends' (the stream guard times a stream)
                data = await self._read()
            else:
                with trio.fail_after(read_timeout):
                    data = await self._read()
            if not data and self.h11.their_state is h11.SEND_RESPONSE:
                raise httpx.RemoteProtocolError(DISCONNECTED)
            self.h11.receive_data(cast(bytes, data))  # a bytearray does as well

    async def _read(self) -> bytes | bytearray:
        """The socket's next bytes (b"" at EOF): trio's ``receive_some`` on a plain TCP
        socket, without its layers (a stream's checks, a generator context manager
        translating its errors, an async one around the read that raises and catches
        `BlockingIOError` through it whenever the socket is not readable yet, as at
        every chunk of a paced answer). The same steps: no read once cancelled, a read
        tried at once (then a checkpoint, that nothing cancels, so the bytes are not
        lost), else a wait until readable; the same errors (`OSError`, and
        `trio.ClosedResourceError` once closed). A TLS stream reads through trio."""
        if not self.plain:
            return await self.stream.receive_some(READ_SIZE)
        fd = self.sock.fileno()  # -1 once closed: never another file's number
        if fd < 0:
            raise trio.ClosedResourceError("the connection was closed")
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            pass
        else:  # a fast stream's bytes were there already: a turn for the others first
            await trio.lowlevel.cancel_shielded_checkpoint()
            return data
        while True:
            await trio.lowlevel.wait_readable(fd)
            try:
                return os.read(fd, READ_SIZE)
            except BlockingIOError:  # readable, then not: wait again
                continue


class RequestHeads:
    """h11's `Request` event for an httpx request, its headers checked once per set.

    h11 checks every header name and value against HTTP's grammar (no newline, no NUL,
    no space at either end: a config's header value cannot smuggle a line in) for every
    request. A chat backend sends the same headers each time but for Content-Length, so
    a set that passed once, in that order, is not matched again: only its digits-only
    Content-Length differs, which the grammar always allows. Everything else h11 does
    each time (the method and target, one Host, Content-Length against
    Transfer-Encoding, Content-Length's own digits)."""

    def __init__(self, max_sets: int = MAX_CHECKED) -> None:
        self._checked: dict[tuple[tuple[bytes, bytes], ...], None] = {}
        self._max_sets = max_sets

    def event(self, request: httpx.Request) -> h11.Request:
        raw = request.headers.raw
        target = request.url.raw_path
        rest = tuple(h for h in raw if not (h[0].lower() == b"content-length" and h[1].isdigit()))
        if rest in self._checked:
            method = request.method.encode("ascii")
            return h11.Request(method=method, target=target, headers=raw, _parsed=True)
        event = h11.Request(method=request.method, target=target, headers=raw)
        remember(self._checked, rest, None, self._max_sets)
        return event


BODY = "navi_trio.body"  # a response's extension: its `_Body` (`direct_body`)


def direct_body(response: httpx.Response) -> AsyncIterator[bytes] | None:
    """`response`'s body as ``aiter_raw`` gives it, read straight from its connection
    when this transport made the response (else None): without the two async
    generators httpx puts around each read (``aiter_raw``'s and its client's, which
    count the bytes and add the request to an error). Closing the response closes the
    body as before (its connection back to the pool if the exchange finished)."""
    body = response.extensions.get(BODY)
    if not isinstance(body, _Body):
        return None
    if response.is_stream_consumed:
        raise httpx.StreamConsumed()
    response.is_stream_consumed = True
    return body.__aiter__()


class _Body(httpx.AsyncByteStream):
    """A response body read from its connection as the caller iterates; `aclose`
    gives the connection back only if the exchange finished cleanly."""

    def __init__(self, pool: H11Transport, conn: _Conn, read_timeout: float | None) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self._read_timeout = read_timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            raise httpx.StreamClosed()
        read_timeout = self._read_timeout
        try:
            while True:
                try:  # `_mapped`, written out: this runs for every read of a stream
                    event = await conn.receive(read_timeout)
                except Exception as exc:
                    mapped = _httpx_error(exc, httpx.ReadError, httpx.ReadTimeout)
                    if mapped is None:
                        raise
                    raise mapped from mapped.__cause__
                if type(event) is h11.Data:
                    yield bytes(event.data)
                elif type(event) is h11.EndOfMessage:
                    return
                elif event is h11.PAUSED or type(event) is h11.ConnectionClosed:
                    return  # the body ended with the connection (no framing)
        except BaseException:
            self._drop()
            raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._discard(conn)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._release(conn)


class H11Transport(httpx.AsyncBaseTransport):
    """An `httpx.AsyncBaseTransport` for HTTP/1.1 on h11 and trio (see the module)."""

    def __init__(
        self,
        *,
        verify: ssl.SSLContext | str | bool = True,
        max_connections: int = MAX_CONNECTIONS,
        max_idle: int = MAX_IDLE,
        keepalive_expiry: float = KEEPALIVE_EXPIRY,
    ) -> None:
        self._verify = verify
        self._ssl: ssl.SSLContext | None = verify if isinstance(verify, ssl.SSLContext) else None
        self.max_connections = max_connections
        self.max_idle = max_idle
        self.keepalive_expiry = keepalive_expiry
        self._idle: dict[Origin, deque[_Conn]] = {}
        self._slots: dict[Origin, trio.Semaphore] = {}
        self._all: set[_Conn] = set()  # open, in use or idle (closed at aclose)
        self.connections_made = 0  # for tests and benchmarks
        self._heads = RequestHeads()
        self._closed = False

    # -- the pool --------------------------------------------------------------------

    def _take_idle(self, origin: Origin) -> _Conn | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = trio.current_time()
        while idle:
            conn = idle.pop()  # the newest: the least likely to be closed by now
            if now - conn.idle_since < self.keepalive_expiry and not conn.looks_dead():
                conn.busy = True  # the slot the caller acquired is now this one's
                return conn
            self._discard(conn)
        return None

    def _release(self, conn: _Conn) -> None:
        """A response closed: its connection back to the pool, or closed."""
        state = conn.h11
        reusable = (
            not self._closed
            and state.our_state is h11.DONE
            and state.their_state is h11.DONE
            and len(self._idle.get(conn.origin, ())) < self.max_idle
        )
        if not reusable or conn not in self._all:
            self._discard(conn)
            return
        self._free(conn)
        state.start_next_cycle()
        conn.idle_since = now = trio.current_time()
        idle = self._idle.setdefault(conn.origin, deque())
        while idle and now - idle[0].idle_since >= self.keepalive_expiry:
            self._discard(idle.popleft())  # the oldest, expired
        idle.append(conn)

    def _free(self, conn: _Conn) -> None:
        """`conn` no longer in use: its slot to the next request."""
        if conn.busy:
            conn.busy = False
            self._slots[conn.origin].release()

    def _discard(self, conn: _Conn) -> None:
        """Close `conn` (at once: never reused) and free its slot if it held one."""
        self._all.discard(conn)
        conn.close()
        self._free(conn)

    async def _acquire(self, origin: Origin, pool_timeout: float | None) -> None:
        slots = self._slots.get(origin)
        if slots is None:
            slots = self._slots[origin] = trio.Semaphore(self.max_connections)
        try:
            slots.acquire_nowait()  # the usual case: no wait, no checkpoint
        except trio.WouldBlock:
            with _mapped(httpx.PoolTimeout, httpx.PoolTimeout):
                with _deadline(pool_timeout):
                    await slots.acquire()

    async def _connect(
        self, request: httpx.Request, origin: Origin, connect_timeout: float | None
    ) -> _Conn:
        scheme, host, port = origin
        with _mapped(httpx.ConnectError, httpx.ConnectTimeout):
            with _deadline(connect_timeout):
                tcp = await trio.open_tcp_stream(host, port)
                stream: trio.abc.Stream = tcp
                if scheme == b"https":
                    try:
                        context = await self._ssl_context()
                        sni = request.extensions.get("sni_hostname") or host
                        # https_compatible: a close without TLS close_notify is an EOF
                        # (as HTTPS servers do, and as httpcore reads them).
                        tls = trio.SSLStream(
                            tcp, context, server_hostname=sni, https_compatible=True
                        )
                        await tls.do_handshake()
                    except BaseException:
                        tcp.socket.close()
                        raise
                    stream = tls
        conn = _Conn(stream, tcp.socket, origin)
        self._all.add(conn)
        self.connections_made += 1
        return conn

    async def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            # Loading the CA certificates takes 10-25 ms: not on the event loop.
            verify = self._verify
            context = await trio.to_thread.run_sync(lambda: httpx.create_ssl_context(verify))
            context.set_alpn_protocols(["http/1.1"])
            self._ssl = self._ssl or context
        return self._ssl

    # -- one request -----------------------------------------------------------------

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the transport is closed")
        url = request.url
        scheme = url.raw_scheme
        if scheme not in (b"http", b"https"):
            raise httpx.UnsupportedProtocol(f"not an http(s) URL: {url}")
        port = url.port or (443 if scheme == b"https" else 80)
        origin = (scheme, url.host, port)
        timeouts: dict[str, Any] = request.extensions.get("timeout") or {}
        await self._acquire(origin, timeouts.get("pool"))
        conn = self._take_idle(origin)
        try:
            if conn is None:
                conn = await self._connect(request, origin, timeouts.get("connect"))
            conn.used += 1
            head = await self._exchange(conn, request, timeouts)
        except BaseException:
            if conn is None:
                self._slots[origin].release()
            else:
                self._discard(conn)
            raise
        body = _Body(self, conn, timeouts.get("read"))
        return httpx.Response(
            status_code=head.status_code,
            headers=head.headers.raw_items(),
            stream=body,
            extensions={
                "http_version": b"HTTP/" + head.http_version,
                "reason_phrase": head.reason,
                BODY: body,
            },
        )

    async def _exchange(
        self, conn: _Conn, request: httpx.Request, timeouts: dict[str, Any]
    ) -> h11.Response:
        """Send `request` on `conn`; return the response head once it has come."""
        state = conn.h11
        with _mapped(httpx.LocalProtocolError, httpx.WriteTimeout):
            head = state.send(self._heads.event(request))
        try:
            body: bytes | None = request.content
        except httpx.RequestNotRead:
            body = None
        write = timeouts.get("write")
        try:
            with _mapped(httpx.WriteError, httpx.WriteTimeout):
                with _deadline(write):
                    if body is not None:
                        data = state.send(h11.Data(data=body)) if body else b""
                        await conn.stream.send_all(head + data + state.send(h11.EndOfMessage()))
                    else:
                        await conn.stream.send_all(head)
                        async for part in request.stream:  # type: ignore[union-attr]
                            await conn.stream.send_all(state.send(h11.Data(data=part)))
                        await conn.stream.send_all(state.send(h11.EndOfMessage()))
        except httpx.WriteError:
            # A server may close early and still answer (an error status): read it. A
            # stale keep-alive connection then reads EOF: DISCONNECTED, sent again.
            pass
        read = timeouts.get("read")
        while True:
            try:
                with _mapped(httpx.ReadError, httpx.ReadTimeout):
                    event = await conn.receive(read)
            except httpx.ReadError as exc:
                if state.their_state is h11.SEND_RESPONSE:  # reset before any answer
                    raise httpx.RemoteProtocolError(DISCONNECTED) from exc
                raise
            if type(event) is h11.Response:
                return event
            if type(event) is not h11.InformationalResponse:  # 1xx: wait for the answer
                raise httpx.RemoteProtocolError(f"unexpected {type(event).__name__}")

    # -- the end ---------------------------------------------------------------------

    @property
    def idle_connections(self) -> int:
        """Idle keep-alive connections now, all origins (for tests and benchmarks)."""
        return sum(len(q) for q in self._idle.values())

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._all):
            self._all.discard(conn)
            conn.close()
        self._idle.clear()
        await trio.lowlevel.checkpoint()


def _deadline(seconds: float | None) -> AbstractContextManager[object]:
    """``trio.fail_after(seconds)``, or nothing for no timeout (httpx's None)."""
    return nullcontext() if seconds is None else trio.fail_after(seconds)


def env_proxies() -> bool:
    """Whether the environment names a proxy httpx would use for some URL (HTTP_PROXY,
    HTTPS_PROXY, ALL_PROXY, either case: what httpx reads with ``trust_env``)."""
    found = urllib.request.getproxies()
    return any(found.get(scheme) for scheme in ("http", "https", "all"))
