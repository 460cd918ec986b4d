"""The browser client's files on the WebSocket port: plain HTTP answered by the daemon
(navi_trio/api/web.py), the WebSocket upgrade still handed to trio-websocket.

Rules: loopback only, port 0; every test has an absolute `trio.fail_after`; the timeout
tests run on the autojump clock with a stub runtime (only settings: no store thread
to make the clock jump early). Requests are written by hand on a raw TCP stream, so a
test controls every byte (a head cut in two, one too large, two requests on one
connection, an upgrade after a GET).
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h11
import trio
import trio.testing
import wsproto
import wsproto.events
from api_ws import open_daemon

from navi_trio.api import web
from navi_trio.api.server import ApiServer
from navi_trio.settings import REPO_ROOT, Settings

TIMEOUT = 30
WEB = REPO_ROOT / "navi_trio" / "web"
Response = tuple[int, dict[str, str], bytes]


def _get(path: str, host: str, method: str = "GET", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


class Http:
    """An HTTP/1.1 client on one raw connection (h11 reads the answers)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def response(self, head_only: bool = False) -> Response:
        status, body = 0, b""
        headers: dict[str, str] = {}
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                data = await self.stream.receive_some(65536)
                self.conn.receive_data(data)
                if not data and self.conn.their_state is not h11.DONE:
                    if status:
                        return status, headers, body
                    raise AssertionError("the daemon closed without an answer")
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode().lower(): v.decode() for k, v in event.headers}
                if head_only:
                    return status, headers, b""
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
                    self.conn.start_next_cycle()
                return status, headers, body
            elif isinstance(event, h11.ConnectionClosed):
                return status, headers, body

    async def request(self, path: str, host: str, method: str = "GET") -> Response:
        request = h11.Request(method=method, target=path, headers=[("Host", host)])
        await self.send(self.conn.send(request) + self.conn.send(h11.EndOfMessage()))
        return await self.response()

    async def closed(self) -> bool:
        """True when the daemon closes the connection (EOF) or resets it."""
        try:
            while True:
                if not await self.stream.receive_some(65536):
                    return True
        except trio.BrokenResourceError:
            return True


@asynccontextmanager
async def connect(port: int) -> AsyncIterator[Http]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        yield Http(stream)


async def _fetch(port: int, path: str, method: str = "GET", host: str | None = None) -> Response:
    async with connect(port) as c:
        return await c.request(path, host or f"127.0.0.1:{port}", method)


# -- what is served --------------------------------------------------------------------


async def test_the_page_is_at_root_with_a_strict_policy_and_its_own_ws_origin(
    tmp_path: Any,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d:
            status, headers, body = await _fetch(d.port, "/")
            assert status == 200
            assert headers["content-type"] == "text/html; charset=utf-8"
            assert body == (WEB / "index.html").read_bytes()
            csp = headers["content-security-policy"]
            strict = ["default-src 'self'", "script-src 'self'", "style-src 'self'"]
            strict += ["object-src 'none'", "frame-ancestors 'none'", "base-uri 'none'"]
            for part in strict:
                assert part in csp, csp
            assert f"connect-src 'self' ws://127.0.0.1:{d.port} wss://127.0.0.1:{d.port}" in csp
            assert "unsafe" not in csp
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["referrer-policy"] == "no-referrer"
            assert headers["x-frame-options"] == "DENY"
            # The page's name for the daemon is in its connect-src.
            _, headers, _ = await _fetch(d.port, "/", host=f"localhost:{d.port}")
            assert f"ws://localhost:{d.port}" in headers["content-security-policy"]


async def test_each_file_has_its_type_and_head_and_etag_work(tmp_path: Any) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d:
            for name, kind in (("app.js", "text/javascript; charset=utf-8"),
                               ("markdown.js", "text/javascript; charset=utf-8"),
                               ("style.css", "text/css; charset=utf-8"),
                               ("icon.svg", "image/svg+xml")):  # fmt: skip
                status, headers, body = await _fetch(d.port, f"/{name}?v=1")
                assert (status, headers["content-type"]) == (200, kind), name
                assert body == (WEB / name).read_bytes()
            async with connect(d.port) as c:
                await c.send(_get("/app.js", f"127.0.0.1:{d.port}", "HEAD"))
                status, headers, body = await c.response(head_only=True)
                assert status == 200 and body == b""
                assert int(headers["content-length"]) == (WEB / "app.js").stat().st_size
            async with connect(d.port) as c:
                extra = f"If-None-Match: {headers['etag']}\r\n"
                await c.send(_get("/app.js", f"127.0.0.1:{d.port}", extra=extra))
                status, _, body = await c.response()
                assert status == 304 and body == b""


async def test_other_paths_methods_and_hosts_are_refused(tmp_path: Any) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d:
            for path in ("/nope", "/__init__.py", "/../pyproject.toml", "/%2e%2e/pyproject.toml",
                         "//etc/passwd", "/web/app.js"):  # fmt: skip
                status, headers, body = await _fetch(d.port, path)
                assert status == 404, path
                assert "default-src 'self'" in headers["content-security-policy"]
            status, headers, _ = await _fetch(d.port, "/", method="POST")
            assert status == 405 and headers["allow"] == "GET, HEAD"
            status, headers, _ = await _fetch(d.port, "/", method="DELETE")
            assert status == 405
            # DNS rebinding: a page whose own name points at 127.0.0.1 gets nothing.
            status, headers, body = await _fetch(d.port, "/", host="evil.example")
            assert status == 403 and b"navi" in body
            assert "ws://" not in headers["content-security-policy"]
            # A GET with a body is not ours to read: refused, the connection closed.
            async with connect(d.port) as c:
                await c.send(_get("/", f"127.0.0.1:{d.port}", extra="Content-Length: 3\r\n"))
                status, _, _ = await c.response()
                assert status == 400


async def test_a_connection_carries_several_gets_then_the_websocket(tmp_path: Any) -> None:
    """Keep-alive, and an upgrade on a connection that already fetched the page: the head
    the daemon read is replayed to the WebSocket handshake, which then works as ever."""
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d, connect(d.port) as c:
            host = f"127.0.0.1:{d.port}"
            for path in ("/", "/app.js", "/style.css"):
                status, headers, _ = await c.request(path, host)
                assert status == 200 and headers.get("connection") != "close"
            ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
            origin = [(b"Origin", f"http://{host}".encode())]
            await c.send(ws.send(wsproto.events.Request(host=host, target="/",
                                                        extra_headers=origin)))  # fmt: skip

            async def events() -> list[wsproto.events.Event]:
                data = await c.stream.receive_some(65536)
                assert data, "the daemon hung up"
                ws.receive_data(data)
                return list(ws.events())

            while not any(isinstance(e, wsproto.events.AcceptConnection) for e in await events()):
                pass
            hello = json.dumps({"type": "hello", "token": d.tokens["alice"]})
            await c.send(ws.send(wsproto.events.TextMessage(hello)))
            texts: list[str] = []
            while not texts:
                got = await events()
                texts = [e.data for e in got if isinstance(e, wsproto.events.TextMessage)]
            assert json.loads(texts[0])["type"] == "welcome"


# -- bounded heads ------------------------------------------------------------------------


def _stub_server() -> ApiServer:
    runtime = types.SimpleNamespace(settings=Settings.from_env({}), store=None)
    return ApiServer(runtime, port=0)


async def test_a_head_over_the_limit_gets_431_and_close() -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(_stub_server().run)
            async with connect(port) as c:
                big = "X-Pad: " + "a" * web.HEAD_MAX_BYTES + "\r\n"
                await c.send(_get("/", f"127.0.0.1:{port}", extra=big))
                status, headers, _ = await c.response()
                assert status == 431 and headers["connection"] == "close"
                assert await c.closed()
            async with connect(port) as c:  # garbage that ends like a head
                await c.send(b"\x16\x03\x01 hello\r\n\r\n")
                status, _, _ = await c.response()
                assert status == 400
            nursery.cancel_scope.cancel()


async def test_a_head_that_never_ends_is_dropped_after_the_head_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(_stub_server().run)
            async with connect(port) as c:
                start = trio.current_time()
                await c.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line
                assert await c.closed()
                took = trio.current_time() - start
                assert web.HEAD_TIMEOUT_SEC <= took < web.HEAD_TIMEOUT_SEC + 1
            async with connect(port) as c:  # an idle kept-alive connection ends too
                await c.request("/", f"127.0.0.1:{port}")
                start = trio.current_time()
                assert await c.closed()
                took = trio.current_time() - start
                assert web.IDLE_TIMEOUT_SEC <= took < web.IDLE_TIMEOUT_SEC + 1
            nursery.cancel_scope.cancel()


# -- what ships ---------------------------------------------------------------------------


def test_every_file_of_the_client_ships_in_the_package() -> None:
    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools["package-data"]["navi_trio.web"]
    files = [p for p in WEB.iterdir() if p.is_file() and p.name != "__init__.py"]
    assert files and all(any(fnmatch.fnmatch(p.name, pat) for pat in patterns) for p in files)
    served = web.load_files()
    assert sorted(served) == sorted(["/", *(f"/{p.name}" for p in files)])
    assert web.bytes_shipped(served) == sum(p.stat().st_size for p in files)


def test_the_page_has_no_inline_script_or_style_and_fetches_nothing_from_outside() -> None:
    html = (WEB / "index.html").read_text()
    for tag in re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.S):
        assert tag.strip() == "", "inline script"
    assert all("src=" in t for t in re.findall(r"<script\b[^>]*>", html))
    assert not re.search(r"\son\w+\s*=", html), "an inline event handler"
    assert "style=" not in html and "<style" not in html
    for path in WEB.iterdir():
        if path.suffix in (".html", ".js", ".css"):
            text = path.read_text()
            # Links the page makes are the model's; nothing is loaded from a URL.
            assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text), path.name
            assert "@import" not in text and "url(http" not in text, path.name
    sinks = re.compile(
        r"\.(inner|outer)HTML\b|insertAdjacentHTML|document\.write|\beval\(|new Function"
    )
    for path in WEB.glob("*.js"):
        assert not sinks.search(path.read_text()), path.name  # no HTML parsing of any text
