"""Helpers for the WebSocket daemon tests: a runtime + ApiServer on 127.0.0.1 port 0,
users with tokens, and a small client that reads frames without polling."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from navi_trio.api.auth import new_token
from navi_trio.api.metrics import DaemonMetrics
from navi_trio.api.server import ApiServer
from navi_trio.testing import open_harness
from navi_trio.testing.harness import Harness

Frame = dict[str, Any]


class Client:
    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.frames: list[Frame] = []
        self._next_id = 0
        self._skipped: list[Frame] = []

    async def send(self, frame: Frame | str | bytes) -> None:
        await self.ws.send_message(frame if isinstance(frame, str | bytes) else json.dumps(frame))

    async def request(self, frame: Frame) -> Frame:
        """Send `frame` with a fresh id; the reply or error carrying that id."""
        self._next_id += 1
        rid = f"r{self._next_id}"
        await self.send({**frame, "id": rid})
        return await self.until(lambda f: f.get("id") == rid)

    async def next(self) -> Frame:
        """The next frame off the wire (`frames` keeps every one received)."""
        frame: Frame = json.loads(await self.ws.get_message())
        self.frames.append(frame)
        return frame

    async def until(self, pred: Callable[[Frame], bool]) -> Frame:
        """The first frame matching `pred`, earlier skipped frames included: a frame
        skipped by one wait stays there for the next (in arrival order)."""
        for i, frame in enumerate(self._skipped):
            if pred(frame):
                del self._skipped[i]
                return frame
        while True:
            frame = await self.next()
            if pred(frame):
                return frame
            self._skipped.append(frame)

    async def until_type(self, type_: str, **match: Any) -> Frame:
        return await self.until(
            lambda f: f["type"] == type_ and all(f.get(k) == v for k, v in match.items())
        )

    async def until_end(self, session_id: str) -> Frame:
        return await self.until_type("stream_end", session_id=session_id, is_subagent=False)

    async def idle(self, session_id: str) -> None:
        """Until the session's run has wholly ended: its stream ends a moment before the
        run has saved and settled, and a message sent in between is queued (position 0)
        behind it. The daemon says so in its session list."""
        while True:
            listed = await self.request({"type": "sessions", "action": "list"})
            assert listed["type"] == "sessions", listed  # (asked within the frame rate: below)
            if not next(s["busy"] for s in listed["sessions"] if s["session_id"] == session_id):
                return
            # The daemon tells no one when a run has settled, so ask again, at a pace far
            # below NAVI_WS_FRAMES_PER_SEC (20): asked at once, a slow settle (a loaded
            # machine) ran this past the burst, and the answer was `rate_limited`.
            await trio.sleep(0.1)


@attrs.define(eq=False)
class Daemon:
    harness: Harness
    server: ApiServer
    port: int
    tokens: dict[str, str] = attrs.field(factory=dict)
    ids: dict[str, str] = attrs.field(factory=dict)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    async def add_user(self, name: str, role: str = "user") -> str:
        token = new_token()
        row = await self.harness.runtime.store.create_user(name, token, role)
        self.tokens[name] = token
        self.ids[name] = row["id"]
        return token

    @asynccontextmanager
    async def connect(
        self,
        user: str | None = None,
        *,
        hello: bool = True,
        headers: Any = None,
        max_message_size: int = 2**20,  # trio-websocket's default
    ) -> AsyncIterator[Client]:
        async with open_websocket_url(
            self.url, extra_headers=headers, max_message_size=max_message_size
        ) as ws:
            client = Client(ws)
            if user is not None and hello:
                await client.send({"type": "hello", "token": self.tokens[user]})
                welcome = await client.next()
                assert welcome["type"] == "welcome", welcome
            yield client


@asynccontextmanager
async def open_daemon(tmp_path: Any, **kwargs: Any) -> AsyncIterator[Daemon]:
    """`metrics=DaemonMetrics()`: the daemon's, as `navi serve` has them (the core's
    observer too, unless `observer=` says another); the other arguments are
    `open_harness`'s."""
    metrics: DaemonMetrics | None = kwargs.pop("metrics", None)
    observer = kwargs.pop("observer", metrics)
    async with (
        open_harness(tmp_path, observer=observer, **kwargs) as h,
        trio.open_nursery() as nursery,
    ):
        server = ApiServer(h.runtime, host="127.0.0.1", port=0, metrics=metrics)
        port = await nursery.start(server.run)
        daemon = Daemon(h, server, port)
        await daemon.add_user("alice")
        await daemon.add_user("bob")
        await daemon.add_user("root", "admin")
        yield daemon
        nursery.cancel_scope.cancel()
