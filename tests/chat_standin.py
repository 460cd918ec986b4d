"""A stand-in navi daemon for the chat client's tests: protocol v1, scripted, in-process.

A trio-websocket server on 127.0.0.1 (port 0) that answers ``hello`` with ``welcome``
(or ``unauthorized`` for a wrong token), and a ``message`` with a scripted run chosen
by its content:

- ``tool``  : model_info, thinking, a Markdown answer, a terminal tool card with live
  output, a todo list that ticks, stream_end;
- ``wait``  : a first delta, then nothing until ``stop`` arrives (then stream_end stopped);
  a message arriving meanwhile gets ``message_queued`` and runs after it, as in the daemon;
- ``cross`` : a first delta, then nothing until the next message arrives: the run ends
  (stream_end) before that message is taken, which then runs at once (not queued), as
  when a message crosses the end of the run before it on the wire;
- ``ask``   : an ``approval_request`` for a terminal call, then nothing until an
  ``approve``/``deny`` for it arrives (recorded), then ``approval_decided`` and the end;
  a ``subscribe`` meanwhile lists it in its ``ok`` (``approvals``), as the daemon does;
- anything else: an echo ``you said: …`` and stream_end.

A message is answered ``ok`` (``queued``, and the session's ``seq`` before it was taken,
as the daemon does) before its first frame, or with `ok_last` once its run has ended.
A message that runs at once waits for `hold` when one is given. Every frame a client
sends is recorded in `received`; `drop()` closes the live connections (the server goes
on) to test reconnects.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket

Frame = dict[str, Any]
EPOCH = "e1"


@attrs.define
class Session:
    session_id: str
    profile: str = "general"  # the stand-in's default profile, as the daemon's config
    seq: int = 0
    frames: list[Frame] = attrs.field(factory=list)
    busy: bool = False
    stop: trio.Event = attrs.field(factory=trio.Event)
    waiting: list[str] = attrs.field(factory=list)  # queued messages, run in order after
    asking: dict[str, Frame] = attrs.field(factory=dict)  # approval requests waiting
    answered: trio.Event = attrs.field(factory=trio.Event)
    crossing: bool = False  # a ``cross`` run waits for the next message (`crossed`)
    crossed: trio.Event = attrs.field(factory=trio.Event)
    idle: trio.Event = attrs.field(factory=trio.Event)  # set when a run ends
    waiting_oks: list[Frame | None] = attrs.field(factory=list)  # with `ok_last`: theirs


@attrs.define(eq=False)
class StandIn:
    token: str = "t0k"
    port: int = 0
    received: list[Frame] = attrs.field(factory=list)
    sessions: dict[str, Session] = attrs.field(factory=dict)
    connections: list[WebSocketConnection] = attrs.field(factory=list)
    got: trio.Event = attrs.field(factory=trio.Event)  # set on every received frame
    # How a re-subscribe is answered: "replay" (frames after last_seq), "all" (every
    # frame again: the client must drop what it saw), "resync" (a new epoch), "lagged".
    on_subscribe: str = "replay"
    history_extra: list[Frame] = attrs.field(factory=list)  # appended to every history
    # Messages per history page (0: the whole history in one reply, with no cursor). Each
    # page after the first reports a seq one higher: the session runs on meanwhile.
    history_page: int = 0
    # False: an older daemon, which answers a ``commands`` request unknown_type.
    knows_commands: bool = True
    ok_last: bool = False  # a message's ok comes after its run's end, not before its start
    hold: trio.Event | None = None  # set: a message that runs at once starts only then

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve_websocket, self._handle, "127.0.0.1", 0, None)
            self.port = server.port
            task_status.started(self.port)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def types(self) -> list[str]:
        return [f["type"] for f in self.received]

    async def wait_for(self, kind: str, **fields: Any) -> Frame:
        """The first received frame of type `kind` with these field values (waits for it)."""
        while True:
            for frame in self.received:
                if frame["type"] == kind and all(frame.get(k) == v for k, v in fields.items()):
                    return frame
            self.got = trio.Event()
            await self.got.wait()

    async def drop(self) -> None:
        for ws in list(self.connections):
            await ws.aclose()

    async def _handle(self, request: WebSocketRequest) -> None:
        ws = await request.accept()
        self.connections.append(ws)
        try:
            await self._converse(ws)
        except* ConnectionClosed:
            pass  # the client went away (or `drop()`): that is the test's business
        finally:
            self.connections.remove(ws)

    async def _send(self, ws: WebSocketConnection, frame: Frame) -> None:
        await ws.send_message(json.dumps(frame))

    async def _converse(self, ws: WebSocketConnection) -> None:
        hello = json.loads(await ws.get_message())
        self._record(hello)
        if hello.get("token") != self.token:
            await self._send(
                ws, {"type": "error", "code": "unauthorized", "message": "missing or wrong token"}
            )
            await ws.aclose()
            return
        await self._send(
            ws,
            {
                "type": "welcome",
                "protocol": 1,
                "server": "stand-in 0.1",
                "user": {"name": "tester", "role": "admin"},
            },
        )
        async with trio.open_nursery() as nursery:
            while True:
                frame = json.loads(await ws.get_message())
                self._record(frame)
                await self._dispatch(ws, frame, nursery)

    def _record(self, frame: Frame) -> None:
        self.received.append(frame)
        self.got.set()

    async def _dispatch(self, ws: WebSocketConnection, frame: Frame, nursery: trio.Nursery) -> None:
        kind = frame["type"]
        if kind == "message":
            sid = frame.get("session_id")
            if sid is None:
                sid = f"s-{len(self.sessions) + 1}"
                self.sessions[sid] = Session(sid)
                await self._send(ws, {"type": "session", "session_id": sid, "created": True})
            session = self.sessions.setdefault(sid, Session(sid))
            if frame.get("profile"):  # the daemon switches a session to a message's profile
                session.profile = str(frame["profile"])
            if session.busy and session.crossing:
                session.crossing = False
                session.crossed.set()  # a ``cross`` run ends now, before this is taken
                await session.idle.wait()
            ok = {"type": "ok", "session_id": sid, "seq": session.seq, "epoch": EPOCH}
            if "id" in frame:
                ok["id"] = frame["id"]
            if session.busy:
                session.waiting.append(str(frame["content"]))
                ok["queued"] = True
                if not self.ok_last:
                    await self._send(ws, ok)
                session.waiting_oks.append(ok if self.ok_last else None)
                await self._publish(
                    ws,
                    session,
                    {
                        "type": "message_queued",
                        "text": frame["content"],
                        "position": len(session.waiting),
                    },
                )
                return
            ok["queued"] = False
            session.busy = True  # taken: a message after it is queued
            nursery.start_soon(self._held_run, ws, session, str(frame["content"]), ok)
        elif kind == "stop":
            session = self.sessions[frame["session_id"]]
            session.stop.set()
            await self._send(ws, {"type": "ok", "id": frame.get("id")})
        elif kind == "subscribe":
            session = self.sessions.setdefault(frame["session_id"], Session(frame["session_id"]))
            last = frame.get("last_seq")
            await self._send(
                ws,
                {
                    "type": "ok",
                    "session_id": session.session_id,
                    "seq": session.seq,
                    "approvals": [
                        {k: v for k, v in f.items() if k not in ("session_id", "seq", "epoch")}
                        for f in session.asking.values()
                    ],
                },
            )
            if self.on_subscribe == "resync":
                await self._send(
                    ws,
                    {
                        "type": "resync",
                        "session_id": session.session_id,
                        "seq": session.seq,
                        "epoch": "e2",
                    },
                )
                return
            if self.on_subscribe == "lagged":
                await self._send(
                    ws,
                    {
                        "type": "lagged",
                        "session_id": session.session_id,
                        "missed_from": 2,
                        "missed_to": 3,
                    },
                )
            for old in session.frames:
                if self.on_subscribe == "all" or (last is not None and old["seq"] > last):
                    await self._send(ws, old)
        elif kind == "sessions" and frame["action"] == "list":
            old = {
                "session_id": "s-old",
                "title": "an older chat",
                "profile": "general",
                "user": "tester",
                "created_at": "2026-11-29",
                "updated_at": "2026-11-29",
                "busy": False,
            }
            ours = [
                {**old, "session_id": s.session_id, "title": "", "profile": s.profile}
                for s in self.sessions.values()
                if s.session_id != "s-old"
            ]
            reply = {"type": "sessions", "action": "list", "sessions": [old, *ours]}
            if "id" in frame:
                reply["id"] = frame["id"]
            await self._send(ws, reply)
        elif kind == "sessions" and frame["action"] == "history":
            session = self.sessions.setdefault(frame["session_id"], Session(frame["session_id"]))
            messages = [
                {"role": "user", "content": "what is 2+2?"},
                {"role": "assistant", "content": "It is **4**."},
                *self.history_extra,
            ]
            page: Frame = {
                "type": "sessions",
                "action": "history",
                "session_id": session.session_id,
                "seq": session.seq,
                "epoch": EPOCH,
                "messages": messages,
            }
            if self.history_page:
                start = int(frame.get("cursor") or 0)
                end = start + self.history_page
                more = end < len(messages)
                session.seq += 1 if start else 0
                page["seq"] = session.seq
                page["messages"] = messages[start:end]
                page["next_cursor"] = str(end) if more else None
            if "id" in frame:
                page["id"] = frame["id"]
            await self._send(ws, page)
        elif kind == "tasks":
            await self._send(
                ws,
                {
                    "type": "tasks",
                    "action": "list",
                    "tasks": [
                        {
                            "task_id": "t-1",
                            "tool": "terminal",
                            "status": "running",
                            "age_sec": 3,
                            "session_id": frame.get("session_id"),
                        }
                    ],
                },
            )
        elif kind == "grants":
            grant = {"id": "g-0123456789ab", "scope": "session", "session_id": "s-1",
                     "user_id": "u-1", "mode": "full",
                     "grants": "`curl` in this workspace"}  # fmt: skip
            await self._send(ws, {"type": "grants", "action": frame["action"], "grants": [grant]})
        elif kind in ("approve", "deny"):
            session = self.sessions[frame["session_id"]]
            if session.asking.pop(frame["call_id"], None) is None:
                await self._send(ws, {"type": "error", "code": "not_found", "message": "no such"})
                return
            await self._send(ws, {"type": "ok", "call_id": frame["call_id"]})
            session.answered.set()
        elif kind in ("compact", "unsubscribe"):
            await self._send(ws, {"type": "ok"})
        elif kind == "commands" and self.knows_commands:  # none kept as files here
            await self._send(ws, {"type": "commands", "id": frame.get("id"), "commands": []})
        elif kind == "commands":
            error = {"type": "error", "code": "unknown_type", "message": "unknown 'commands'"}
            await self._send(ws, {**error, "id": frame.get("id")})
        else:
            await self._send(
                ws,
                {
                    "type": "error",
                    "code": "unknown_type",
                    "message": f"unknown frame type {kind!r}",
                },
            )

    async def _publish(self, ws: WebSocketConnection, session: Session, body: Frame) -> None:
        session.seq += 1
        frame = {
            **body,
            "session_id": session.session_id,
            "seq": session.seq,
            "epoch": EPOCH,
            "is_subagent": body.get("is_subagent", False),
            "agent_id": body.get("agent_id"),
        }
        session.frames.append(frame)
        await self._send(ws, frame)

    async def _held_run(
        self, ws: WebSocketConnection, session: Session, content: str, ok: Frame
    ) -> None:
        if self.hold is not None:
            await self.hold.wait()
        if not self.ok_last:
            await self._send(ws, ok)
        await self._run(ws, session, content, ok if self.ok_last else None)

    async def _run(
        self, ws: WebSocketConnection, session: Session, content: str, ok: Frame | None
    ) -> None:
        session.busy = True
        session.idle = trio.Event()
        session.stop = trio.Event()
        pub = self._publish
        await pub(ws, session, {"type": "model_info", "model": "stand-in-model"})
        if content == "tool":
            await pub(ws, session, {"type": "thinking_delta", "text": "let me run a command"})
            await pub(ws, session, {"type": "thinking_end"})
            steps = [
                {"index": 1, "text": "list files", "status": "in_progress"},
                {"index": 2, "text": "report", "status": "pending"},
            ]
            await pub(ws, session, {"type": "todo_updated", "steps": steps})
            await pub(
                ws,
                session,
                {
                    "type": "tool_started",
                    "call_id": "c1",
                    "name": "terminal",
                    "arguments": {"command": "ls"},
                },
            )
            await pub(
                ws,
                session,
                {
                    "type": "tool_event",
                    "call_id": "c1",
                    "name": "terminal",
                    "data": {"stream": "output", "line": "README.md"},
                },
            )
            await pub(
                ws,
                session,
                {
                    "type": "tool_result",
                    "call_id": "c1",
                    "name": "terminal",
                    "ok": True,
                    "output": "README.md",
                    "duration_ms": 1250,
                },
            )
            steps = [
                {"index": 1, "text": "list files", "status": "done"},
                {"index": 2, "text": "report", "status": "done"},
            ]
            await pub(ws, session, {"type": "todo_updated", "steps": steps})
            await pub(ws, session, {"type": "text_delta", "text": "The folder holds **README"})
            await pub(ws, session, {"type": "text_delta", "text": ".md** only."})
            await pub(
                ws,
                session,
                {"type": "stream_end", "text": "The folder holds README.md", "prompt_tokens": 321},
            )
        elif content == "ask":
            request = {
                "type": "approval_request",
                "call_id": "c-ask",
                "tool": "terminal",
                "summary": "terminal run: rm -rf build",
                "rule": "mode full: terminal runs without a sandbox",
                "mode": "full",
                "timeout_sec": 300,
            }
            session.answered = trio.Event()
            await pub(ws, session, request)
            session.asking["c-ask"] = session.frames[-1]
            await session.answered.wait()
            answer = [f for f in self.received if f["type"] in ("approve", "deny")][-1]
            decided = {
                "type": "approval_decided",
                "call_id": "c-ask",
                "approved": answer["type"] == "approve",
                "scope": answer.get("scope", "once"),
                "by": "owner",
            }
            await pub(ws, session, decided)
            await pub(ws, session, {"type": "stream_end", "text": "asked", "prompt_tokens": 7})
        elif content == "cross":
            session.crossing, session.crossed = True, trio.Event()
            await pub(ws, session, {"type": "text_delta", "text": "Crossing"})
            await session.crossed.wait()
            await pub(ws, session, {"type": "stream_end", "text": "Crossing", "prompt_tokens": 9})
        elif content == "wait":
            await pub(ws, session, {"type": "text_delta", "text": "Working on it"})
            await session.stop.wait()
            session.stop = trio.Event()
            await pub(ws, session, {"type": "stream_end", "stopped": True, "reason": "stopped"})
        else:
            await pub(ws, session, {"type": "text_delta", "text": f"you said: {content}"})
            await pub(
                ws,
                session,
                {"type": "stream_end", "text": f"you said: {content}", "prompt_tokens": 42},
            )
        if ok is not None:
            await self._send(ws, ok)
        session.busy = False
        session.idle.set()
        if session.waiting:  # as the daemon does: the queue drains in order after the run
            await self._run(ws, session, session.waiting.pop(0), session.waiting_oks.pop(0))
