"""`ChatApp` and `Connection` over real WebSocket connections to the stand-in daemon.

Rules: loopback only, port 0; the stand-in (tests/chat_standin.py) runs in the test's
loop; input comes from a `QueueReader` (a real `Reader` fed by the test) and output
goes to a recording Console. Nothing sleeps: the test waits for a frame at the
stand-in or for text on the screen (the renderer sets an event on every print), and
reconnect backoff is 0. Every test has an absolute deadline.
"""

from __future__ import annotations

import contextlib
import io
import queue
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import trio
from chat_standin import EPOCH, StandIn
from rich.console import Console

from navi_trio.client.app import ChatApp, ChatOptions
from navi_trio.client.reader import InputEvent
from navi_trio.client.render import Renderer
from navi_trio.errors import DaemonUnreachableError, RemoteError

DEADLINE = 20


class QueueReader:
    """A `Reader` the test types into."""

    def __init__(self) -> None:
        self.events: queue.Queue[InputEvent] = queue.Queue()

    def type(self, text: str) -> None:
        self.events.put(InputEvent("line", text))

    def press(self, kind: str) -> None:
        self.events.put(InputEvent(kind))  # type: ignore[arg-type]

    def read(self) -> InputEvent:
        return self.events.get()

    def abort(self) -> None:
        self.events.put(InputEvent("eof"))

    def wait_idle(self, timeout: float) -> None:
        pass

    @contextlib.contextmanager
    def output(self) -> Iterator[None]:
        yield


class Screen:
    """A recording console whose reader can wait for a text to appear."""

    def __init__(self) -> None:
        self.out = io.StringIO()
        self.changed = trio.Event()
        screen = self

        class _File(io.StringIO):
            def write(self, s: str) -> int:
                screen.out.write(s)
                screen.changed.set()
                return len(s)

        self.console = Console(file=_File(), width=160, color_system=None)

    @property
    def text(self) -> str:
        return self.out.getvalue()

    async def wait_for(self, needle: str) -> None:
        while needle not in self.text:
            self.changed = trio.Event()
            await self.changed.wait()


class Chat:
    def __init__(self, app: ChatApp, reader: QueueReader, screen: Screen) -> None:
        self.app, self.reader, self.screen = app, reader, screen
        self.done = trio.Event()
        self.error: BaseException | None = None

    async def run(self) -> None:
        try:
            await self.app.run()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.error = exc
        finally:
            self.done.set()


@contextlib.asynccontextmanager
async def chatting(daemon: StandIn, **options: Any) -> AsyncIterator[Chat]:
    reader, screen = QueueReader(), Screen()
    opts = ChatOptions(url=daemon.url, token=daemon.token, backoff=0, **options)
    chat = Chat(ChatApp(opts, Renderer(screen.console), reader), reader, screen)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(chat.run)
        yield chat
        with trio.move_on_after(5):
            await chat.done.wait()
        nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def standin(token: str = "t0k") -> AsyncIterator[StandIn]:
    daemon = StandIn(token=token)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.serve)
        yield daemon
        nursery.cancel_scope.cancel()


async def test_a_first_message_creates_a_session_and_the_answer_shows() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon, profile="coder") as chat:
            await chat.screen.wait_for("connected to stand-in")
            chat.reader.type("hi there")
            await chat.screen.wait_for("you said: hi there")
            sent = await daemon.wait_for("message")
            assert "session_id" not in sent and sent["profile"] == "coder"
            assert sent["cwd"]  # the daemon runs tools where the person is
            assert chat.app.session_id == "s-1"
            await chat.screen.wait_for("context 42 tokens")
            chat.reader.type("again")
            await chat.screen.wait_for("you said: again")
            assert (await daemon.wait_for("message", content="again"))["session_id"] == "s-1"
            chat.reader.press("eof")  # Ctrl-D quits
        assert chat.error is None


async def test_the_status_line_names_the_daemons_profile_and_the_ask_is_not_shown() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon) as chat:
            await chat.screen.wait_for("connected to stand-in")
            chat.reader.type("hi there")
            await chat.screen.wait_for("session s-1 · profile general · model stand-in-model")
            ask = await daemon.wait_for("sessions", action="list")
            assert str(ask["id"]).startswith("chat-profile-")
            assert "/resume ID continues one" not in chat.screen.text  # the reply is not shown
            chat.reader.type("/quit")
        assert chat.error is None


async def test_a_dropped_connection_reconnects_and_subscribes_from_the_last_seq() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon) as chat:
            chat.reader.type("one")
            await chat.screen.wait_for("context 42 tokens")
            last = chat.app.last_seq
            assert last == 3  # model_info, text_delta, stream_end
            await daemon.drop()
            await chat.screen.wait_for("connection lost")
            sub = await daemon.wait_for("subscribe")
            assert sub == {"type": "subscribe", "session_id": "s-1", "last_seq": 3, "epoch": EPOCH}
            # Task updates are out-of-band: the list is asked for again after a reconnect.
            tasks = await daemon.wait_for("tasks")
            assert tasks == {"type": "tasks", "action": "list", "session_id": "s-1"}
            await chat.screen.wait_for("t-1 terminal: running")
            await chat.screen.wait_for("reconnected")
            assert daemon.types().count("hello") == 2
            chat.reader.type("two")
            await chat.screen.wait_for("you said: two")
            chat.reader.type("/quit")
        assert chat.error is None


async def test_the_client_gives_up_after_the_bounded_reconnects_with_one_clear_line() -> None:
    daemon = StandIn()
    server = trio.CancelScope()

    async def serve(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        with server:
            await daemon.serve(task_status=task_status)

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as outer:
            await outer.start(serve)
            async with chatting(daemon, retries=2) as chat:
                await chat.screen.wait_for("connected")
                server.cancel()  # the daemon goes away for good, connections and all
                await chat.done.wait()
        assert isinstance(chat.error, BaseExceptionGroup)
        leaf = chat.error.exceptions[0]
        assert isinstance(leaf, DaemonUnreachableError)
        assert "2 reconnects failed" in str(leaf) and "navi serve" in str(leaf)
        assert chat.screen.text.count("connection lost") == 2


async def test_a_bad_token_is_one_line_saying_what_to_do() -> None:
    with trio.fail_after(DEADLINE):
        async with standin(token="right") as daemon:
            daemon.token = "right"
            reader, screen = QueueReader(), Screen()
            opts = ChatOptions(url=daemon.url, token="wrong")
            with pytest.RaisesGroup(
                pytest.RaisesExc(RemoteError, match="pass --token, set NAVI_TOKEN")
            ) as caught:
                await ChatApp(opts, Renderer(screen.console), reader).run()
            assert "missing or wrong token" in str(caught.value.exceptions[0])


async def test_an_unreachable_daemon_is_one_line_saying_what_to_do() -> None:
    with trio.fail_after(DEADLINE):
        with trio.socket.socket() as sock:  # a port nobody listens on
            await sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        opts = ChatOptions(url=f"ws://127.0.0.1:{port}", token="x")
        with pytest.RaisesGroup(
            pytest.RaisesExc(DaemonUnreachableError, match="no navi daemon answers.*navi serve")
        ):
            await ChatApp(opts, Renderer(Screen().console), QueueReader()).run()


async def test_resume_replays_the_history_and_subscribes_from_its_seq() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon, session_id="s-old") as chat:
            await chat.screen.wait_for("resumed session s-old")
            assert (await daemon.wait_for("sessions"))["action"] == "history"
            sub = await daemon.wait_for("subscribe")
            assert sub == {
                "type": "subscribe",
                "session_id": "s-old",
                "last_seq": 0,
                "epoch": EPOCH,
            }
            assert "› what is 2+2?" in chat.screen.text and "It is 4." in chat.screen.text
            chat.reader.type("/resume")
            await chat.screen.wait_for("/resume needs a session id")
            chat.reader.type("/quit")


async def test_a_daemon_without_commands_kept_as_files_spoils_no_resume() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon:
            daemon.knows_commands = False  # an older daemon: the chat asks, is refused
            async with chatting(daemon, session_id="s-old") as chat:
                await chat.screen.wait_for("resumed session s-old")
                assert (await daemon.wait_for("commands"))["id"] == "chat-commands"
                await daemon.wait_for("subscribe")
                chat.reader.type("/nope")
                await chat.screen.wait_for("unknown command /nope")
                assert "unknown 'commands'" not in chat.screen.text
                chat.reader.type("/quit")


async def test_slash_commands_answer_in_one_line_each() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon) as chat:
            s = chat.screen
            chat.reader.type("/compact")
            await s.wait_for("nothing to compact yet")
            chat.reader.type("/sessions")
            await s.wait_for("s-old general · 2026-11-29 an older chat")
            chat.reader.type("/tasks")
            await s.wait_for("t-1 terminal: running · 3s")
            chat.reader.type("/approvals")
            await s.wait_for("g-0123456789ab · session s-1 · mode full · `curl` in this workspace")
            chat.reader.type("/approvals revoke g-0123456789ab")
            await s.wait_for("revoked g-0123456789ab")
            revoke = await daemon.wait_for("grants", action="revoke")
            assert revoke["grant_id"] == "g-0123456789ab"
            chat.reader.type("/approvals nonsense")
            await s.wait_for("usage: /approvals, or /approvals revoke ID")
            chat.reader.type("/profile researcher")
            await s.wait_for("profile researcher: used from your next message")
            chat.reader.type("/profile")
            await s.wait_for("profile: researcher (/profile NAME changes it)")
            chat.reader.type("/thinking")
            await s.wait_for("thinking is shown in full")
            chat.reader.type("/nope")
            await s.wait_for("unknown command /nope: type /help for the list")
            chat.reader.type("hello")
            await s.wait_for("you said: hello")
            assert (await daemon.wait_for("message"))["profile"] == "researcher"
            chat.reader.type("/compact")
            assert (await daemon.wait_for("compact"))["session_id"] == "s-1"
            # The daemon switches the session to the profile of the next message: until
            # then the status line shows the session's own.
            chat.reader.type("/profile coder")
            await s.wait_for("profile coder: used from your next message")
            assert chat.app.renderer.status.profile == "researcher"
            chat.reader.type("/profile")
            await s.wait_for("profile: researcher (coder from your next message)")
            chat.reader.type("/new")
            await s.wait_for("new session: it starts with your next message")
            assert chat.app.session_id is None
            assert chat.app.renderer.status.profile == "coder"
            assert (await daemon.wait_for("unsubscribe"))["session_id"] == "s-1"
            chat.reader.type("/quit")
        assert chat.error is None


async def test_ctrl_c_stops_a_run_and_twice_on_an_idle_prompt_quits() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon) as chat:
            chat.reader.type("first")
            await chat.screen.wait_for("you said: first")
            chat.reader.type("wait")
            await daemon.wait_for("message", content="wait")
            chat.reader.type("meanwhile")
            await chat.screen.wait_for("queued #1 meanwhile")
            chat.reader.press("interrupt")
            assert (await daemon.wait_for("stop"))["session_id"] == "s-1"
            await chat.screen.wait_for("■ stopped")
            await chat.screen.wait_for("you said: meanwhile")  # the queue drains after a stop
            await chat.screen.wait_for("context 42 tokens")
            chat.reader.press("interrupt")
            await chat.screen.wait_for("press Ctrl+C again or Ctrl+D to quit")
            assert not chat.done.is_set()
            chat.reader.press("interrupt")
            await chat.done.wait()
        assert chat.error is None


@pytest.mark.parametrize("mode", ["all", "lagged"])
async def test_replayed_frames_already_seen_are_not_shown_twice(mode: str) -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon) as chat:
            daemon.on_subscribe = mode
            chat.reader.type("one")
            await chat.screen.wait_for("context 42 tokens")
            await daemon.drop()
            await chat.screen.wait_for("reconnected")
            if mode == "lagged":
                await chat.screen.wait_for("fell behind (seq 2–3)")
            chat.reader.type("two")
            await chat.screen.wait_for("you said: two")
            assert chat.screen.text.count("you said: one") == 1
            assert chat.app.last_seq == 6
            chat.reader.type("/quit")
        assert chat.error is None


async def test_a_resync_loads_the_history_and_takes_the_new_epoch() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon) as chat:
            daemon.on_subscribe = "resync"
            chat.reader.type("one")
            await chat.screen.wait_for("context 42 tokens")
            await daemon.drop()
            await chat.screen.wait_for("missed part of the stream: reloading the history")
            # The stand-in's history holds one turn, the one shown live: not shown again.
            await chat.screen.wait_for("history reloaded: every turn was already shown")
            assert "what is 2+2" not in chat.screen.text
            history = await daemon.wait_for("sessions", action="history")
            assert history["session_id"] == "s-1"
            assert (chat.app.epoch, chat.app.last_seq) == ("e2", 3)
            chat.reader.type("/quit")
        assert chat.error is None


async def test_a_history_larger_than_the_websocket_default_limit_is_replayed() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon:
            big = "x" * (2 * 1024 * 1024)  # trio-websocket's default limit is 1 MiB
            daemon.history_extra = [{"role": "tool", "content": big}]
            async with chatting(daemon, session_id="s-big") as chat:
                await chat.screen.wait_for("resumed session s-big")
                assert "3 messages replayed" in chat.screen.text
                chat.reader.type("/quit")
            assert chat.error is None


async def test_a_history_in_pages_is_replayed_whole_and_subscribed_from_its_last_page() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon:
            daemon.history_page = 2  # 7 messages: 4 pages, the seq one higher on each
            daemon.history_extra = [{"role": "user", "content": f"later {i}"} for i in range(5)]
            async with chatting(daemon, session_id="s-paged") as chat:
                await chat.screen.wait_for("resumed session s-paged")
                assert "7 messages replayed" in chat.screen.text
                assert all(f"later {i}" in chat.screen.text for i in range(5))
                sub = await daemon.wait_for("subscribe")
                assert (sub["last_seq"], sub["epoch"]) == (3, EPOCH)
                asks = [f for f in daemon.received if f["type"] == "sessions"]
                assert [f.get("cursor") for f in asks] == [None, "2", "4", "6"]
                chat.reader.type("/quit")
            assert chat.error is None


async def cards(screen: Screen, count: int) -> None:
    """Wait until `count` approval cards are on the screen."""
    while screen.text.count("? approve terminal") < count:
        screen.changed = trio.Event()
        await screen.changed.wait()


async def test_an_approval_request_is_a_card_answered_with_y_n_a_or_s() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon) as chat:
            chat.reader.type("/mode full")
            await chat.screen.wait_for("mode full: asked for in your next messages")
            chat.reader.type("ask")
            await chat.screen.wait_for("y yes · s this session · a always · n no")
            assert (await daemon.wait_for("message"))["mode"] == "full"
            assert "? approve terminal: terminal run: rm -rf build" in chat.screen.text
            assert "mode full: terminal runs without a sandbox" in chat.screen.text
            assert "no answer in 300s is a deny" in chat.screen.text
            chat.reader.type("a")
            answer = await daemon.wait_for("approve")
            assert answer == {
                "type": "approve", "session_id": "s-1", "call_id": "c-ask", "scope": "always",
            }  # fmt: skip
            await chat.screen.wait_for("✔ approved terminal (always, by owner)")
            await chat.screen.wait_for("context 7 tokens")
            # With nothing waiting, "n" is a message like any other.
            chat.reader.type("n")
            await chat.screen.wait_for("you said: n")
            chat.reader.type("ask")
            await cards(chat.screen, 2)
            chat.reader.type("n")
            assert (await daemon.wait_for("deny"))["scope"] == "once"
            await chat.screen.wait_for("✗ denied terminal (by owner)")
            chat.reader.type("/mode fast")
            await chat.screen.wait_for("unknown mode 'fast': use one of read-only, workspace, full")
            chat.reader.type("/quit")
        assert chat.error is None
        assert [f["type"] for f in daemon.received].count("approve") == 1


async def test_a_request_still_waiting_is_shown_again_on_reconnect_and_answered() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon) as chat:
            chat.reader.type("ask")
            await chat.screen.wait_for("? approve terminal")
            await daemon.drop()  # the run waits on in the daemon; its card comes with the ok
            await chat.screen.wait_for("reconnected")
            await daemon.wait_for("subscribe")
            await cards(chat.screen, 2)
            chat.reader.type("s")
            answer = await daemon.wait_for("approve")
            assert answer["call_id"] == "c-ask" and answer["scope"] == "session"
            assert daemon.sessions["s-1"].asking == {}
            chat.reader.type("/quit")
        assert chat.error is None


class _Sent:
    """A connection that takes every frame (the daemon answers through `on_frame`)."""

    connected = True

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    async def send(self, frame: dict[str, Any]) -> None:
        self.frames.append(frame)


class PrefillReader(QueueReader):
    """A `QueueReader` that keeps what the chat puts on the prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.prefilled: list[str] = []

    def prefill(self, text: str) -> None:
        self.prefilled.append(text)


async def test_a_sent_message_waits_for_the_model_and_a_refused_one_changes_nothing() -> None:
    reader, screen = PrefillReader(), Screen()
    app = ChatApp(ChatOptions(url="ws://127.0.0.1:9", token=""), Renderer(screen.console), reader)
    conn = _Sent()
    app._conn = conn  # type: ignore[assignment]
    app.set_session("s-1")
    await app.line("hello")
    assert app.renderer.busy and app.renderer.status.activity == "waiting for the model…"
    (sent,) = conn.frames
    refusal = {"type": "error", "code": "bad_frame", "message": "no", "id": sent["id"]}
    assert app.on_frame(refusal) == []
    assert not app.renderer.busy and app.renderer.status.activity == ""  # idle, as before
    assert reader.prefilled == ["hello"]
    assert "your message is back on the prompt" in screen.text
    # Taken (ok): nothing comes back, and the run's frames say what goes on.
    await app.line("again")
    app.on_frame({"type": "ok", "id": conn.frames[-1]["id"], "session_id": "s-1"})
    assert (
        reader.prefilled == ["hello"] and app.renderer.status.activity == "waiting for the model…"
    )
