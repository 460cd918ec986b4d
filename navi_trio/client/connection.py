"""`Connection`: the chat client's WebSocket actor.

It connects, says ``hello`` with the token, waits for ``welcome``, then forwards every
server frame to its owner's channel. When the connection drops it tells the owner with
a local ``{"type": "_disconnected"}`` frame, reconnects with exponential backoff (a
bounded number of tries) and, once back, sends the frames its owner's `resume`
callback returns (``subscribe`` with the last seq seen) before a ``_reconnected`` frame.
Local frame types start with ``_``: the server never sends those.
"""

from __future__ import annotations

from collections.abc import Callable

import trio
from trio_websocket import (
    ConnectionClosed,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from navi_trio.client import frames as wire
from navi_trio.client.frames import Frame

CONNECT_TIMEOUT = 5.0
WELCOME_TIMEOUT = 10.0
RETRIES = 6
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 8.0
# A long session's history comes as one frame: accept more than trio-websocket's 1 MiB.
MAX_FRAME = 64 * 1024 * 1024
_DROPS = (ConnectionClosed, HandshakeError, OSError, trio.TooSlowError)


class ChatError(Exception):
    """Something the chat cannot go on from; the message says what to do."""


class Unauthorized(ChatError):
    """The daemon refused the token."""


class NotConnected(ChatError):
    """A frame could not be sent: the connection is down (it is being retried)."""


def _reason(exc: BaseException) -> str:
    """The most telling text of a drop (trio-websocket's own errors are often empty)."""
    seen: BaseException | None = exc
    while seen is not None:
        if str(seen):
            return f"{type(seen).__name__}: {seen}"
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def _drop(exc: BaseException) -> BaseException | None:
    """The connection-drop leaf of `exc` (maybe a group from the ws nursery), else None."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = [_drop(e) for e in exc.exceptions]
        found = [leaf for leaf in leaves if leaf is not None]
        return found[0] if len(found) == len(exc.exceptions) else None
    return exc if isinstance(exc, _DROPS) else None


class Connection:
    def __init__(
        self,
        url: str,
        token: str,
        out: trio.MemorySendChannel[Frame],
        *,
        resume: Callable[[], list[Frame]] = list,
        retries: int = RETRIES,
        backoff: float = BACKOFF_FIRST,
    ) -> None:
        self.url = url
        self._token = token
        self._out = out
        self._resume = resume
        self._retries = retries
        self._backoff = backoff
        self._ws: WebSocketConnection | None = None

    @property
    def connected(self) -> bool:
        return self._ws is not None

    async def send(self, frame: Frame) -> None:
        ws = self._ws
        if ws is None:
            raise NotConnected("not connected to the daemon (reconnecting…); try again shortly")
        try:
            await ws.send_message(wire.encode(frame))
        except ConnectionClosed:
            raise NotConnected(
                "the connection dropped (reconnecting…); try again shortly"
            ) from None

    async def run(self, *, task_status: trio.TaskStatus[Frame] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect and pump frames until cancelled; raises `ChatError` when it gives up."""
        started = False
        failures = 0
        while True:
            try:
                async with open_websocket_url(
                    self.url,
                    connect_timeout=CONNECT_TIMEOUT,
                    disconnect_timeout=2,
                    max_message_size=MAX_FRAME,
                ) as ws:
                    welcome = await self._hello(ws)
                    self._ws = ws
                    failures = 0
                    if not started:
                        started = True
                        task_status.started(welcome)
                    else:
                        for frame in self._resume():
                            await ws.send_message(wire.encode(frame))
                        await self._out.send({"type": "_reconnected", "welcome": welcome})
                    await self._pump(ws)
            except BaseException as exc:
                self._ws = None
                leaf = _drop(exc)
                if leaf is None:
                    raise
                if not started:
                    raise ChatError(
                        f"no navi daemon answers at {self.url} ({_reason(leaf)}); start one "
                        "with `navi serve` or check --url"
                    ) from None
                failures += 1
                if failures > self._retries:
                    raise ChatError(
                        f"lost the daemon at {self.url} and {self._retries} reconnects failed; "
                        "is `navi serve` still running?"
                    ) from None
                delay = min(self._backoff * 2 ** (failures - 1), BACKOFF_MAX)
                await self._out.send(
                    {
                        "type": "_disconnected",
                        "reason": _reason(leaf),
                        "retry_in": delay,
                        "attempt": failures,
                    }
                )
                await trio.sleep(delay)

    async def _hello(self, ws: WebSocketConnection) -> Frame:
        await ws.send_message(wire.encode(wire.hello(self._token)))
        with trio.fail_after(WELCOME_TIMEOUT):
            frame = wire.decode(await ws.get_message())
        if frame["type"] == "error":
            if frame.get("code") == "unauthorized":
                raise Unauthorized(
                    f"the daemon refused the token ({frame.get('message', '')}): pass --token, "
                    "set NAVI_TOKEN, or use the local-token file `navi serve` writes"
                )
            raise ChatError(f"the daemon refused the connection: {frame.get('message')}")
        if frame["type"] != "welcome":
            raise ChatError(f"expected a welcome frame from the daemon, got {frame['type']!r}")
        return frame

    async def _pump(self, ws: WebSocketConnection) -> None:
        while True:
            text = await ws.get_message()
            try:
                frame = wire.decode(text)
            except wire.BadFrame as exc:
                frame = {"type": "error", "code": "bad_frame", "message": str(exc)}
            if frame["type"] == "error" and frame.get("code") == "unauthorized":
                raise Unauthorized(
                    f"the daemon says: {frame.get('message', 'unauthorized')}; pass --token or "
                    "set NAVI_TOKEN"
                )
            await self._out.send(frame)
