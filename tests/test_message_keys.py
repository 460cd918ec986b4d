"""A message's client key: sent again with the same key, a message is never run twice.

A client whose connection dropped between sending a message and its ``ok`` cannot tell
whether the daemon took it; it sends it again with the same ``key``, and the daemon,
which keeps the keys of a session's messages with them in the store, answers the
resend with the first one's ok, ``duplicate: true``, and does not run it. Real daemons
(tests/api_ws.py: a runtime and an ApiServer on 127.0.0.1, the fake LLM over HTTP),
real WebSocket connections; runs are held open by the `gate` tool. Every test has an
absolute `trio.fail_after`; nothing sleeps for real.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from agent_tools import GateTool, call, toolset, with_tools
from api_ws import Client, Daemon
from api_ws import open_daemon as open_test_daemon
from test_broadcast_relay import drained
from test_client_app import Chat, QueueReader, Screen

from navi_trio.api.server import ApiServer
from navi_trio.client.app import ChatApp, ChatOptions
from navi_trio.client.render import Renderer
from navi_trio.core.turn import UserMessage
from navi_trio.errors import DuplicateMessageError
from navi_trio.testing import open_harness

TIMEOUT = 30
Frame = dict[str, Any]
SID = "alice.keys"


@asynccontextmanager
async def serve_again(
    tmp_path: Path, first: Daemon, replies: list[Frame] | None = None
) -> AsyncIterator[Daemon]:
    """A daemon started again on the database of `first` (closed): its users, its tokens;
    its LLM's `replies` (default: one, "after the restart")."""
    replies = [{"text": "after the restart"}] if replies is None else replies
    async with open_harness(tmp_path, replies=replies) as h:
        async with trio.open_nursery() as nursery:
            server = ApiServer(h.runtime, host="127.0.0.1", port=0)
            port = await nursery.start(server.run)
            yield Daemon(h, server, port, dict(first.tokens), dict(first.ids))
            nursery.cancel_scope.cancel()


def _message(text: str, key: str | None, session_id: str = SID) -> Frame:
    frame: Frame = {"type": "message", "content": text, "session_id": session_id}
    if key is not None:
        frame["key"] = key
    return frame


def _gated(*answers: str) -> tuple[GateTool, dict[str, Any]]:
    """A `gate` tool the first run waits in, then `answers`: `open_test_daemon`'s options."""
    gate = GateTool()
    replies = [call("gate"), *({"text": text} for text in answers)]
    return gate, {
        "replies": replies,
        "tools": toolset(gate),
        "profiles": {"general": with_tools(["gate"])},
    }


async def _send(c: Client, frame: Frame) -> Frame:
    """Send `frame`; the daemon's last reply to it (after a new session's ``session``)."""
    reply = await c.request(frame)
    if reply["type"] == "session":
        reply = await c.until(lambda f: f.get("id") == reply["id"])
    return reply


async def _users(c: Client, session_id: str = SID) -> list[str]:
    history = await c.request({"type": "sessions", "action": "history", "session_id": session_id})
    return [m["content"] for m in history["messages"] if m["role"] == "user"]


async def test_a_key_sent_again_runs_once_on_one_connection_after_a_reconnect_and_a_restart(
    tmp_path: Path,
) -> None:
    replies = [{"text": "the one answer"}, {"text": "a second run"}]
    with trio.fail_after(TIMEOUT):
        async with open_test_daemon(tmp_path, replies=replies) as d:
            async with d.connect("alice") as c:
                first = await _send(c, _message("hello", "k-1"))
                assert first["type"] == "ok" and "duplicate" not in first, first
                await c.until_end(SID)
                await c.idle(SID)
                again = await _send(c, _message("hello", "k-1"))
            async with d.connect("alice") as c:  # a new connection: the resend of a chat
                reconnected = await _send(c, _message("hello", "k-1"))
                assert await _users(c) == ["hello"]
            daemon = d
        async with serve_again(tmp_path, daemon) as d, d.connect("alice") as c:
            restarted = await _send(c, _message("hello", "k-1"))
            assert await _users(c) == ["hello"]
            # A new key runs: the LLM's next reply is this one's, none was taken meanwhile.
            await _send(c, _message("and now", "k-2"))
            end = await c.until_end(SID)
            assert end["text"] == "after the restart"
            assert await _users(c) == ["hello", "and now"]
    taken = {k: first[k] for k in ("seq", "epoch", "queued", "mode")}
    for dup in (again, reconnected, restarted):
        assert dup["type"] == "ok" and dup["duplicate"] is True, dup
        assert {k: dup[k] for k in taken} == taken  # the first one's ok, again


async def test_a_resend_while_the_first_still_runs_is_not_run_and_keeps_its_fields(
    tmp_path: Path,
) -> None:
    """The first run held open (gate): a second connection sends the same key; the ok
    says duplicate with the first's seq, and the session runs one turn."""
    gate, held = _gated("done once", "never")
    with trio.fail_after(TIMEOUT):
        async with open_test_daemon(tmp_path, **held) as d:
            async with d.connect("alice") as c, d.connect("alice") as c2:
                first = await _send(c, _message("hi", "k-run"))
                await gate.entered.wait()
                dup = await _send(c2, _message("hi", "k-run"))
                gate.gate.set()
                end = await c.until_end(SID)
                await c.idle(SID)
                assert await _users(c) == ["hi"]
    assert dup["duplicate"] is True and not dup["queued"]
    assert (dup["seq"], dup["epoch"]) == (first["seq"], first["epoch"])
    assert end["text"] == "done once"


async def test_a_resend_gets_its_duplicate_ok_alone_and_is_never_queued_whatever_its_on_busy(
    tmp_path: Path,
) -> None:
    """The first run held open: the resend asks ``on_busy: reject`` (an ``enqueue`` alike).
    Its key answers it before its on_busy applies: one reply, the duplicate ok (no
    ``session_busy``, no second reply), and no ``message_queued`` for it on either
    connection (a client counting the runs before its message would wait for one more)."""
    gate, held = _gated("done once", "never")
    with trio.fail_after(TIMEOUT):
        async with open_test_daemon(tmp_path, **held) as d:
            async with d.connect("alice") as c, d.connect("alice") as c2:
                await _send(c, _message("hi", "k-run"))
                await gate.entered.wait()
                refusing = await _send(c2, {**_message("hi", "k-run"), "on_busy": "reject"})
                queuing = await _send(c2, {**_message("hi", "k-run"), "on_busy": "enqueue"})
                gate.gate.set()
                await c.until_end(SID)
                await c2.until_end(SID)
                await c.idle(SID)
                await c2.idle(SID)  # a reply to the resends after their ok came before this
                assert await _users(c) == ["hi"]
    for dup in (refusing, queuing):
        assert (dup["type"], dup.get("duplicate")) == ("ok", True), dup
        assert [f for f in c2.frames if f.get("id") == dup["id"]] == [dup]
    for client in (c, c2):
        assert [f for f in client.frames if f["type"] == "message_queued"] == []


async def test_the_duplicate_ok_of_an_interrupt_says_queued_as_its_own_ok_did(
    tmp_path: Path,
) -> None:
    """An interrupt waits for a run of its own (``queued: true`` in its ok) though it is
    not queued behind the others; its resend after the run gets that ok again."""
    gate, held = _gated("interrupted to say this", "never")
    with trio.fail_after(TIMEOUT):
        async with open_test_daemon(tmp_path, **held) as d:
            async with d.connect("alice") as c:
                await _send(c, _message("hi", None))
                await gate.entered.wait()
                first = await _send(c, {**_message("now this", "k-int"), "on_busy": "interrupt"})
                gate.gate.set()
                await c.until(lambda f: f.get("text") == "interrupted to say this")
                await c.idle(SID)
                again = await _send(c, _message("now this", "k-int"))
                assert await _users(c) == ["hi", "now this"]
    assert (first["on_busy"], first["queued"]) == ("interrupt", True), first
    assert again["duplicate"] is True, again
    assert {k: again[k] for k in ("on_busy", "queued")} == {"on_busy": "interrupt", "queued": True}


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
async def test_two_messages_with_one_key_on_their_way_at_once_run_once(
    tmp_path: Path, busy: bool
) -> None:
    """Neither was stored when the other came, so no look-up could tell: the store's
    claim lets one in (saved to run, or queued behind it) and refuses the other, which
    is stored nowhere and never runs (its clients see no run of it, not even a failed
    one); which of the two is the store's to say."""
    replies = [{"text": "an answer"}] * 8  # (the plan phases take some)
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies) as h:
            await h.runtime.store.create_session("s1", profile_id="general")
            actor = await h.runtime.sessions.get("s1")
            sub = actor.subscribe()
            if busy:
                actor.send_message("before")
            both = [UserMessage("do it", key="k"), UserMessage("do it", key="k")]
            for message in both:
                actor.send_message(message)
            for message in both:
                with contextlib.suppress(DuplicateMessageError):
                    await message.accepted.wait()
            await actor.idle.wait()
            saved = await h.runtime.store.load_messages("s1")
            users = [m["content"] for m in saved if m["role"] == "user"]
            said = drained(sub)
    refused = [m.accepted.error for m in both if m.accepted.failed]
    ends = [f["reason"] for f in said if f["type"] == "stream_end" and not f.get("is_subagent")]
    assert ends == ["complete"] * len(users), said
    assert [f for f in said if f["type"] == "error"] == []
    assert len(refused) == 1 and isinstance(refused[0], DuplicateMessageError), refused
    assert users == (["before"] if busy else []) + ["do it"]


async def test_a_key_is_the_sessions_own(tmp_path: Path) -> None:
    """Keys are per session: the same key in another session runs there; another user's
    session is refused before its keys are looked at (nothing to probe)."""
    replies = [{"text": "one"}, {"text": "two"}]
    with trio.fail_after(TIMEOUT):
        async with open_test_daemon(tmp_path, replies=replies) as d:
            async with d.connect("alice") as c, d.connect("bob") as b:
                await _send(c, _message("mine", "k-same"))
                await c.until_end(SID)
                other = await _send(c, _message("elsewhere", "k-same", "alice.other"))
                await c.until_end("alice.other")
                probe = await _send(b, _message("yours?", "k-same"))
    assert "duplicate" not in other
    assert (probe["type"], probe["code"]) == ("error", "forbidden")


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("", "1-64 printable ASCII characters"),
        ("k" * 65, "1-64 printable ASCII characters"),
        ("two words", "no spaces"),
        ("é", "printable ASCII"),
        (7, "string"),
    ],
)
async def test_a_bad_key_is_refused_naming_the_field_and_its_bound(
    tmp_path: Path, key: Any, why: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_test_daemon(tmp_path) as d, d.connect("alice") as c:
            refused = await c.request({"type": "message", "content": "x", "key": key})
    assert (refused["type"], refused["code"]) == ("error", "bad_frame"), refused
    assert "'key'" in refused["message"] and why in refused["message"], refused


# -- navi chat through a dropped connection ----------------------------------------------


@attrs.define(eq=False)
class _Link:
    """A TCP forwarder between the chat and the daemon. `deaf`: what the chat sends is
    dropped (a message lost on its way); `mute`: what the daemon sends is dropped (an ok
    lost); `cut()` closes every connection through it for real (the daemon goes on)."""

    target: int
    port: int = 0
    deaf: bool = False
    mute: bool = False
    dropped: trio.Event = attrs.field(factory=trio.Event)  # something was dropped
    live: set[trio.CancelScope] = attrs.field(factory=set)

    async def serve(
        self, *, task_status: trio.TaskStatus[_Link] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self)
        await trio.serve_listeners(self._handle, listeners)

    def cut(self) -> None:
        self.deaf = self.mute = False  # the connections after it go through whole
        for scope in self.live:
            scope.cancel()

    async def _handle(self, chat: trio.SocketStream) -> None:
        async with chat:
            with trio.CancelScope() as scope:
                self.live.add(scope)
                daemon = await trio.open_tcp_stream("127.0.0.1", self.target)
                async with daemon, trio.open_nursery() as nursery:
                    nursery.start_soon(self._pipe, chat, daemon, "deaf", scope)
                    nursery.start_soon(self._pipe, daemon, chat, "mute", scope)

    async def _pipe(
        self, src: trio.SocketStream, dst: trio.SocketStream, drop: str, done: trio.CancelScope
    ) -> None:
        try:
            async for data in src:
                if getattr(self, drop):
                    self.dropped.set()
                    continue
                await dst.send_all(data)
        except trio.BrokenResourceError:
            pass
        done.cancel()


@pytest.mark.parametrize("lost", ["the message", "its ok"])
async def test_a_piped_chat_through_a_dropped_connection_shows_each_answer_once(
    tmp_path: Path, lost: str
) -> None:
    """The second line's frame (or the daemon's ok to it) is lost with the connection;
    the chat, at the end of its input, reconnects and sends it again with its key: it
    runs once, its answer shows once, and the chat ends. Red before: a message lost on
    its way was never sent again (its answer never came), and one sent again without a
    key would have run twice."""
    replies = [{"text": "first answer"}, {"text": "second answer"}, {"text": "a third run"}]
    with trio.fail_after(TIMEOUT):
        async with open_test_daemon(tmp_path, replies=replies) as d, trio.open_nursery() as n:
            link = await n.start(_Link(d.port).serve)
            reader, screen = QueueReader(), Screen()
            url, token = f"ws://127.0.0.1:{link.port}", d.tokens["alice"]
            options = ChatOptions(url=url, token=token, backoff=0, finish_runs_on_eof=True)
            chat = Chat(ChatApp(options, Renderer(screen.console), reader), reader, screen)
            n.start_soon(chat.run)
            await screen.wait_for("connected to")
            reader.type("hi")
            await screen.wait_for("first answer")
            sid = str(chat.app.session_id)
            async with d.connect("alice") as watch:
                await watch.idle(sid)
                await watch.request({"type": "subscribe", "session_id": sid})
                if lost == "its ok":
                    link.mute = True
                else:
                    link.deaf = True
                reader.type("again")
                reader.press("eof")  # the chat waits for the answer to "again"
                if lost == "its ok":  # taken and run while the chat hears nothing
                    await watch.until_type("stream_end", session_id=sid, text="second answer")
                    await watch.idle(sid)
                else:
                    await link.dropped.wait()
                link.cut()
                await chat.done.wait()
                assert await _users(watch, sid) == ["hi", "again"]
            n.cancel_scope.cancel()
    assert chat.error is None
    assert screen.text.count("second answer") == 1, screen.text
    assert "a third run" not in screen.text
    assert "sent again once reconnected" in screen.text
