"""A fake LLM server: real HTTP/1.1 on 127.0.0.1 (trio + h11), speaking both dialects.

``POST /api/chat`` answers in Ollama's NDJSON, ``POST /v1/chat/completions`` in
OpenAI's SSE. Both play the same script (the reply format is `navi_trio.llm.script`'s):
one reply per chat request, in order; with ``loop`` the list cycles, else a request
past the end gets HTTP 500 ``script exhausted``. The info endpoints list one model and
report the context window. ``dialects=("openai",)`` answers 404 to the Ollama-only
endpoints, like llama-cpp-python; ``("ollama",)`` the other way round.

What it saw, for tests: `requests`, `disconnects` (a client gone before its reply
finished), `completed`, `connections`; `wait_requests(n)`, `wait_disconnects(n)` and
`wait_completed(n)` wait on a trio.Event. `gate`: while it is unset, each reply waits
for it (`waiting` counts them). `hold_after(n)`: each streamed reply stops once it has
written n chunks until the event it returns is set, then writes the rest at once
(`wait_held(k)` waits until k replies stand there; ``reply=i``: only the i-th reply of
the script): a turn kept running mid-stream as long as a test needs, without pacing it
for real seconds.
`shape(body, reply)` makes each reply from the scripted one and the request it answers.

From the shell (prints ``listening on http://127.0.0.1:PORT`` first)::

    python -m navi_trio.testing.fake_llm --port 11434 --script replies.json [--loop]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import h11
import trio

from navi_trio.errors import ConfigError
from navi_trio.llm.script import DEFAULT_MODEL, Reply, load_script, parse_reply
from navi_trio.testing._dialects import _Dialect, _Ollama, _OpenAI
from navi_trio.testing._http import MAX_BODY, read_request, send_json, send_whole
from navi_trio.testing._play import Dropped, stream_reply

CHAT_PATHS = ("/api/chat", "/v1/chat/completions")


def _dialect_of(path: str) -> str:
    return "ollama" if path == "/api/chat" else "openai"


class FakeLLMServer:
    """The fake LLM HTTP server. Start it with ``await nursery.start(server.serve)``."""

    def __init__(
        self,
        replies: Iterable[Reply | dict[str, Any]] = (),
        loop: bool = False,
        *,
        n_ctx: int = 8192,
        dialects: tuple[str, ...] = ("ollama", "openai"),
        shape: Callable[[dict[str, Any], Reply], Reply] | None = None,
    ) -> None:
        self.replies: list[Reply] = []
        self.loop = loop
        self.n_ctx = n_ctx  # the context window the info endpoints report
        self.dialects = dialects  # a server speaking only one answers 404 to the other
        self.shape = shape  # the reply to a request from the scripted one
        self.requests: list[dict[str, Any]] = []
        self.disconnects: list[dict[str, Any]] = []
        self.completed = 0
        self.connections = 0  # TCP connections accepted (keep-alive reuse shows here)
        self.hang_ups = 0  # requests answered by closing the connection (``hang_up``)
        self.gate: trio.Event | None = None  # unset: chat replies wait for it
        self.waiting = 0  # chat replies waiting for the gate
        self.held = 0  # streamed replies standing at the hold (`hold_after`)
        self._hold: tuple[int, trio.Event, int | None] | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self._next = 0
        self._changed = trio.Event()
        self.add_replies(*replies)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"] in CHAT_PATHS]

    def add_replies(self, *replies: Reply | dict[str, Any]) -> None:
        start = len(self.replies)
        self.replies += [parse_reply(r, f"reply {start + i}") for i, r in enumerate(replies)]

    def drop_unread(self) -> int:
        """Drop the replies no request has taken yet, so that the next reply added is the
        next one taken (a new case after one that ended before its script did); how many
        were dropped."""
        dropped = len(self.replies) - self._next
        del self.replies[self._next :]
        return dropped

    async def wait_requests(self, n: int = 1) -> None:
        await self._wait_until(lambda: len(self.requests) >= n)

    async def wait_disconnects(self, n: int = 1) -> None:
        await self._wait_until(lambda: len(self.disconnects) >= n)

    async def wait_completed(self, n: int = 1) -> None:
        await self._wait_until(lambda: self.completed >= n)

    async def wait_held(self, n: int = 1) -> None:
        await self._wait_until(lambda: self.held >= n)

    def hold_after(self, chunks: int, *, reply: int | None = None) -> trio.Event:
        """From now on, each streamed reply that has written at least `chunks` chunks
        (0: the next chunk of any) stops there until the event returned is set; then it
        writes the rest at once, without its delays. With `reply`, only the reply at that
        place of the script (0: the first) stops. A new hold replaces the last (an unset
        one still holds whom it holds)."""
        release = trio.Event()
        self._hold = (chunks, release, reply)
        return release

    async def _held(self, place: int, chunks: int) -> bool:
        """Wait at the hold if the reply at `place`, `chunks` written, reached it; True if
        it did."""
        hold = self._hold
        if hold is None or chunks < hold[0] or hold[1].is_set():
            return False
        if hold[2] is not None and hold[2] != place:
            return False
        self.held += 1
        self._notify()
        try:
            await hold[1].wait()
        finally:
            self.held -= 1
        return True

    async def _wait_until(self, done: Callable[[], bool]) -> None:
        while not done():
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _completed(self) -> None:
        """A reply was answered whole: count it and wake whoever waits on `completed`."""
        self.completed += 1
        self._notify()

    async def serve(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        task_status: trio.TaskStatus[FakeLLMServer] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on host:port (0: any free port), then serve until cancelled."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        self.host = host
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self)
        await trio.serve_listeners(self._handle, listeners)

    def _take(self) -> Reply | None:
        if self._next >= len(self.replies):
            if not self.loop or not self.replies:
                return None
            self._next = 0
        reply = self.replies[self._next]
        self._next += 1
        return reply

    # --- one connection -------------------------------------------------------------

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_BODY)
        try:
            while True:
                request = await read_request(stream, conn)
                if request is None:
                    return
                keep = await self._dispatch(stream, conn, *request)
                if not keep or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await trio.aclose_forcefully(stream)

    async def _dispatch(
        self, stream: trio.SocketStream, conn: h11.Connection, request: h11.Request, raw: bytes
    ) -> bool:
        method = request.method.decode("ascii", "replace").upper()
        path = request.target.decode("ascii", "replace").split("?", 1)[0]
        body: Any = None
        bad_json = ""
        if raw:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                body, bad_json = raw.decode("utf-8", "replace"), str(exc)
        self.requests.append(
            {
                "method": method,
                "path": path,
                "headers": {k.decode().lower(): v.decode() for k, v in request.headers},
                "body": body,
                "time": trio.current_time(),
            }
        )
        self._notify()
        info = self._info(method, path)
        if isinstance(info, bytes):
            return await send_whole(stream, conn, 200, info, "text/plain")
        if info is not None:
            return await send_json(stream, conn, 200, info)
        if method != "POST" or path not in CHAT_PATHS or _dialect_of(path) not in self.dialects:
            # "detail" as FastAPI (llama-cpp-python) answers a path it does not serve.
            missing = {"detail": "Not Found", "error": f"no route for {method} {path}"}
            return await send_json(stream, conn, 404, missing)
        dialect_cls = _Ollama if path == "/api/chat" else _OpenAI
        if bad_json or not isinstance(body, dict):
            problem = (
                f"invalid JSON body: {bad_json}" if bad_json else "the body must be a JSON object"
            )
            return await send_json(
                stream, conn, 400, dialect_cls(Reply(), "", "").error_body(problem)
            )
        if self.gate is not None and not self.gate.is_set():
            self.waiting += 1
            self._notify()
            try:
                await self.gate.wait()
            finally:
                self.waiting -= 1
        reply = self._take()
        if reply is None:
            return await send_json(
                stream, conn, 500, dialect_cls(Reply(), "", "").error_body("script exhausted")
            )
        if self.shape is not None:
            reply = self.shape(body, reply)
        if reply.hang_up:
            # Close without a byte of answer, as a server closing an idle keep-alive
            # connection just as the request arrives.
            self.hang_ups += 1
            self._notify()
            return False
        requested = body.get("model")
        model = reply.model or (
            requested if isinstance(requested, str) and requested else DEFAULT_MODEL
        )
        dialect = dialect_cls(reply, model, f"call_{len(self.requests)}")
        hold = partial(self._held, self._next - 1)  # its place in the script
        return await self._watched(stream, conn, path, dialect, body, hold)

    def _info(self, method: str, path: str) -> dict[str, Any] | bytes | None:
        """The answer to an info endpoint (model list, context size), or None."""
        ollama, openai = "ollama" in self.dialects, "openai" in self.dialects
        if ollama and method == "GET" and path == "/":
            return b"Ollama is running"
        if ollama and method == "GET" and path == "/api/tags":
            return {"models": [{"name": DEFAULT_MODEL, "model": DEFAULT_MODEL, "size": 0}]}
        if ollama and method == "POST" and path == "/api/show":
            # model_info holds the trained window; parameters what the Modelfile sets.
            return {
                "model_info": {"general.architecture": "fake", "fake.context_length": self.n_ctx},
                "parameters": f"num_ctx                        {self.n_ctx}",
            }
        if openai and method == "GET" and path == "/v1/models":
            model = {"id": DEFAULT_MODEL, "object": "model", "owned_by": "fake"}
            return {"object": "list", "data": [{**model, "meta": {"n_ctx_train": self.n_ctx}}]}
        if openai and method == "GET" and path == "/props":
            # llama.cpp's server: the window it runs with.
            return {"default_generation_settings": {"n_ctx": self.n_ctx}, "total_slots": 1}
        return None

    async def _watched(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        path: str,
        dialect: _Dialect,
        body: dict[str, Any],
        hold: Callable[[int], Awaitable[bool]],
    ) -> bool:
        """Stream a reply while watching for the client going away (even during a sleep)."""
        progress = {"chunks": 0}
        gone = False

        def record() -> None:
            nonlocal gone
            if not gone:
                gone = True
                self.disconnects.append(
                    {"path": path, "time": trio.current_time(), "chunks_sent": progress["chunks"]}
                )
                self._notify()

        async def watch(cancel: trio.CancelScope) -> None:
            # The request is fully read, so EOF here means the client closed early.
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            if data:
                conn.receive_data(data)  # a pipelined request: keep it for the next cycle
                return
            record()
            cancel.cancel()

        finished = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, nursery.cancel_scope)
            try:
                finished = await stream_reply(
                    stream, conn, dialect, body, progress, self._completed, hold
                )
            except trio.BrokenResourceError:
                record()
            except Dropped:
                pass
            nursery.cancel_scope.cancel()
        return finished and not gone


@asynccontextmanager
async def open_fake_llm(
    replies: Iterable[Reply | dict[str, Any]] = (), loop: bool = False, **options: Any
) -> AsyncIterator[FakeLLMServer]:
    """``async with open_fake_llm([...]) as server:`` — started, listening on 127.0.0.1.

    `options` go to `FakeLLMServer` (``n_ctx``, ``dialects``, ``shape``)."""
    server = FakeLLMServer(replies, loop=loop, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(server.serve))
        yield server
        nursery.cancel_scope.cancel()


async def _run(server: FakeLLMServer, host: str, port: int) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(server.serve, host=host, port=port))
        print(f"listening on {server.url}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m navi_trio.testing.fake_llm",
        description="A fake Ollama / OpenAI-compatible LLM server playing a reply script.",
    )
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--script", required=True, help="JSON list of replies (see the docstring)")
    parser.add_argument("--loop", action="store_true", help="cycle through the replies forever")
    parser.add_argument(
        "--n-ctx", type=int, default=8192, help="context window the info endpoints report"
    )
    args = parser.parse_args(argv)
    try:
        replies = load_script(args.script)
    except ConfigError as exc:
        print(f"fake_llm: {exc}", file=sys.stderr)
        return 2
    # Ctrl-C (SIGINT) stops it even when it was started with SIGINT ignored, as a
    # script's background job (`… &`) is: Python would leave it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        server = FakeLLMServer(replies, loop=args.loop, n_ctx=args.n_ctx)
        trio.run(_run, server, args.host, args.port)
    except KeyboardInterrupt:
        return 0
    except BaseExceptionGroup as group:
        # Ctrl-C arrives wrapped by the nursery; anything else is a real failure.
        _, rest = group.split(KeyboardInterrupt)
        if rest is None:
            return 0
        listen = rest.subgroup(OSError)
        if listen is not None and listen == rest:
            print(
                f"fake_llm: cannot listen on {args.host}:{args.port}: {rest.exceptions[0]}",
                file=sys.stderr,
            )
            return 1
        raise
    except OSError as exc:
        print(f"fake_llm: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
