"""The end of a piped script waits for the answer to every message the chat sent.

A message's ``ok`` and the frames of its run come to the chat in either order (the ok
leaves once the message is stored, the run's frames as they are made), and a message
sent while a run is streaming may be taken after that run ended, so that it runs at
once: the chat follows each message of its own to its run's end, whatever the order.
The first tests feed `ChatApp.on_frame` the daemon's frames with the ok at every place
in them; the last runs the chat over a real WebSocket connection to the stand-in daemon
(tests/chat_standin.py), the message crossing the end of the run before it.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from test_client_app import DEADLINE, QueueReader, Screen, _Sent, chatting, standin

from navi_trio import wire
from navi_trio.client.app import ChatApp, ChatOptions
from navi_trio.client.render import Renderer

Frame = dict[str, Any]
SID = "s-1"
EPOCH = "e1"


def _frame(seq: int, kind: str, **fields: Any) -> Frame:
    return {
        "type": kind,
        "session_id": SID,
        "seq": seq,
        "epoch": EPOCH,
        "is_subagent": False,
        "agent_id": None,
        **fields,
    }


def _end(seq: int, text: str) -> Frame:
    return _frame(seq, "stream_end", text=text, prompt_tokens=7)


async def _chat_with_a_run_going(screen: Screen | None = None) -> tuple[ChatApp, _Sent]:
    """A chat in session s-1 whose first message's run streams (seq 1, 2)."""
    console = (screen or Screen()).console
    app = ChatApp(ChatOptions(url="ws://127.0.0.1:9", token=""), Renderer(console), QueueReader())
    conn = _Sent()
    app._conn = conn  # type: ignore[assignment]
    app.set_session(SID)
    await app.line("first")
    app.on_frame({"type": "ok", "id": conn.frames[-1]["id"], "session_id": SID, "seq": 0})
    app.on_frame(_frame(1, "model_info", model="m"))
    app.on_frame(_frame(2, "text_delta", text="the first answer"))
    return app, conn


def _ok(conn: _Sent, seq: int | None, **fields: Any) -> Frame:
    ok: Frame = {"type": "ok", "id": conn.frames[-1]["id"], "session_id": SID, **fields}
    if seq is not None:
        ok.update(seq=seq, epoch=EPOCH)
    return ok


def _running_after_each(app: ChatApp, frames: list[Frame]) -> list[bool]:
    running = []
    for frame in frames:
        app.on_frame(frame)
        running.append(app._running())
    return running


# How the daemon met our second message (its on_busy, its ok's fields) and the frames
# after it went out, without its ok: where the ok goes among them is a parameter too.
CASES: dict[str, tuple[str | None, Frame, list[Frame]]] = {
    # The first run ended (seq 3) before the daemon took ours: it runs at once. Red
    # before: with the ok anywhere after that end, the chat saw nothing going there.
    "taken-at-once": (
        None,
        {"seq": 3, "queued": False},
        [
            _end(3, "the first answer"),
            _frame(4, "model_info", model="m"),
            _frame(5, "text_delta", text="the second answer"),
            _end(6, "the second answer"),
        ],
    ),
    "queued": (  # ours waits behind the first run
        "enqueue",
        {"seq": 2, "queued": True, "on_busy": "enqueue"},
        [
            _frame(3, "message_queued", text="second", position=1),
            _end(4, "the first answer"),
            _frame(5, "text_delta", text="the second answer"),
            _end(6, "the second answer"),
        ],
    ),
    "steered": (  # ours joins the first run: its end is ours
        "steer",
        {"seq": 2, "queued": False, "on_busy": "steer"},
        [
            _frame(3, "steered", text="second"),
            _frame(4, "text_delta", text="both answered"),
            _end(5, "both answered"),
        ],
    ),
}


@pytest.mark.parametrize(
    ("case", "at"),
    [(case, at) for case, (_, _, frames) in CASES.items() for at in range(len(frames) + 1)],
)
async def test_a_message_is_waited_for_until_its_run_ends_wherever_its_ok_comes(
    case: str, at: int
) -> None:
    on_busy, fields, after = CASES[case]
    app, conn = await _chat_with_a_run_going()
    await app.line("second", on_busy)
    frames = [*after]
    frames.insert(at, _ok(conn, fields["seq"], **{k: v for k, v in fields.items() if k != "seq"}))
    running = _running_after_each(app, frames)
    assert running == [True] * (len(frames) - 1) + [False]


async def test_an_ok_without_a_seq_still_ends_the_wait() -> None:
    """An older daemon's ok names no seq: the run is followed from the frames that came
    since the message went out; the chat never waits for an end already shown."""
    app, conn = await _chat_with_a_run_going()
    await app.line("second")
    frames = [_end(3, "the first answer"), _end(4, "the second answer"), _ok(conn, None)]
    assert _running_after_each(app, frames) == [True, True, False]


async def test_a_refused_message_is_not_waited_for() -> None:
    app, conn = await _chat_with_a_run_going()
    await app.line("second")
    refusal = {"type": "error", "code": "too_large", "message": "no", "id": conn.frames[-1]["id"]}
    frames = [refusal, _end(3, "the first answer")]
    assert _running_after_each(app, frames) == [True, False]


async def test_a_queued_message_the_cap_dropped_is_not_waited_for() -> None:
    app, conn = await _chat_with_a_run_going()
    await app.line("second")
    dropped = _frame(
        4,
        "warning",
        code="message_dropped",
        message=f"{wire.QUEUE_FULL} (5 waiting, NAVI_MESSAGE_QUEUE_MAX): the oldest waiting, "
        "the message 'second', was dropped and will not run (1 dropped so far)",
    )
    frames = [
        _frame(3, "message_queued", text="second", position=1),
        _ok(conn, 2, queued=True, on_busy="enqueue"),
        dropped,
        _end(5, "the first answer"),  # the first message's run, still followed
    ]
    for frame in frames:
        assert app._awaited.waiting
        app.on_frame(frame)
    assert not app._awaited.waiting


def _subscribed(seq: int) -> Frame:
    """The daemon's reply to the subscribe a reconnect sends: the session's seq now."""
    return {"type": "ok", "session_id": SID, "seq": seq, "approvals": []}


LOST: Frame = {"type": "_disconnected", "reason": "gone", "retry_in": 0, "attempt": 1}
BACK: Frame = {"type": "_reconnected", "welcome": {}}


async def test_through_a_reconnect_the_chat_waits_for_the_replay_of_what_went_on() -> None:
    """The connection drops after the first run's end and before the second message's
    ok: that ok is gone, so the reconnect sends the message again, with its id and its
    key (the daemon runs it once); the replay after the subscribe shows its run, and the
    resend's ok (the first one's again: ``duplicate``) says which frames are its. Red
    before: nothing seemed to go on at the drop, and a piped chat quit there."""
    screen = Screen()
    app, conn = await _chat_with_a_run_going(screen)
    await app.line("second")
    sent = conn.frames[-1]
    assert sent["key"] and sent["key"] != conn.frames[0]["key"]  # a key of its own
    frames = [_end(3, "the first answer"), LOST, BACK, _subscribed(6)]
    assert _running_after_each(app, frames) == [True] * 4
    resume = app.resume()
    assert [f["type"] for f in resume] == ["subscribe", "tasks", "message"]
    assert resume[-1] == sent  # the same frame: its id and key
    frames = [
        _frame(4, "model_info", model="m"),  # the replay: the second message ran
        _frame(5, "text_delta", text="the second answer"),
        _end(6, "the second answer"),
        {**_ok(conn, 3, queued=False), "duplicate": True},
    ]
    assert _running_after_each(app, frames) == [True, True, True, False]
    assert "1 message(s) sent had no answer yet: sent again" in screen.text
    assert screen.text.count("the second answer") == 1


async def test_a_resent_message_the_daemon_took_before_a_restart_is_not_followed() -> None:
    """After a restart (a resync, a new epoch) the resend's ok is the first one's, of the
    daemon's earlier life: its run's frames are not in this stream (its turn is in the
    history the chat reloads), so the chat does not wait for them."""
    app, conn = await _chat_with_a_run_going()
    await app.line("second")
    resync = {"type": "resync", "session_id": SID, "seq": 0, "epoch": "e2"}
    frames = [LOST, BACK, resync, {**_ok(conn, 2, queued=True), "duplicate": True}]
    assert _running_after_each(app, frames)[-1] is False


async def test_a_new_sessions_first_message_is_sent_again_once_its_session_is_named() -> None:
    """Its key is the session's: without the session (its ``session`` reply lost too) it
    is let go, as before; once the daemon named the session, it goes there again."""
    app = ChatApp(
        ChatOptions(url="ws://127.0.0.1:9", token=""), Renderer(Screen().console), QueueReader()
    )
    conn = _Sent()
    app._conn = conn  # type: ignore[assignment]
    await app.line("make it")
    rid = conn.frames[0]["id"]
    assert app._awaited.resend(None) == []  # no session named yet: nothing to send again
    app.on_frame({"type": "session", "session_id": SID, "created": True, "id": rid})
    app.on_frame(LOST)
    resent = app._awaited.resend(SID)
    assert [f["content"] for f in resent] == ["make it"]
    assert resent[0]["session_id"] == SID and resent[0]["key"] == conn.frames[0]["key"]


async def test_a_new_sessions_first_message_unnamed_at_the_drop_is_let_go() -> None:
    """Its ``session`` reply lost with the connection: whether it was taken is unknown and
    it cannot be sent again (its key is a session's), so the chat does not wait for it."""
    app = ChatApp(
        ChatOptions(url="ws://127.0.0.1:9", token=""), Renderer(Screen().console), QueueReader()
    )
    app._conn = _Sent()  # type: ignore[assignment]
    await app.line("make it")
    assert app._awaited.waiting
    app.on_frame(LOST)
    assert not app._awaited.waiting and app._awaited.resend(SID) == []


@pytest.mark.parametrize("now_in", ["s-2", None], ids=["resumed", "new"])
async def test_a_message_to_a_session_the_chat_left_is_let_go_at_the_reconnect(
    now_in: str | None,
) -> None:
    """Sent to s-1 and unanswered when the chat moved to s-2 (or to a new session, not
    named yet), then the connection dropped: it is not sent again (its run would not be
    followed here), and no longer waited for (its ok cannot come now: the end of the
    input would wait for it for ever)."""
    app, conn = await _chat_with_a_run_going()
    await app.line("second")
    app.set_session(now_in)
    app.on_frame(LOST)
    assert app._awaited.waiting  # (sent to a session: kept to send again)
    again = app.on_frame(BACK) + app.resume()
    assert [f for f in again if f["type"] == "message"] == []
    assert not app._awaited.waiting


async def test_a_reconnect_to_a_session_where_nothing_went_on_ends_the_wait() -> None:
    app, _ = await _chat_with_a_run_going()
    frames = [_end(3, "the first answer"), LOST, BACK, _subscribed(3)]
    assert _running_after_each(app, frames) == [False, True, True, False]


async def test_a_resync_stops_the_following() -> None:
    """Frames are missing after a resync: a run's end may be among them, so the chat
    does not wait for it (what is going shows in the live frames)."""
    app, _ = await _chat_with_a_run_going()
    resync = {"type": "resync", "session_id": SID, "seq": 9, "epoch": "e2"}
    assert _running_after_each(app, [resync]) == [False]


@pytest.mark.parametrize("ok_last", [False, True], ids=["ok-first", "ok-last"])
async def test_end_of_input_waits_for_a_message_that_crossed_the_end_of_the_run_before(
    ok_last: bool,
) -> None:
    """Over a real connection: the second line goes out while the first run streams; the
    daemon ends that run, then takes the message, which runs at once, but only once the
    test lets it. Red before: the chat, at the end of its input, quit at the first run's
    end and never showed the second answer."""
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon, finish_runs_on_eof=True) as chat:
            daemon.ok_last = ok_last
            at_the_end = _entered(chat.app, "_wait_settled")  # the chat read the end of input
            await chat.screen.wait_for("connected to stand-in")
            chat.reader.type("cross")
            await chat.screen.wait_for("session s-1")
            daemon.hold = trio.Event()  # the next message's run (and ok) wait for the test
            chat.reader.type("and then?")
            chat.reader.press("eof")
            await daemon.wait_for("message", content="and then?")
            await chat.screen.wait_for("context 9 tokens")  # the first run's end is shown
            await at_the_end.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert not chat.app._quit.cancel_called  # still waiting for the second answer
            daemon.hold.set()
            await chat.screen.wait_for("you said: and then?")
            await chat.done.wait()
        assert chat.error is None


def _entered(app: ChatApp, name: str) -> trio.Event:
    """An event set when the app's method `name` is first called (it runs on as before)."""
    entered = trio.Event()
    method = getattr(app, name)

    async def wrapper() -> None:
        entered.set()
        await method()

    setattr(app, name, wrapper)
    return entered


async def test_quit_in_a_script_quits_at_once_while_a_run_goes() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon, finish_runs_on_eof=True) as chat:
            chat.reader.type("wait")  # a run that goes on until stopped
            chat.reader.type("/quit")
            await daemon.wait_for("message", content="wait")
            await chat.done.wait()
        assert chat.error is None and not daemon.sessions["s-1"].stop.is_set()
