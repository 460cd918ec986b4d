"""Every client of navi gives its message a key and, when the connection drops before the
message's ``ok``, dials again, sends it again with that key and follows its run from
where it stands: `navi run`, the ACP agent and the peer link (api/redial.py).

A real daemon (tests/api_ws.py: a runtime and an ApiServer on 127.0.0.1, the fake LLM
over HTTP) behind a TCP forwarder on 127.0.0.1 that reads the daemon's WebSocket frames:
it drops the ``ok`` of the message (and all the daemon says after it on that
connection), then closes every connection through it (the daemon goes on). The run
happens meanwhile; the client, dialled again, must get its answer once, and the session
must hold the message once. Time is the autojump clock, paced (tests/realtime.py): the
backoff between dials is virtual, nothing sleeps for real.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from api_ws import Client
from api_ws import open_daemon as open_test_daemon
from realtime import paced
from test_client_app import Chat, QueueReader, Screen

from navi_trio import wire
from navi_trio.acp.agent import Agent
from navi_trio.acp.backend import Backend
from navi_trio.api.peer_link import WsPeerLink
from navi_trio.api.redial import RETRIES
from navi_trio.cli.run import run_remote
from navi_trio.cli.runner import RunRequest
from navi_trio.client.app import ChatApp, ChatOptions
from navi_trio.client.render import Renderer
from navi_trio.core.session.broadcast import ReplayBuffer
from navi_trio.errors import DaemonUnreachableError

TIMEOUT = 60
Frame = dict[str, Any]


def _message_ok(frame: Frame) -> bool:
    """The daemon's ok to a message (only those carry ``queued``)."""
    return frame.get("type") == "ok" and "queued" in frame


@attrs.define(eq=False)
class _Cutter:
    """A TCP forwarder that reads the daemon's WebSocket frames (unmasked, after the
    HTTP handshake): from the first frame `lose` matches on, it drops what the daemon
    says on that connection (`lost` is set); `cut()` closes every connection through
    it. The connections after a cut go through whole."""

    target: int
    lose: Callable[[Frame], bool] = _message_ok
    port: int = 0
    lost: trio.Event = attrs.field(factory=trio.Event)
    live: set[trio.CancelScope] = attrs.field(factory=set)
    connections: int = 0
    closed: bool = False  # new connections are closed at once (the daemon is gone)
    # What the client sends that is lost on its way (None: nothing), and how many were.
    swallow: Callable[[Frame], bool] | None = None
    swallowed: int = 0
    swallowing: trio.Event = attrs.field(factory=trio.Event)  # set at each one swallowed

    async def serve(
        self, *, task_status: trio.TaskStatus[_Cutter] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self)
        await trio.serve_listeners(self._handle, listeners)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def cut(self) -> None:
        for scope in self.live:
            scope.cancel()

    async def _handle(self, client: trio.SocketStream) -> None:
        self.connections += 1
        if self.closed:
            await client.aclose()
            return
        watched = not self.lost.is_set()  # one connection loses its frames, no later one
        async with client:
            with trio.CancelScope() as scope:
                self.live.add(scope)
                daemon = await trio.open_tcp_stream("127.0.0.1", self.target)
                async with daemon, trio.open_nursery() as nursery:
                    nursery.start_soon(self._pipe, client, daemon, scope)
                    nursery.start_soon(self._frames, daemon, client, scope, watched)
            self.live.discard(scope)

    async def _pipe(
        self, src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope
    ) -> None:
        """What the client sends, but the frames `swallow` matches (counted)."""
        frames = _Frames()
        try:
            async for data in src:
                for raw, text in frames.feed(data):
                    if self.swallow is not None and text is not None:
                        if self.swallow(json.loads(text)):
                            self.swallowed += 1
                            self.swallowing.set()
                            continue
                    await dst.send_all(raw)
        except trio.BrokenResourceError:
            pass
        done.cancel()

    async def _frames(
        self, src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope, watched: bool
    ) -> None:
        frames = _Frames()
        losing = False
        try:
            async for data in src:
                for raw, text in frames.feed(data):
                    if watched and not losing and text is not None and self.lose(json.loads(text)):
                        losing = True
                        self.lost.set()
                    if not losing:
                        await dst.send_all(raw)
        except trio.BrokenResourceError:
            pass
        done.cancel()


@attrs.define
class _Frames:
    """One direction of a WebSocket connection, cut into its HTTP handshake (no text)
    and its frames."""

    buf: bytearray = attrs.field(factory=bytearray)
    handshake: bool = True

    def feed(self, data: bytes | bytearray) -> list[tuple[bytes, str | None]]:
        self.buf += data
        head: list[tuple[bytes, str | None]] = []
        if self.handshake:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return []
            head = [(bytes(self.buf[: end + 4]), None)]
            del self.buf[: end + 4]
            self.handshake = False
        return head + _split(self.buf)


def _split(buf: bytearray) -> list[tuple[bytes, str | None]]:
    """The whole WebSocket frames at the start of `buf` (taken out of it): each one's
    bytes, and its text when it is a whole text frame (a client's unmasked)."""
    frames: list[tuple[bytes, str | None]] = []
    while len(buf) >= 2:
        size, at = buf[1] & 0x7F, 2
        if size == 126:
            if len(buf) < 4:
                break
            size, at = int.from_bytes(buf[2:4], "big"), 4
        elif size == 127:
            if len(buf) < 10:
                break
            size, at = int.from_bytes(buf[2:10], "big"), 10
        mask = b""
        if buf[1] & 0x80:
            mask, at = bytes(buf[at : at + 4]), at + 4
        if len(buf) < at + size:
            break
        raw = bytes(buf[: at + size])
        payload = raw[at:]
        if mask:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        text = payload.decode("utf-8") if buf[0] == 0x81 else None  # FIN + text
        del buf[: at + size]
        frames.append((raw, text))
    return frames


async def _users(c: Client, session_id: str) -> list[str]:
    history = await c.request({"type": "sessions", "action": "history", "session_id": session_id})
    return [m["content"] for m in history["messages"] if m["role"] == "user"]


async def _cut_when_lost(cutter: _Cutter) -> None:
    await cutter.lost.wait()
    cutter.cut()


def _top_end(frame: Frame) -> bool:
    return frame.get("type") == "stream_end" and not frame.get("is_subagent")


@pytest.mark.parametrize("lost", ["its ok", "its end"])
async def test_navi_run_through_a_drop_runs_its_message_once_and_prints_its_answer(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, lost: str
) -> None:
    """`navi run`'s message is taken and runs while its ok (or, the ok come, its run's
    end) is lost; the connection is cut; `navi run` dials again, sends the message again
    with its key (the ok lost) and prints the run's answer, followed from the replay.
    Red with the key left out of the message (the ok lost: the resend runs it a second
    time) and with the redial taken out (the drop is an error)."""
    replies = [{"text": "the one answer"}, {"text": "a second run"}]
    lose = _message_ok if lost == "its ok" else _top_end
    async with paced(autojump_clock, TIMEOUT):
        async with open_test_daemon(tmp_path, replies=replies) as d, trio.open_nursery() as n:
            cutter = await n.start(_Cutter(d.port, lose=lose).serve)
            n.start_soon(_cut_when_lost, cutter)
            req = RunRequest("s-0123456789ab", "hello", tmp_path, None, False, cwd_given=False)
            out, err = io.StringIO(), io.StringIO()
            outcome = await run_remote(cutter.url, d.tokens["alice"], req, out, err)
            async with d.connect("alice") as watch:
                await watch.idle(req.session_id)
                users = await _users(watch, req.session_id)
            n.cancel_scope.cancel()
    assert cutter.lost.is_set() and cutter.connections >= 2
    assert outcome.end is not None and outcome.end.reason == "complete", err.getvalue()
    assert out.getvalue().count("the one answer") == 1, out.getvalue()
    assert "a second run" not in out.getvalue()
    assert users == ["hello"]


async def test_navi_run_is_replayed_from_its_sessions_seq_not_from_the_start(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session whose replay no longer holds its first frames (a replay of 4 frames
    here, 2000 by default): `navi run` subscribes to the session before its message
    goes, so when the ok and every frame of the run are lost and the connection cut
    after the run's end, it is replayed from the session's seq then (from 0 the replay
    is gone: a resync, and the run's end with it). Red with that first subscribe taken
    out (`navi run` waits for an end that never comes)."""
    monkeypatch.setattr(
        ReplayBuffer.__init__, "__kwdefaults__", {"max_frames": 4, "max_chars": 10**6}
    )
    sid = "alice.replayed"
    replies = [{"text": "before"}, {"text": "after"}]
    async with paced(autojump_clock, TIMEOUT):
        async with open_test_daemon(tmp_path, replies=replies) as d, trio.open_nursery() as n:
            # Lost from the ok or the run's first frame, whichever comes first: no mark.
            lose = lambda f: _message_ok(f) or wire.is_session_frame(f)  # noqa: E731
            cutter = await n.start(_Cutter(d.port, lose=lose).serve)
            async with d.connect("alice") as watch:
                await watch.request({"type": "message", "content": "hi", "session_id": sid})
                await watch.until_end(sid)
                await watch.idle(sid)

                async def cut_after_the_end() -> None:
                    await cutter.lost.wait()
                    await watch.until_end(sid)  # the run ended unseen: only a replay has it
                    cutter.cut()

                n.start_soon(cut_after_the_end)
                req = RunRequest(sid, "hello", tmp_path, None, False, cwd_given=False)
                out, err = io.StringIO(), io.StringIO()
                outcome = await run_remote(cutter.url, d.tokens["alice"], req, out, err)
                await watch.idle(sid)
                users = await _users(watch, sid)
            n.cancel_scope.cancel()
    assert cutter.lost.is_set()
    assert outcome.end is not None and outcome.end.reason == "complete", err.getvalue()
    assert out.getvalue().count("after") == 1, out.getvalue()
    assert users == ["hi", "hello"]


async def test_navi_run_whose_daemon_stays_gone_says_so_after_its_tries(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """No daemon answers after the drop: `navi run` dials its tries (virtual backoff)
    and fails with an error naming the daemon, the lost reconnects and the history."""
    async with paced(autojump_clock, TIMEOUT):
        async with (
            open_test_daemon(tmp_path, replies=[{"text": "x"}]) as d,
            trio.open_nursery() as n,
        ):
            cutter = await n.start(_Cutter(d.port).serve)

            async def gone() -> None:
                await cutter.lost.wait()
                cutter.closed = True
                cutter.cut()

            n.start_soon(gone)
            req = RunRequest("s-0123456789ac", "hello", tmp_path, None, False, cwd_given=False)
            with pytest.RaisesGroup(
                pytest.RaisesExc(DaemonUnreachableError, match="reconnects failed"),
                flatten_subgroups=True,
            ) as raised:
                await run_remote(cutter.url, d.tokens["alice"], req, io.StringIO(), io.StringIO())
            n.cancel_scope.cancel()
    said = str(raised.value.exceptions[0])
    assert cutter.url in said and f"navi sessions history {req.session_id}" in said, said
    assert cutter.connections == 1 + RETRIES


async def test_a_peer_ask_through_a_lost_ok_runs_once_and_gets_its_answer(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The peer link asks for a new session (its id chosen by the link, as the key is
    the session's); the ok is lost and the connection cut; the link dials again, sends
    the message again with its key, and the run's frames come from the replay. Red
    with the key left out and with the redial taken out."""
    replies = [{"text": "the peer's answer"}, {"text": "a second run"}]
    async with paced(autojump_clock, TIMEOUT):
        async with open_test_daemon(tmp_path, replies=replies) as d, trio.open_nursery() as n:
            cutter = await n.start(_Cutter(d.port).serve)
            n.start_soon(_cut_when_lost, cutter)
            link = WsPeerLink()
            await n.start(link.run)
            frames: list[Frame] = []
            async with link.ask(
                cutter.url, d.tokens["alice"], "hello", session_id=None, profile=None
            ) as run:
                while True:
                    frame = await run.receive()
                    frames.append(frame)
                    if frame["type"] == "stream_end" and not frame.get("is_subagent"):
                        break
                sid = run.session_id
            async with d.connect("alice") as watch:
                await watch.idle(sid)
                users = await _users(watch, sid)
            n.cancel_scope.cancel()
    assert cutter.lost.is_set() and cutter.connections >= 2
    ends = [f for f in frames if f["type"] == "stream_end"]
    assert [f["text"] for f in ends] == ["the peer's answer"], [
        f for f in frames if f["type"] in ("error", "stream_end", "plan_phase")
    ]
    assert users == ["hello"]


@attrs.define
class _Editor:
    """The editor's end of the ACP agent: the updates it was sent."""

    updates: list[Frame] = attrs.field(factory=list)

    async def notify(self, method: str, params: Frame) -> None:
        self.updates.append(params["update"])

    def said(self) -> str:
        return "".join(
            u["content"]["text"]
            for u in self.updates
            if u.get("sessionUpdate") == "agent_message_chunk"
        )


async def test_an_editors_prompt_through_a_lost_ok_runs_once_and_its_answer_arrives(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """An ACP prompt's message is taken and runs while its ok is lost; the connection is
    cut; the agent dials again, sends it again with its key, and the editor gets the
    answer once and ``end_turn``. Red with the key left out and with the redial taken
    out."""
    replies = [{"text": "the editor's answer"}, {"text": "a second run"}]
    async with paced(autojump_clock, TIMEOUT):
        async with open_test_daemon(tmp_path, replies=replies) as d, trio.open_nursery() as n:
            cutter = await n.start(_Cutter(d.port).serve)
            editor = _Editor()
            # An admin: the test's folder is the session's cwd.
            agent = Agent(Backend(cutter.url, d.tokens["root"]), mode=None, profile=None)
            agent.peer = editor  # type: ignore[assignment]
            opened = await agent.new_session({"cwd": str(tmp_path), "mcpServers": []})
            sid = opened.result["sessionId"]
            n.start_soon(_cut_when_lost, cutter)
            result = await agent.prompt(
                {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}
            )
            async with d.connect("root") as watch:
                await watch.idle(sid)
                users = await _users(watch, sid)
            n.cancel_scope.cancel()
    assert cutter.lost.is_set()
    assert result["stopReason"] == "end_turn", result
    assert editor.said().count("the editor's answer") == 1, editor.updates
    assert "a second run" not in editor.said()
    assert users == ["hello"]


async def test_a_chat_sends_more_than_a_burst_of_unanswered_messages_again_within_the_limit(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """45 messages typed are lost on their way, more than the daemon's burst of 40
    frames; the connection is cut; the chat reconnects and sends them all again, paced
    (client/connection.py `RESUME_BURST`), so none is refused as ``rate_limited``: each
    runs once. Red with the pacing taken out (the last ones refused)."""
    lines = [f"line {n}" for n in range(45)]
    async with paced(autojump_clock, TIMEOUT):
        async with (
            open_test_daemon(
                tmp_path, replies=[{"text": "an answer"}], loop=True, message_queue_max=64
            ) as d,
            trio.open_nursery() as n,
        ):
            cutter = await n.start(_Cutter(d.port, lose=lambda f: False).serve)
            reader, screen = QueueReader(), Screen()
            options = ChatOptions(
                url=cutter.url, token=d.tokens["alice"], backoff=0, finish_runs_on_eof=True
            )
            chat = Chat(ChatApp(options, Renderer(screen.console), reader), reader, screen)
            n.start_soon(chat.run)
            await screen.wait_for("connected to")
            reader.type("hi")
            await screen.wait_for("an answer")
            sid = str(chat.app.session_id)
            cutter.swallow = lambda f: f.get("type") == "message"
            for line in lines:
                reader.type(line)
            while cutter.swallowed < len(lines):
                cutter.swallowing = trio.Event()
                await cutter.swallowing.wait()
            cutter.swallow = None
            cutter.cut()
            reader.press("eof")  # the chat waits for the answers to all of them
            await chat.done.wait()
            async with d.connect("alice") as watch:
                await watch.idle(sid)
                users = await _users(watch, sid)
            n.cancel_scope.cancel()
    assert chat.error is None, chat.error
    assert "rate_limited" not in screen.text and "frames per second" not in screen.text
    assert users == ["hi", *lines]
