"""Connections before their hello are bounded: in count (in all and per address, the
oldest closed to make room) and in bytes (the first frame is a hello, at most
NAVI_WS_HELLO_MAX_BYTES), so a local process flooding the port neither grows the daemon
nor keeps an authenticated client out.

Rules: the flood test runs a real `navi serve` process (tests/reliability.py) and real
TCP connections on 127.0.0.1 (several loopback source addresses), speaking the WebSocket
handshake and a frame header by hand, as an attacker would; the daemon's memory and file
descriptors are read from /proc. `Pending` alone is driven on trio's clock. Every test
has an absolute time limit.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
import trio
from reliability import clean_env, navi_serve, open_fds, peak_rss_mb
from trio_websocket import ConnectionClosed, open_websocket_url

from navi_trio.api.limits import Pending

FLOOD = 160  # connections that never say hello
SOURCES = 5  # loopback source addresses they come from (127.0.0.2 …)
SENT = 1 << 20  # bytes of a 4 MiB frame each sends, then stalls
# Measured: 204 MB without the bounds (1 MiB and more held per connection), 42 MB with
# them (at most 128 connections, each past its handshake, each held to 16 KiB).
GROWTH_MAX_MB = 80


async def stalled(port: int, source: str, payload: bytes) -> trio.SocketStream | None:
    """A WebSocket past its handshake that sends `payload` of a 4 MiB text frame and
    stops there; None when the daemon closed it on the way."""
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
    key = base64.b64encode(os.urandom(16)).decode()
    head = (
        f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    try:
        await stream.send_all(head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = await stream.receive_some(4096)
            if not chunk:
                await stream.aclose()
                return None
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 101"), answer[:200]
        frame = bytes([0x81, 0x80 | 127]) + (4 << 20).to_bytes(8, "big") + b"\0\0\0\0"
        await stream.send_all(frame + payload)  # mask 0: the payload as it is
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await stream.aclose()
        return None
    return stream


@pytest.mark.slow
async def test_a_flood_without_hellos_stays_bounded_and_a_client_with_a_token_gets_in(
    tmp_path: Path,
) -> None:
    payload = b"a" * SENT
    env = clean_env(tmp_path)
    with trio.fail_after(120):
        async with navi_serve(env, "http://127.0.0.1:9", tmp_path / "serve.log") as daemon:
            port = int(daemon.url.rsplit(":", 1)[1].strip("/"))
            async with daemon.connect() as first:  # warm: one connection through
                assert first.ws is not None
            fds, peak = open_fds(daemon.pid), peak_rss_mb(daemon.pid)
            held: list[trio.SocketStream] = []
            try:
                for i in range(FLOOD):
                    source = f"127.0.0.{2 + i % SOURCES}"
                    stream = await stalled(port, source, payload)
                    if stream is not None:
                        held.append(stream)
                async with daemon.connect() as client:  # hello, welcome: in
                    reply = await client.request({"type": "sessions", "action": "list"})
                    assert reply["type"] == "sessions", reply
                grown = peak_rss_mb(daemon.pid) - peak
                now_fds = open_fds(daemon.pid) - fds
            finally:
                for stream in held:
                    await stream.aclose()
    assert grown < GROWTH_MAX_MB, f"the daemon grew {grown:.0f} MB for {FLOOD} stalled sockets"
    assert now_fds <= 128 + 8, f"the daemon holds {now_fds} more descriptors"


async def test_a_first_frame_over_the_hello_limit_is_closed_with_1009_naming_the_size(
    tmp_path: Path,
) -> None:
    from api_ws import open_daemon

    with trio.fail_after(30):
        async with open_daemon(tmp_path, ws_hello_max_bytes=4096) as d:
            async with open_websocket_url(d.url, max_message_size=1 << 20) as ws:
                await ws.send_message('{"type": "hello", "token": "' + "x" * 5000 + '"}')
                with pytest.raises(ConnectionClosed) as info:
                    await ws.get_message()
            assert info.value.reason is not None
            assert info.value.reason.code == 1009
            assert "4096" in str(info.value.reason.reason)
            # After a hello, frames up to the daemon's limit (1 MiB) go through.
            async with d.connect("alice") as alice:
                big = "y" * 200_000
                reply = await alice.request({"type": "message", "content": big, "mode": "bad"})
                assert reply["type"] == "error" and reply["code"] == "bad_frame", reply


async def test_pending_closes_the_oldest_of_the_address_then_of_all() -> None:
    pending = Pending(total=3, per_address=2)
    scopes = [trio.CancelScope() for _ in range(5)]
    a1 = pending.enter("a", scopes[0])
    pending.enter("a", scopes[1])
    pending.enter("a", scopes[2])  # a's third: a's oldest goes
    assert [s.cancel_called for s in scopes[:3]] == [True, False, False]
    pending.leave(a1)  # gone already: nothing
    pending.enter("b", scopes[3])
    assert len(pending) == 3
    pending.enter("c", scopes[4])  # a fourth in all: the oldest of all goes (a's second)
    assert [s.cancel_called for s in scopes] == [True, True, False, False, False]
    assert len(pending) == 3 and pending.closed == 2


def test_the_message_limit_of_trio_websocket_is_where_the_server_sets_it() -> None:
    """`_allow_messages` sets a private attribute of trio-websocket: a version that
    moves it fails here, not silently in the daemon."""
    from trio_websocket import WebSocketConnection
    from wsproto import ConnectionType, WSConnection

    from navi_trio.api.server import _allow_messages

    ws = WebSocketConnection(
        trio.testing.MemoryReceiveStream(),  # type: ignore[arg-type]
        WSConnection(ConnectionType.SERVER),
        max_message_size=100,
    )
    _allow_messages(ws, 12345)
    assert ws._max_message_size == 12345
