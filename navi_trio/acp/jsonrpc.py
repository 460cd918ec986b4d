"""JSON-RPC 2.0 over newline-delimited JSON on two byte streams (the editor's pipes).

Each request runs in a task of its own so that a long ``session/prompt`` does not hold
up a ``session/cancel``. Everything the editor controls is bounded: a line at
`MAX_LINE_BYTES` (a longer one is dropped and answered with an error), the requests
running at once at `MAX_RUNNING` (one more is answered with an error, so the reader
never waits), and the replies we wait for at `MAX_WAITING`. Writes are whole lines
under one lock; a reader that does not read holds the writer rather than filling memory.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 8 * 1024 * 1024
MAX_RUNNING = 64  # requests of the editor being answered at once
MAX_WAITING = 64  # our own requests waiting for the editor's reply
READ_CHUNK = 65536

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002  # ACP's code for an unknown session

Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class RpcError(Exception):
    """An error reply: `code` (JSON-RPC's), a message naming the problem, optional data."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class LineTooLong(Exception):
    pass


@attrs.define
class AndThen:
    """A handler's result to answer with, then more to send once the answer is out
    (updates that name the session the answer made)."""

    result: Any
    then: Callable[[], Awaitable[None]]


class LineReader:
    """Lines of at most `limit` bytes from a receive stream; a longer one is skipped to
    its newline and reported once as `LineTooLong`."""

    def __init__(self, stream: trio.abc.ReceiveStream, limit: int = MAX_LINE_BYTES) -> None:
        self._stream = stream
        self._limit = limit
        self._buf = bytearray()
        self._skipping = False
        self._eof = False

    async def line(self) -> bytes | None:
        """The next line without its newline; None at the end of the stream."""
        while True:
            cut = self._buf.find(b"\n")
            if cut >= 0:
                line = bytes(self._buf[:cut])
                del self._buf[: cut + 1]
                if self._skipping or len(line) > self._limit:
                    self._skipping = False
                    raise LineTooLong
                return line
            if self._skipping:
                self._buf.clear()
            elif len(self._buf) > self._limit:
                self._buf.clear()
                self._skipping = True
            if self._eof:
                rest, self._buf = bytes(self._buf), bytearray()
                return rest if rest.strip() and not self._skipping else None
            try:
                data = await self._stream.receive_some(READ_CHUNK)
            except trio.ClosedResourceError:  # closed here (a signal): as the end
                data = b""
            if not data:
                self._eof = True
            self._buf += data


@attrs.define(eq=False)
class Peer:
    """One JSON-RPC connection: `serve` until the input ends; `request` and `notify`
    from any task."""

    _reader: LineReader
    _out: trio.abc.SendStream
    _methods: dict[str, Handler]
    _notifications: dict[str, Handler]
    _write: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = attrs.field(
        factory=dict, init=False
    )
    _running: trio.Semaphore = attrs.field(factory=lambda: trio.Semaphore(MAX_RUNNING), init=False)
    _active: int = attrs.field(default=0, init=False)
    _idle: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps({"jsonrpc": "2.0", **message}, ensure_ascii=False) + "\n"
        async with self._write:
            await self._out.send_all(data.encode("utf-8"))

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._send({"method": method, "params": params})

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Send a request to the editor and wait for its result; an error reply is
        `RpcError`."""
        if len(self._waiting) >= MAX_WAITING:
            raise RpcError(INTERNAL_ERROR, f"more than {MAX_WAITING} requests to the editor wait")
        rid = next(self._ids)
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[rid] = send
        try:
            await self._send({"id": rid, "method": method, "params": params})
            reply = await receive.receive()
        finally:
            del self._waiting[rid]
        if "error" in reply:
            err = reply["error"] if isinstance(reply["error"], dict) else {}
            raise RpcError(int(err.get("code", INTERNAL_ERROR)), str(err.get("message", "")))
        return reply.get("result")

    async def serve(self, on_end: Callable[[], object], grace: float) -> None:
        """Read and dispatch until the input ends; then `on_end()` (it stops what runs)
        and the requests still running get `grace` seconds to answer."""
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    line = await self._reader.line()
                except LineTooLong:
                    await self._send(
                        _error(
                            None,
                            RpcError(
                                INVALID_REQUEST, f"a message is longer than {MAX_LINE_BYTES} bytes"
                            ),
                        )
                    )
                    continue
                if line is None:
                    break
                if line.strip():
                    await self._dispatch(line, nursery)
            on_end()
            with trio.move_on_after(grace):
                if self._active:
                    await self._idle.wait()
            nursery.cancel_scope.cancel()

    async def _dispatch(self, line: bytes, nursery: trio.Nursery) -> None:
        try:
            message = json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            await self._send(_error(None, RpcError(PARSE_ERROR, f"not JSON: {exc}")))
            return
        if not isinstance(message, dict):
            await self._send(_error(None, RpcError(INVALID_REQUEST, "a message is an object")))
            return
        rid, method = message.get("id"), message.get("method")
        if method is None and ("result" in message or "error" in message):
            waiting = self._waiting.get(rid) if isinstance(rid, int) else None
            if waiting is None:
                log.warning("a reply to no request of ours (id %r)", rid)
            else:
                waiting.send_nowait(message)
            return
        if not isinstance(method, str):
            await self._send(_error(rid, RpcError(INVALID_REQUEST, "'method' must be a string")))
            return
        params = message.get("params", {})
        if params is None:
            params = {}
        if "id" not in message:
            handler = self._notifications.get(method)
            if handler is None:
                log.info("notification %r ignored (unknown)", method)
            elif isinstance(params, dict):
                nursery.start_soon(self._notified, handler, params, method)
            return
        if not isinstance(rid, (int, str)) or isinstance(rid, bool):
            await self._send(
                _error(None, RpcError(INVALID_REQUEST, "'id' must be a number or a string"))
            )
            return
        if not isinstance(params, dict):
            await self._send(_error(rid, RpcError(INVALID_PARAMS, "'params' must be an object")))
            return
        found = self._methods.get(method)
        if found is None:
            await self._send(_error(rid, RpcError(METHOD_NOT_FOUND, f"unknown method {method!r}")))
            return
        try:
            self._running.acquire_nowait()
        except trio.WouldBlock:  # refused, not waited for: a cancel must still get through
            busy = f"more than {MAX_RUNNING} requests at once: wait for an answer"
            await self._send(_error(rid, RpcError(INTERNAL_ERROR, busy)))
            return
        self._active += 1
        if self._active == 1:
            self._idle = trio.Event()
        nursery.start_soon(self._answer, found, rid, params, method)

    async def _notified(self, handler: Handler, params: dict[str, Any], method: str) -> None:
        try:
            await handler(params)
        except RpcError as exc:
            log.warning("notification %s: %s", method, exc.message)

    async def _answer(
        self, handler: Handler, rid: Any, params: dict[str, Any], method: str
    ) -> None:
        try:
            try:
                result = await handler(params)
            except RpcError as exc:
                await self._send(_error(rid, exc))
                return
            except Exception as exc:  # noqa: BLE001 - the editor gets an answer, we go on
                log.exception("%s failed", method)
                await self._send(_error(rid, RpcError(INTERNAL_ERROR, f"{method}: {exc}")))
                return
            then = None
            if isinstance(result, AndThen):
                result, then = result.result, result.then
            await self._send({"id": rid, "result": result if result is not None else {}})
            if then is not None:
                await then()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.info("%s: the editor is gone, its answer is dropped", method)
        finally:
            self._running.release()
            self._active -= 1
            if not self._active:
                self._idle.set()


def _error(rid: Any, exc: RpcError) -> dict[str, Any]:
    return {"id": rid, "error": exc.body()}
