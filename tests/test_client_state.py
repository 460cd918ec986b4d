"""What a typed line and a frame do to the chat's state (client/app.py, commands.py),
in-process: the chat's connection is a list of the frames it sends (`_Sent`), the
daemon's answers are fed to `ChatApp.on_frame`. The last test runs over a real
connection to the stand-in daemon, as those of tests/test_client_app.py do.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from test_client_app import DEADLINE, PrefillReader, Screen, _Sent, chatting, standin

from navi_trio.client.app import ChatApp, ChatOptions
from navi_trio.client.render import Renderer

SID = "s-1"


def chat() -> tuple[ChatApp, _Sent, Screen]:
    screen = Screen()
    app = ChatApp(
        ChatOptions(url="ws://127.0.0.1:9", token=""), Renderer(screen.console), PrefillReader()
    )
    conn = _Sent()
    app._conn = conn  # type: ignore[assignment]
    app.set_session(SID)
    return app, conn, screen


def frame(seq: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "session_id": SID, "seq": seq, "epoch": "e1", "is_subagent": False,
            **fields}  # fmt: skip


async def test_y_with_no_approval_waiting_is_a_message() -> None:
    app, conn, _ = chat()
    await app.line("y")
    (sent,) = conn.frames
    assert (sent["type"], sent["content"]) == ("message", "y")


async def test_new_leaves_the_session_and_forgets_where_its_stream_was() -> None:
    app, conn, _ = chat()
    app.on_frame(frame(5, "text_delta", text="hello"))
    assert (app.last_seq, app.epoch) == (5, "e1")
    await app.line("/new")
    assert conn.frames[-1] == {"type": "unsubscribe", "session_id": SID}
    assert (app.session_id, app.last_seq, app.epoch) == (None, None, None)
    app.set_session("s-2")
    assert app.resume()[0] == {"type": "subscribe", "session_id": "s-2", "last_seq": None}


async def test_a_schedule_without_a_text_is_refused_and_nothing_is_sent() -> None:
    app, conn, screen = chat()
    await app.line("/schedule every 10m")
    assert conn.frames == []
    assert "/schedule every 10m TEXT" in screen.text
    await app.line("/schedule every 10m look")
    assert (conn.frames[-1]["every"], conn.frames[-1]["message"]) == ("10m", "look")


async def test_a_resync_says_where_the_stream_goes_on_and_the_history_is_asked_again() -> None:
    app, _, _ = chat()
    app.on_frame(frame(5, "text_delta", text="hello"))
    replies = app.on_frame({"type": "resync", "session_id": SID, "seq": 9, "epoch": "e2"})
    assert replies == [{"type": "sessions", "action": "history", "session_id": SID}]
    assert (app.last_seq, app.epoch) == (9, "e2")


async def test_each_run_end_counts_the_queue_down_and_the_last_leaves_the_chat_idle() -> None:
    app, _, _ = chat()
    app.on_frame(frame(1, "text_delta", text="the running turn"))
    app.on_frame(frame(2, "message_queued", text="next", position=1))
    app.on_frame(frame(3, "stream_end", text="the running turn"))
    assert app.renderer.busy  # the queued message runs now
    app.on_frame(frame(4, "stream_end", text="next's answer"))
    assert not app.renderer.busy


async def test_one_ctrl_c_on_an_idle_prompt_only_warns() -> None:
    app, _, screen = chat()
    await app.interrupt()
    assert "press Ctrl+C again" in screen.text and not app._quit.cancel_called
    await app.interrupt()
    assert app._quit.cancel_called


async def test_a_drop_says_how_many_messages_had_no_answer() -> None:
    app, _, screen = chat()
    await app.line("hello")
    app.on_frame({"type": "_disconnected", "reason": "gone", "retry_in": 0, "attempt": 1})
    assert "1 message(s) sent had no answer yet" in screen.text


async def test_a_resumed_subscribe_at_the_seq_already_seen_needs_no_catching_up() -> None:
    """Back after a drop: the subscribe's ok names the session's seq; at the one the
    chat saw last, nothing is to be replayed, so nothing is waited for."""
    app, _, _ = chat()
    app.on_frame(frame(3, "stream_end", text="done"))
    app.on_frame({"type": "_disconnected", "reason": "gone", "retry_in": 0, "attempt": 1})
    app.on_frame({"type": "_reconnected", "welcome": {}})
    assert app._running()  # until the subscribe's reply
    app.on_frame({"type": "ok", "session_id": SID, "seq": 3, "approvals": []})
    assert not app._running()


async def test_an_approval_request_shown_from_the_subscribe_reply_is_not_shown_again() -> None:
    """Back after a drop: the subscribe's ok lists the requests waiting (shown as cards),
    and the replay after it carries the same request: one card."""
    app, _, screen = chat()
    request = {"type": "approval_request", "session_id": SID, "call_id": "c9",
               "tool": "terminal", "summary": "terminal run: git push origin main",
               "timeout_sec": 300}  # fmt: skip
    app.on_frame({"type": "ok", "session_id": SID, "seq": 4, "approvals": [request]})
    app.on_frame({**request, "seq": 4, "epoch": "e1", "is_subagent": False})
    assert screen.text.count("git push origin main") == 1


async def test_a_line_typed_before_the_new_session_is_named_goes_to_that_session() -> None:
    app, conn, _ = chat()
    app.set_session(None)
    with trio.fail_after(DEADLINE):
        await app.line("one")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(app.line, "two")
            await trio.testing.wait_all_tasks_blocked()
            assert len(conn.frames) == 1  # "two" waits for the session "one" makes
            app.on_frame({"type": "session", "session_id": "s-9", "created": True})
    assert [(f["content"], f.get("session_id")) for f in conn.frames] == [
        ("one", None),
        ("two", "s-9"),
    ]


async def test_each_drop_gets_the_whole_count_of_reconnects_once_one_worked() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon, retries=1) as chat:
            await chat.screen.wait_for("connected")
            for n in (1, 2, 3):  # one try each time, and each one works
                await daemon.drop()
                while chat.screen.text.count("reconnected") < n:
                    chat.screen.changed = trio.Event()
                    await chat.screen.changed.wait()
            chat.reader.type("/quit")
        assert chat.error is None


async def test_a_frame_the_chat_cannot_read_is_shown_and_the_chat_goes_on() -> None:
    with trio.fail_after(DEADLINE):
        async with standin() as daemon, chatting(daemon) as chat:
            await chat.screen.wait_for("connected")
            for ws in daemon.connections:
                await ws.send_message("{not json")
            await chat.screen.wait_for("the server sent a frame that is not JSON")
            chat.reader.type("still here")
            await chat.screen.wait_for("you said: still here")
            chat.reader.type("/quit")
        assert chat.error is None


# -- /rewind in the chat: the daemon's replies fed as they come ---------------------------


def listed(*ids: str, more: int = 0, branches: tuple[str, ...] = ()) -> dict[str, Any]:
    """The daemon's ``checkpoints`` reply: the messages listed (the newest `len(ids)`,
    `more` older ones left out) and the branches a rewind made."""
    return {"type": "checkpoints", "session_id": SID, "more_messages": more,
            "messages": [{"message_id": i} for i in ids],
            "branches": [{"branch_id": b} for b in branches]}  # fmt: skip


def preview(text: str = "", **fields: Any) -> dict[str, Any]:
    return {"type": "rewind", "session_id": SID, "action": "preview", "token": "tk",
            "restore": "both", "text": text, "files": {"roots": []}, **fields}  # fmt: skip


async def asked(app: ChatApp, line: str, reply: dict[str, Any]) -> list[dict[str, Any]]:
    """`line` typed (a /rewind): what the chat sends once the list `reply` comes."""
    await app.line(line)
    return app.on_frame(reply)


async def test_a_rewinds_number_counts_the_older_messages_left_out_of_the_list() -> None:
    app, _, _ = chat()
    (sent,) = await asked(app, "/rewind 3", listed("m-3", "m-4", more=2))
    assert (sent["type"], sent["to"], sent["restore"]) == ("rewind", "m-3", "both")
    (sent,) = await asked(app, "/rewind -1", listed("m-3", "m-4", more=2))
    assert sent["to"] == "m-4"


async def test_undo_brings_back_the_newest_branch() -> None:
    app, _, _ = chat()
    (sent,) = await asked(app, "/rewind undo", listed("m-1", branches=("b-1", "b-2")))
    assert sent["branch"] == "b-2"


async def test_a_list_of_another_session_is_not_acted_on() -> None:
    app, _, _ = chat()
    await app.line("/rewind 1")
    assert app.on_frame({**listed("m-9"), "session_id": "s-other"}) == []
    assert app.rewinds.waiting


async def test_only_y_or_yes_applies_a_rewind_another_line_is_a_message() -> None:
    app, conn, screen = chat()
    await asked(app, "/rewind 1", listed("m-1"))
    app.on_frame(preview("the message"))
    await app.line("maybe")
    assert "rewind not applied" in screen.text
    assert [f["type"] for f in conn.frames][-1] == "message"
    assert not any("confirm" in f for f in conn.frames)


async def test_only_a_rewind_to_a_message_puts_the_removed_message_back_on_the_prompt() -> None:
    app, _, _ = chat()
    reader = app.reader
    assert isinstance(reader, PrefillReader)
    await asked(app, "/rewind undo", listed("m-1", branches=("b-1",)))
    app.on_frame(preview("from the preview"))
    await app.line("y")
    app.on_frame({"type": "rewind", "session_id": SID, "action": "done", "messages_removed": 1,
                  "messages_restored": 2, "branch": "b-1"})  # fmt: skip
    assert reader.prefilled == []  # an undo: nothing of ours to send again
    await asked(app, "/rewind 1", listed("m-1"))
    app.on_frame(preview("second"))
    await app.line("y")
    app.on_frame({"type": "rewind", "session_id": SID, "action": "done", "messages_removed": 1,
                  "to": "m-1"})  # fmt: skip
    assert reader.prefilled == ["second"]
