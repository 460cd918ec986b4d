"""The browser client's static files, served on the WebSocket port (plain HTTP/1.1).

The daemon reads each connection's request head itself (`HeadReader`: bounded in bytes
and time). A WebSocket upgrade goes to trio-websocket with the bytes already read put
back in front of the stream (`ReplayStream`); any other request is answered here
(`StaticSite.answer`): GET and HEAD of the files in ``navi_trio/web`` (``/`` is
``index.html``), 404 for any other path, 405 for any other method, 403 for a Host that
does not name the daemon (the same check as the WebSocket's: a DNS-rebinding page gets
nothing). Nothing here reads the file system per request: the files are read once,
at the first request for one, from the package (a `navi run`'s private server, which
no page asks, reads none).

Every answer carries a strict Content-Security-Policy: only the daemon's own scripts,
styles and images, no inline script or style, no frames, no forms, and ``connect-src``
naming the page's own ``ws://`` origin (CSP's ``'self'`` does not cover ``ws:`` in
every browser).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from importlib import resources
from typing import TYPE_CHECKING

import attrs
import h11
import trio

from navi_trio.api import health
from navi_trio.api.auth import Tokens, WebAccess
from navi_trio.errors import NaviError
from navi_trio.text import clip

if TYPE_CHECKING:
    from navi_trio.api.metrics import DaemonMetrics
    from navi_trio.api.services import DaemonCore

log = logging.getLogger(__name__)

HEAD_MAX_BYTES = 16 * 1024  # a browser's request head is ~1 KB; cookies of other apps add some
HEAD_TIMEOUT_SEC = 10.0  # from the first byte wanted to the end of the head
IDLE_TIMEOUT_SEC = 15.0  # a kept-alive connection waiting for its next request
REQUESTS_PER_CONNECTION = 100
_CHUNK = 1 << 14

WEB_PACKAGE = "navi_trio.web"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
}
# What a Host may hold to be named in the CSP: a host name, an IPv4 or a bracketed IPv6
# address, a port. host_allowed has accepted it already; this keeps the header clean.
_CSP_HOST = re.compile(r"[A-Za-z0-9.\-]+(:\d{1,5})?|\[[0-9A-Fa-f:.]+\](:\d{1,5})?")


def content_security_policy(host: str | None) -> str:
    """The policy of every answer; `host` (the request's Host) names the page's ws origin."""
    connect = "'self'"
    if host is not None and _CSP_HOST.fullmatch(host):
        connect += f" ws://{host} wss://{host}"
    return (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        f"connect-src {connect}; object-src 'none'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


def security_headers(host: str | None) -> list[tuple[str, str]]:
    return [
        ("Content-Security-Policy", content_security_policy(host)),
        ("X-Content-Type-Options", "nosniff"),
        ("Referrer-Policy", "no-referrer"),
        ("X-Frame-Options", "DENY"),
        ("Cross-Origin-Opener-Policy", "same-origin"),
        ("Cross-Origin-Resource-Policy", "same-origin"),
        ("Cache-Control", "no-cache"),
    ]


# -- the request head ------------------------------------------------------------------


@attrs.frozen
class Head:
    """One request head: h11's parse of it, and the bytes it came in."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]  # names in lower case
    raw: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def is_websocket(self) -> bool:
        upgrade = self.header("upgrade") or ""
        return "websocket" in upgrade.lower()

    @property
    def has_body(self) -> bool:
        length = self.header("content-length")
        return self.header("transfer-encoding") is not None or (
            length is not None and length.strip() != "0"
        )


class HeadTooLarge(Exception):
    """The head did not end within `HEAD_MAX_BYTES`."""


class BadHead(Exception):
    """The head is not HTTP/1.1 h11 accepts; the message says why."""


class HeadReader:
    """Reads request heads off one connection, keeping what came after each.

    `next_head` returns the next head, or None when the client closed (or sent nothing
    within the time); `HeadTooLarge` / `BadHead` when what came is not a head we take.
    `buffered` is everything read and not yet consumed: after a WebSocket head, the head
    itself and whatever the client sent behind it."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._head_raw = b""

    async def next_head(self, within_sec: float = HEAD_TIMEOUT_SEC) -> Head | None:
        end = -1
        with trio.move_on_after(within_sec):
            while (end := self._buffer.find(b"\r\n\r\n")) < 0:
                if len(self._buffer) > HEAD_MAX_BYTES:
                    raise HeadTooLarge(f"the request head is over {HEAD_MAX_BYTES} bytes")
                try:
                    data = await self._stream.receive_some(_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return None
                if not data:
                    return None
                self._buffer += data
        if end < 0:
            return None  # too slow: a silent close, as for an idle connection
        if end + 4 > HEAD_MAX_BYTES:
            raise HeadTooLarge(f"the request head is over {HEAD_MAX_BYTES} bytes")
        raw = bytes(self._buffer[: end + 4])
        del self._buffer[: end + 4]
        self._head_raw = raw
        return _parse(raw)

    def replay(self) -> bytes:
        """The last head and everything read after it: what a WebSocket handshake reads."""
        return self._head_raw + bytes(self._buffer)


def _parse(raw: bytes) -> Head:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_MAX_BYTES)
    conn.receive_data(raw)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise BadHead(f"not an HTTP/1.1 request: {exc}") from None
    if not isinstance(event, h11.Request):
        raise BadHead("not an HTTP/1.1 request")
    headers = tuple((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in event.headers)
    return Head(
        method=event.method.decode("ascii", "replace"),
        target=event.target.decode("ascii", "replace"),
        headers=headers,
        raw=raw,
    )


class ReplayStream(trio.abc.HalfCloseableStream):
    """`inner`, with `prefix` received first: hands trio-websocket a connection whose
    request head the daemon has already read.

    It can also write a frame's bytes at once, outside any task (`write_now`): what the
    socket does not take stays `pending`, and every later send puts it first, whoever
    sends (trio-websocket's writer, its pong or close), so the bytes on the wire keep
    their order; `flush` sends it when nothing else comes."""

    def __init__(self, inner: trio.SocketStream, prefix: bytes) -> None:
        self.inner = inner
        self._prefix = prefix
        self.pending = b""  # the rest of a frame `write_now` began, not yet sent
        self._sending = False  # a send is under way (or waits for the socket)
        self._idle = trio.lowlevel.ParkingLot()  # senders waiting for that one

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            await trio.lowlevel.checkpoint()
            return data
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        while self._sending:  # only `flush` can meet trio-websocket's own sends here
            await self._idle.park()
        self._sending = True
        try:
            if self.pending:
                data, self.pending = self.pending + bytes(data), b""
            await self.inner.send_all(data)
        finally:
            self._sending = False
            if self._idle:
                self._idle.unpark_all()

    def can_write_now(self) -> bool:
        """Nothing is being sent and nothing waits: `write_now` may begin a frame."""
        return not self._sending and not self.pending

    def write_now(self, data: bytes) -> bool:
        """Write `data` now, without waiting (only when `can_write_now`). True when the
        socket took it all; otherwise the rest is `pending` and someone must `flush`
        (a socket error is met there, by the task that sends, as in `send_all`)."""
        fd = self.inner.socket.fileno()  # -1 once closed: never another file's number
        sent = 0
        if fd >= 0:
            try:
                sent = os.write(fd, data)
            except OSError:  # full (EAGAIN), or broken: the flush's send meets it
                sent = 0
        if sent == len(data):
            return True
        self.pending = data[sent:]
        return False

    async def flush(self) -> None:
        """Send what `write_now` left `pending`, if anything."""
        if self.pending:
            await self.send_all(b"")

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


# -- the answers -----------------------------------------------------------------------


@attrs.frozen
class StaticFile:
    body: bytes
    content_type: str
    etag: str


def load_files(package: str = WEB_PACKAGE) -> dict[str, StaticFile]:
    """The client's files by URL path (``/`` for index.html), read once from the package."""
    files: dict[str, StaticFile] = {}
    for entry in resources.files(package).iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if not entry.is_file() or suffix not in CONTENT_TYPES:
            continue  # __init__.py, __pycache__: not part of the page
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        files["/" + entry.name] = StaticFile(body, CONTENT_TYPES[suffix], etag)
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    return files


def bytes_shipped(files: dict[str, StaticFile]) -> int:
    """The size of the page: every file once (``/`` is index.html again)."""
    return sum(len(f.body) for path, f in files.items() if path != "/")


@attrs.define
class StaticSite:
    """Answers the plain HTTP requests of one daemon: the page's files, `/healthz`,
    `/readyz` (api/health.py) and, for `navi serve`, `/metrics` (api/metrics.py) to an
    admin's token or the metrics token, sent as ``Authorization: Bearer TOKEN``."""

    access: WebAccess
    tokens: Tokens | None = None
    core: DaemonCore | None = None
    metrics: DaemonMetrics | None = None
    # `load_files` at the first page request (~30 files read and hashed, ~1 ms).
    files: dict[str, StaticFile] | None = None

    async def answer(
        self, stream: trio.abc.SendStream, head: Head, local_address: str, *, last: bool
    ) -> bool:
        """Answer `head`; True when the connection may carry another request."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_MAX_BYTES)
        conn.receive_data(head.raw)
        request = conn.next_event()
        assert isinstance(request, h11.Request)
        host = head.header("host")
        status, body, headers = await self._route(head, host, local_address)
        headers = [*headers, *security_headers(host if status != 403 else None)]
        if last or head.has_body or status >= 400:
            headers.append(("Connection", "close"))
        headers.append(("Content-Length", str(len(body))))
        out = conn.send(h11.Response(status_code=status, headers=headers)) or b""
        if head.method != "HEAD" and body:
            out += conn.send(h11.Data(data=body)) or b""
        out += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(out)
        return conn.our_state is h11.DONE and not (last or head.has_body or status >= 400)

    async def _route(
        self, head: Head, host: str | None, local_address: str
    ) -> tuple[int, bytes, list[tuple[str, str]]]:
        text = [("Content-Type", "text/plain; charset=utf-8")]
        if not self.access.host_allowed(host, local_address):
            log.warning("refused a page request for host %r", clip(host or ""))
            return 403, b"this Host does not name the navi daemon\n", text
        if head.method not in ("GET", "HEAD"):
            return 405, b"only GET and HEAD\n", [*text, ("Allow", "GET, HEAD")]
        if head.has_body:
            return 400, b"a GET has no body\n", text
        path = head.target.partition("?")[0].partition("#")[0]
        if path in ("/healthz", "/readyz", "/metrics"):
            return await self._service(path, head, text)
        if self.files is None:
            self.files = load_files()
        file = self.files.get(path)
        if file is None:
            return 404, b"not found: the page is at /\n", text
        headers = [("Content-Type", file.content_type), ("ETag", file.etag)]
        if head.header("if-none-match") == file.etag:
            return 304, b"", headers
        return 200, file.body, headers

    async def _service(
        self, path: str, head: Head, text: list[tuple[str, str]]
    ) -> tuple[int, bytes, list[tuple[str, str]]]:
        if path == "/healthz":
            return 200, b"ok\n", text
        json_type = [("Content-Type", "application/json")]
        if path == "/readyz":
            if self.core is None:
                return 404, b"not found: no daemon behind this page\n", text
            result = await health.ready(self.core)
            return (200 if result["ready"] else 503), health.body(result), json_type
        if self.metrics is None or self.core is None:
            return 404, b"not found: metrics are served by navi serve\n", text
        refused = await self._scraper_refused(head)
        if refused is not None:
            return 401, refused.encode(), [*text, ("WWW-Authenticate", 'Bearer realm="navi"')]
        from navi_trio.api.metrics import CONTENT_TYPE

        return 200, self.metrics.page(), [("Content-Type", CONTENT_TYPE)]

    async def _scraper_refused(self, head: Head) -> str | None:
        """Why this request may not read /metrics, or None when it may."""
        scheme, _, token = (head.header("authorization") or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return "metrics need a token: Authorization: Bearer (an admin's, NAVI_METRICS_TOKEN)\n"
        assert self.core is not None
        wanted = self.core.settings.metrics_token
        if wanted and hmac.compare_digest(token.encode(), wanted.encode()):
            return None
        if self.tokens is None:
            return "this token may not read the metrics\n"
        try:
            user = await self.tokens.user(token)
        except NaviError:
            return "unknown token\n"
        return None if user.is_admin else "metrics are for admins (or NAVI_METRICS_TOKEN)\n"


async def answer_error(stream: trio.abc.SendStream, status: int, message: str) -> None:
    """A head we could not take (too large, not HTTP): one plain answer, then close."""
    body = (message + "\n").encode()
    # h11 answers only a request it has read: this one is written by hand.
    reason = {400: "Bad Request", 431: "Request Header Fields Too Large"}.get(status, "Error")
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in security_headers(None)]
    lines += [
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    try:
        await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
