"""A one-request client of the daemon, for `navi sessions|tasks` and `navi doctor`.

    reply = await request(url, token, {"type": "sessions", "action": "list"})

Connects, says hello, sends one frame with an id and returns the reply carrying that
id. Every failure is a `NaviError` with one clear line: `DaemonUnreachableError` when
nothing answers at the URL, `RemoteError` (with the wire code) when the daemon refused.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from navi_trio.api.protocol import Frame, encode
from navi_trio.errors import NaviError

DEFAULT_URL = "ws://127.0.0.1:8765/"
CONNECT_TIMEOUT = 5.0
REPLY_TIMEOUT = 30.0


class DaemonUnreachableError(NaviError):
    """No daemon answers at the URL."""


class RemoteError(NaviError):
    """The daemon answered with an error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code


async def request(url: str, token: str, frame: Frame) -> Frame:
    # Imported on use: `navi run` in this process never needs the WebSocket client.
    from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

    try:
        with trio.fail_after(CONNECT_TIMEOUT + REPLY_TIMEOUT):
            async with open_websocket_url(url, connect_timeout=CONNECT_TIMEOUT) as ws:
                await ws.send_message(encode({"type": "hello", "token": token}))
                welcome = await receive_frame(ws)
                if welcome.get("type") != "welcome":
                    raise _remote(welcome)
                await ws.send_message(encode({**frame, "id": "cli"}))
                while True:
                    reply = await receive_frame(ws)
                    if reply.get("id") == "cli":
                        if reply.get("type") == "error":
                            raise _remote(reply)
                        return reply
    except (OSError, HandshakeError) as exc:
        detail = str(exc).strip()
        raise DaemonUnreachableError(
            f"no daemon answers at {url}: start one with `navi serve`"
            + (f" ({detail})" if detail else "")
        ) from None
    except ConnectionClosed as exc:
        raise DaemonUnreachableError(f"the daemon at {url} closed the connection: {exc}") from None
    except trio.TooSlowError:
        raise DaemonUnreachableError(f"the daemon at {url} did not answer in time") from None


async def receive_frame(ws: Any) -> Frame:
    """The next frame from the daemon on `ws`; `RemoteError` (bad_frame) if not an object."""
    message = await ws.get_message()
    frame = json.loads(message)
    if not isinstance(frame, dict):
        raise RemoteError(
            "bad_frame", f"the daemon sent a frame that is not an object: {message[:200]!r}"
        )
    return frame


def _remote(frame: Frame) -> RemoteError:
    return RemoteError(str(frame.get("code", "?")), str(frame.get("message", frame)))


async def daemon_answers(url: str, timeout: float = 2.0) -> bool:  # noqa: ASYNC109
    """True when a WebSocket handshake at `url` succeeds within `timeout` seconds."""
    from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

    with trio.move_on_after(timeout):
        try:
            async with open_websocket_url(url, connect_timeout=timeout):
                return True
        except (OSError, HandshakeError, ConnectionClosed):
            return False
    return False
