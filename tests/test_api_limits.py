"""Limits of the WebSocket daemon that a client can push on: frame size (in UTF-8
bytes, and past trio-websocket's own limit) and frames per second after a long idle.

Rules: see tests/test_api_server.py (loopback, port 0, absolute timeouts). The idle test
runs on a MockClock that also moves with real time (rate 1): the daemon's store thread
needs real time, and `clock.jump` stands for the hour of idling.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing
import wsproto
import wsproto.events
from api_ws import open_daemon

from navi_trio.api.limits import TokenBucket
from navi_trio.api.protocol import ID_SCAN_CHARS
from navi_trio.api.server import HARD_FRAME_FACTOR

TIMEOUT = 30
IDLE = 3600.0


@pytest.fixture
def real_rate_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(rate=1)


async def _send_big_frame(port: int, token: str, size: int) -> wsproto.events.CloseConnection:
    """A real client: hello, then one text frame of `size` bytes sent whole (as a client
    library does) before it reads; the close frame it then gets. A TCP reset on the way
    fails the test (BrokenResourceError)."""
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(ws.send(wsproto.events.Request(host=f"127.0.0.1:{port}", target="/")))

        async def events() -> list[wsproto.events.Event]:
            data = await stream.receive_some(65536)
            assert data, "the daemon hung up without a close frame"
            ws.receive_data(data)
            return list(ws.events())

        while not any(isinstance(e, wsproto.events.AcceptConnection) for e in await events()):
            pass
        hello = json.dumps({"type": "hello", "token": token})
        await stream.send_all(ws.send(wsproto.events.TextMessage(hello)))
        while not any(isinstance(e, wsproto.events.TextMessage) for e in await events()):
            pass  # the welcome
        frame = json.dumps({"type": "message", "content": "x" * size})
        await stream.send_all(ws.send(wsproto.events.TextMessage(frame)))
        while True:
            for event in await events():
                if isinstance(event, wsproto.events.CloseConnection):
                    return event


async def test_a_10_mb_frame_gets_a_close_1009_not_a_reset(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d:
            hard = d.harness.runtime.settings.ws_frame_max_bytes * HARD_FRAME_FACTOR
            assert hard < 10_000_000
            close = await _send_big_frame(d.port, d.tokens["alice"], 10_000_000)
            assert close.code == 1009, close
            assert close.reason is not None and str(hard) in close.reason, close
            async with d.connect("alice") as c:  # the daemon goes on
                assert (await c.request({"type": "sessions", "action": "list"}))["sessions"] == []


async def test_a_frame_under_the_limit_in_characters_but_over_it_in_bytes_is_too_large(
    tmp_path: Path,
) -> None:
    limit = 2048
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, ws_frame_max_bytes=limit) as d, d.connect("alice") as c:
            frame = json.dumps({"type": "message", "content": "é" * 1100}, ensure_ascii=False)
            assert len(frame) < limit < len(frame.encode("utf-8"))
            await c.send(frame)
            err = await c.next()
            assert err["code"] == "too_large", err
            assert f"{len(frame.encode())} bytes; the limit is {limit}" in err["message"]
            listed = await c.request({"type": "sessions", "action": "list"})
            assert listed["sessions"] == []  # nothing was created; the connection goes on


async def test_too_large_echoes_the_frames_id_when_it_comes_first(tmp_path: Path) -> None:
    limit = 2048
    big = "x" * (ID_SCAN_CHARS + 1000)  # past the part of the frame that is read
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, ws_frame_max_bytes=limit) as d, d.connect("alice") as c:
            content = json.dumps(big)
            for frame, rid in (
                ('{"type": "message", "id": "r-7", "content": ' + content + "}", "r-7"),
                ('{ "id" : 42, "type": "message", "content": ' + content + "}", 42),
                # Nested, or after the content, or not an id: nothing to echo.
                ('{"budget": {"id": "in"}, "type": "message", "content": ' + content + "}", None),
                ('{"type": "message", "content": ' + content + ', "id": "late"}', None),
                ('{"id": 1234567890123456789, "content": ' + content + "}", None),
                ('{"id": ' + content + "}", None),
            ):
                await c.send(frame)
                err = await c.next()
                assert err["code"] == "too_large", err
                assert err.get("id") == rid, (frame[:60], err)


async def test_a_token_bucket_idle_for_an_hour_holds_only_its_burst(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bucket = TokenBucket(rate=20.0, burst=40)
    assert all(bucket.take() for _ in range(40)) and not bucket.take()
    await trio.sleep(IDLE)
    assert [bucket.take() for _ in range(41)] == [True] * 40 + [False]


async def test_after_a_long_idle_a_client_gets_only_the_burst_before_rate_limited(
    tmp_path: Path, real_rate_clock: trio.testing.MockClock
) -> None:
    burst = 3
    with trio.fail_after(TIMEOUT + IDLE):
        async with (
            open_daemon(tmp_path, ws_frames_per_sec=0.1, ws_frames_burst=burst) as d,
            d.connect("alice") as c,
        ):
            first = await c.request({"type": "sessions", "action": "list"})
            assert first["type"] == "sessions"
            real_rate_clock.jump(IDLE)  # an hour without a frame: 360 tokens, uncapped
            replies = [await c.request({"type": "sessions", "action": "list"}) for _ in range(5)]
            assert [r["type"] for r in replies[:burst]] == ["sessions"] * burst
            assert [r.get("code") for r in replies[burst:]] == ["rate_limited"] * 2
