"""`WsPeerLink`: the `peer` tool's wire-protocol link to another navi daemon.

    async with link.ask(url, token, "question", session_id=None, profile=None) as run:
        frame = await run.receive()          # the run's session frames, stream_end last

`ask` connects, says hello, sends the message and waits for its ``ok`` (the peer
subscribes this connection to the session when it gets the message). A message the
peer queued behind other runs is followed from the start of its own run on.

The tool calling `ask` is cancelled when our run is stopped, its background task is
cancelled or its timeout passes. Then the peer's run must be stopped too, and the
peer must be heard confirming it, so each connection's reader task runs in the link's
own nursery (started by the runtime), not under the caller's cancel scope. Leaving
`ask` before the run's stream_end sends ``stop`` for the session and waits for the
run to end, shielded, within `STOP_GRACE` seconds; then the connection closes, and
its reader is cancelled whatever the peer does.

The token goes into the hello frame and nowhere else: no error text, no log line.
"""

from __future__ import annotations

import collections
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:  # trio_websocket is imported on first use: `navi run` never needs it
    from trio_websocket import WebSocketConnection

from navi_trio.api.protocol import Frame, encode
from navi_trio.tools.peer import PeerError, PeerRefusedError, PeerUnreachableError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
REPLY_TIMEOUT = 30.0  # the welcome, and the ok of the message
STOP_GRACE = 5.0  # for the peer to confirm a stop, then to close
MAX_FRAME = 16 * 1024 * 1024  # a long final answer comes as one stream_end frame
_ASK_ID = "peer-ask"
_STOP_ID = "peer-stop"


def _drop(exc: BaseException) -> bool:
    """Whether `exc` (maybe a group of them) says the connection could not be made."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_drop(e) for e in exc.exceptions)
    from trio_websocket import ConnectionClosed, HandshakeError

    return isinstance(exc, OSError | HandshakeError | ConnectionClosed)


class _Run:
    def __init__(
        self, ws: WebSocketConnection, session_id: str, created: bool, message: str
    ) -> None:
        self._ws = ws
        self.session_id = session_id
        self.created = created
        self.pending: collections.deque[Frame] = collections.deque()
        self.queued = False  # our message waits behind other runs
        self._message = message
        self._ahead: int | None = None  # stream_ends to skip before ours (when queued)
        self.ended = False  # our run's top-level stream_end was seen

    @property
    def running(self) -> bool:
        """Our run is the one the peer's session is running now."""
        return not self.ended and (not self.queued or self._ahead == 0)

    async def _next(self) -> Frame:
        return self.pending.popleft() if self.pending else await _receive(self._ws)

    def _ours(self, frame: Frame) -> bool:
        """Whether `frame` belongs to our run; counts the runs queued ahead of it."""
        if frame.get("session_id") != self.session_id or frame.get("seq") is None:
            if frame.get("type") == "error" and frame.get("code") == "unauthorized":
                raise PeerRefusedError("unauthorized", str(frame.get("message", "")))
            return False  # another session's frame, a reply, a task_update
        top_end = frame.get("type") == "stream_end" and not frame.get("is_subagent")
        if self.queued and self._ahead != 0:
            if self._ahead is None:
                # Published when our message was queued, before any later frame.
                if frame.get("type") == "message_queued" and frame.get("text") == self._message:
                    self._ahead = int(frame.get("position", 1))
            elif top_end:
                self._ahead -= 1
            return False
        self.ended = self.ended or top_end
        return True

    async def receive(self) -> Frame:
        while True:
            frame = await self._next()
            if self._ours(frame):
                return frame

    async def stop(self) -> None:
        """Ask the peer to stop our run, and wait until it ended (or was not running)."""
        await _send_frame(self._ws, {"type": "stop", "session_id": self.session_id, "id": _STOP_ID})
        while not self.ended:
            frame = await self._next()
            if frame.get("id") == _STOP_ID and not frame.get("stopped"):
                return  # it had ended already (or the stop was refused): nothing will come
            self._ours(frame)


async def _send_frame(ws: WebSocketConnection, frame: Frame) -> None:
    from trio_websocket import ConnectionClosed

    try:
        await ws.send_message(encode(frame))
    except ConnectionClosed as exc:
        raise PeerUnreachableError(f"the peer closed the connection ({_reason(exc)})") from None


async def _receive(ws: WebSocketConnection) -> Frame:
    from trio_websocket import ConnectionClosed

    try:
        text = await ws.get_message()
    except ConnectionClosed as exc:
        raise PeerUnreachableError(f"the peer closed the connection ({_reason(exc)})") from None
    try:
        frame = json.loads(text)
    except ValueError:
        frame = None
    if not isinstance(frame, dict):
        raise PeerError(f"the peer sent a frame that is not a JSON object: {str(text)[:120]!r}")
    return frame


async def _hello(ws: WebSocketConnection, token: str) -> Frame:
    await _send_frame(ws, {"type": "hello", "token": token})
    welcome = await _receive(ws)
    if welcome.get("type") != "welcome":
        raise PeerRefusedError(str(welcome.get("code", "?")), str(welcome.get("message", "")))
    return welcome


class WsPeerLink:
    """The runtime's link to peers; `run` hosts the connections' reader tasks."""

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    @asynccontextmanager
    async def ask(
        self, url: str, token: str, message: str, *, session_id: str | None, profile: str | None
    ) -> AsyncIterator[_Run]:
        if self._nursery is None:
            raise PeerError("the peer link is not running (the daemon is stopping)")
        from trio_websocket import connect_websocket_url

        nursery = self._nursery
        scope = trio.CancelScope()  # the connection's: cancelled when we are done

        async def hold(*, task_status: trio.TaskStatus[WebSocketConnection]) -> None:
            with scope:
                async with trio.open_nursery() as inner:
                    ws = await connect_websocket_url(inner, url, max_message_size=MAX_FRAME)
                    task_status.started(ws)
                    await trio.sleep_forever()

        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                ws: WebSocketConnection = await nursery.start(hold)
        except trio.TooSlowError:
            raise PeerUnreachableError(f"no answer within {CONNECT_TIMEOUT:g} s") from None
        except BaseException as exc:
            if not _drop(exc):
                raise
            raise PeerUnreachableError(f"no navi daemon answers: {_reason(exc)}") from None
        run: _Run | None = None
        try:
            try:
                with trio.fail_after(REPLY_TIMEOUT):
                    await _hello(ws, token)
                    run = await _send(ws, message, session_id, profile)
            except trio.TooSlowError:
                raise PeerError(f"the peer did not answer within {REPLY_TIMEOUT:g} s") from None
            yield run
        finally:
            await _close(ws, run)
            scope.cancel()  # the reader ends here, whatever the peer does


async def _close(ws: WebSocketConnection, run: _Run | None) -> None:
    """Stop our run if it is still going, then close; shielded, within STOP_GRACE."""
    with trio.move_on_after(STOP_GRACE, shield=True) as grace:
        if run is not None and run.running:
            log.info("peer session %s: our side stopped; sending stop", run.session_id)
            try:
                await run.stop()
            except PeerError as exc:
                log.warning("peer session %s: stop not confirmed: %s", run.session_id, exc)
        await ws.aclose()
    if grace.cancelled_caught and run is not None:
        log.warning("peer session %s: no stop confirmation within %g s", run.session_id, STOP_GRACE)


async def _send(
    ws: WebSocketConnection, message: str, session_id: str | None, profile: str | None
) -> _Run:
    """Send the message; the run once the peer said ok (session frames kept for it)."""
    frame: dict[str, Any] = {"type": "message", "content": message, "id": _ASK_ID}
    if session_id is not None:
        frame["session_id"] = session_id
    if profile is not None:
        frame["profile"] = profile
    await _send_frame(ws, frame)
    pending: list[Frame] = []
    created = False
    while True:
        reply = await _receive(ws)
        if reply.get("id") != _ASK_ID:
            pending.append(reply)
        elif reply.get("type") == "error":
            raise PeerRefusedError(str(reply.get("code", "?")), str(reply.get("message", "")))
        elif reply.get("type") == "session":
            created = bool(reply.get("created"))
        elif reply.get("type") == "ok":
            run = _Run(ws, str(reply["session_id"]), created, message)
            run.queued = bool(reply.get("queued"))
            run.pending.extend(pending)
            return run


def _reason(exc: BaseException) -> str:
    """The most telling text of a lower-layer error (trio-websocket's are often empty)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, BaseExceptionGroup) and len(seen.exceptions) == 1:
            seen = seen.exceptions[0]
            continue
        if str(seen):
            return f"{type(seen).__name__}: {seen}"
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


async def check_peer(url: str, token: str, timeout: float = 3.0) -> str | None:  # noqa: ASYNC109
    """None when the peer at `url` accepts `token`; else why not (for `navi doctor`)."""
    from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

    try:
        with trio.fail_after(timeout):
            async with open_websocket_url(url, connect_timeout=timeout) as ws:
                await _hello(ws, token)
    except trio.TooSlowError:
        return f"no answer within {timeout:g} s"
    except PeerRefusedError as exc:
        return f"refused the token: {exc}" if exc.code == "unauthorized" else str(exc)
    except (PeerError, OSError, HandshakeError, ConnectionClosed) as exc:
        return f"unreachable: {_reason(exc)}"
    return None
