"""Who may open a WebSocket: the Origin and Host checks of the handshake (api/auth.py
`WebAccess`, api/server.py `_accept`).

A browser page is admitted only from the daemon's own origin (http, one of its names
with its port, or the very host and port the browser reached it at) or a configured
one; a request without Origin (not a browser) is admitted; a Host header that does not
name the daemon (DNS rebinding) is refused, whatever its port (a forwarder changes it).

Rules: see tests/test_api_server.py (loopback, port 0, absolute timeouts). The Host
tests speak wsproto over a trio TCP stream: no client library lets the Host header
differ from the address it connects to.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import wsproto
import wsproto.events
from api_ws import Daemon, open_daemon
from trio_websocket import ConnectionRejected

from navi_trio.api.auth import WebAccess
from navi_trio.errors import ConfigError

TIMEOUT = 30
PORT = 8765


async def _handshake(
    d: Daemon, host: str, origin: str | None = None, token: str | None = None
) -> int:
    """The HTTP status of a WebSocket handshake sent with this Host (and Origin): 101
    when accepted, after which the hello (with `token`) must get a welcome."""
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    headers = [] if origin is None else [(b"Origin", origin.encode())]
    stream = await trio.open_tcp_stream("127.0.0.1", d.port)
    async with stream:
        request = wsproto.events.Request(host=host, target="/", extra_headers=headers)
        await stream.send_all(ws.send(request))
        while True:
            data = await stream.receive_some(65536)
            assert data, "the daemon hung up without an answer"
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, wsproto.events.RejectConnection):
                    return event.status_code
                if isinstance(event, wsproto.events.AcceptConnection):
                    if token is not None:
                        hello = wsproto.events.TextMessage(f'{{"type":"hello","token":"{token}"}}')
                        await stream.send_all(ws.send(hello))
                        reply = ""
                        while '"welcome"' not in reply:
                            data = await stream.receive_some(65536)
                            assert data, "no welcome"
                            ws.receive_data(data)
                            reply += "".join(
                                e.data
                                for e in ws.events()
                                if isinstance(e, wsproto.events.TextMessage)
                            )
                    return 101


async def _refused(d: Daemon, origin: str) -> bool:
    try:
        async with d.connect("alice", headers=[("Origin", origin)]):
            return False
    except ConnectionRejected as exc:
        assert exc.status_code == 403, exc
        return True


# -- the policy itself ---------------------------------------------------------------------


def test_only_the_daemons_own_origin_and_configured_ones_pass() -> None:
    access = WebAccess.from_settings(["https://navi.example/"], [], "127.0.0.1")

    def ok(origin: str | None, host: str = f"127.0.0.1:{PORT}") -> bool:
        return access.origin_allowed(origin, host, "127.0.0.1", PORT)

    assert ok(None)  # not a browser
    for own in (f"http://127.0.0.1:{PORT}", f"http://localhost:{PORT}", f"http://[::1]:{PORT}"):
        assert ok(own) and ok(own.upper()), own
    assert ok("https://navi.example") and ok("HTTPS://NAVI.EXAMPLE")
    for foreign in (
        # another scheme on a loopback host
        "chrome-extension://localhost",
        f"chrome-extension://localhost:{PORT}",
        "file://localhost",
        "file://",
        "ftp://127.0.0.1",
        f"https://127.0.0.1:{PORT}",
        f"ws://127.0.0.1:{PORT}",
        # another port of this machine, the default port
        "http://127.0.0.1:9999",
        "http://localhost:3000",
        "http://127.0.0.1",
        # not an origin at all
        "null",
        "",
        f"http://127.0.0.1:{PORT}/path",
        f"http://user@127.0.0.1:{PORT}",
        "http://[::1",
        # other hosts
        f"http://localhost.evil.example:{PORT}",
        f"http://evil.example:{PORT}",
        "https://navi.example:8443",
        "http://navi.example",
    ):
        assert not ok(foreign), foreign
    # Through a forwarder (ssh -L 9000:127.0.0.1:8765): the page and the Host agree.
    assert ok("http://localhost:9000", host="localhost:9000")
    assert not ok("http://localhost:9001", host="localhost:9000")
    assert not ok("http://evil.example:9000", host="evil.example:9000")  # Host refused


def test_a_wildcard_bind_knows_the_address_the_client_came_in_on() -> None:
    access = WebAccess.from_settings([], [], "0.0.0.0")
    lan = f"192.168.1.5:{PORT}"
    assert access.origin_allowed(f"http://{lan}", lan, "192.168.1.5", PORT)
    assert access.host_allowed(lan, "192.168.1.5")
    assert not access.host_allowed(f"localhost:{PORT}", "192.168.1.5")
    assert not access.host_allowed(f"0.0.0.0:{PORT}", "192.168.1.5")
    assert access.host_allowed(f"localhost:{PORT}", "::ffff:127.0.0.1")


def test_the_host_header_must_name_the_daemon() -> None:
    access = WebAccess.from_settings([], ["navi.example", "box.lan:9000"], "127.0.0.1")

    def ok(host: str | None) -> bool:
        return access.host_allowed(host, "127.0.0.1")

    for own in (f"127.0.0.1:{PORT}", f"localhost:{PORT}", f"LOCALHOST:{PORT}", f"[::1]:{PORT}"):
        assert ok(own), own
    assert ok("127.0.0.1:9000") and ok("localhost")  # through a forwarder, or port 80
    assert ok("navi.example") and ok("navi.example:443") and ok("box.lan:9000")
    for bad in (
        f"evil.example:{PORT}",  # DNS rebinding: the attacker's name, our address
        "evil.example",
        "box.lan:9001",
        "box.lan",
        f"localhost.evil.example:{PORT}",
        f"127.0.0.1:{PORT}/x",
        f"a@127.0.0.1:{PORT}",
        "",
        None,
    ):
        assert not ok(bad), bad


def test_a_bad_configured_origin_or_host_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="NAVI_WS_ALLOWED_ORIGINS: 'navi.example'"):
        WebAccess.from_settings(["navi.example"], [], "127.0.0.1")
    with pytest.raises(ConfigError, match="NAVI_WS_ALLOWED_HOSTS: 'a/b'"):
        WebAccess.from_settings([], ["a/b"], "127.0.0.1")


# -- over a real connection --------------------------------------------------------------


async def test_a_page_from_another_origin_is_refused_and_the_daemons_own_passes(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, ws_allowed_origins=("https://navi.example",)) as d:
            for origin in (
                "https://evil.example",
                "chrome-extension://localhost",
                "file://localhost",
                "ftp://127.0.0.1",
                "http://127.0.0.1:9999",
                f"http://127.0.0.1:{d.port + 1}",
                "null",
            ):
                assert await _refused(d, origin), origin
            for origin in (f"http://127.0.0.1:{d.port}", f"http://localhost:{d.port}",
                           "https://navi.example"):  # fmt: skip
                async with d.connect("alice", headers=[("Origin", origin)]) as c:
                    listed = await c.request({"type": "sessions", "action": "list"})
                    assert listed["sessions"] == [], origin
            async with d.connect("alice") as c:  # no Origin: not a browser
                assert (await c.request({"type": "sessions", "action": "list"}))["sessions"] == []


async def test_a_dns_rebinding_host_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, ws_allowed_hosts=("navi.example",)) as d:
            token = d.tokens["alice"]
            own = f"http://127.0.0.1:{d.port}"
            assert await _handshake(d, "evil.example:8765") == 403
            assert await _handshake(d, f"evil.example:{d.port}", origin=own) == 403
            assert await _handshake(d, "evil.example") == 403
            # Another port of ours is what a forwarder (ssh -L) sends: no page's trick.
            assert await _handshake(d, "127.0.0.1:9999", token=token) == 101
            assert await _handshake(d, "localhost:9000", origin="http://localhost:9000",
                                    token=token) == 101  # fmt: skip
            assert await _handshake(d, "localhost:9000", origin=own) == 101
            assert await _handshake(d, "localhost:9000", origin="http://localhost:9001") == 403
            assert await _handshake(d, f"127.0.0.1:{d.port}", token=token) == 101
            assert await _handshake(d, f"localhost:{d.port}", origin=own, token=token) == 101
            assert await _handshake(d, "navi.example", token=token) == 101
