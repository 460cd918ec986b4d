"""`navi chat`'s /rewind and /fork (and the double Esc) against the real daemon (issue 22).

The chat (`ChatApp`, a real `Connection` over a real WebSocket on 127.0.0.1) talks to
the daemon of tests/api_ws.py (real runtime, real SQLite, the fake LLM over HTTP); the
test types into a `QueueReader` and reads a recording console (tests/test_client_app.py).
A double Esc lists the messages, ``/rewind N`` previews, ``y`` applies (the removed
message comes back on the prompt), ``/rewind undo`` brings it all back, anything but
``y`` changes nothing, and ``/fork N files`` moves the chat to a new session with the
files as they were.

Rules: loopback only, port 0, nothing sleeps (the test waits for text on the screen),
an absolute deadline.
"""

from __future__ import annotations

from pathlib import Path

import trio
from api_ws import open_daemon
from rewind_kit import PROFILES, TIMEOUT, say, tree_of
from test_api_rewind import REPLIES
from test_client_app import Chat, PrefillReader, Screen

from navi_trio.client.app import ChatApp, ChatOptions
from navi_trio.client.render import Renderer


async def wait_count(screen: Screen, needle: str, n: int) -> None:
    """Until `needle` has been shown `n` times."""
    while screen.text.count(needle) < n:
        screen.changed = trio.Event()
        await screen.changed.wait()


async def test_rewind_from_the_chat_previews_applies_undoes_and_forks(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[*REPLIES, say("in the fork")],
                               profiles=PROFILES) as d:  # fmt: skip
            reader, screen = PrefillReader(), Screen()
            opts = ChatOptions(url=d.url, token=d.tokens["alice"], backoff=0)
            chat = Chat(ChatApp(opts, Renderer(screen.console), reader), reader, screen)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(chat.run)
                await screen.wait_for("connected to")
                reader.type("first")
                await screen.wait_for("one")
                sid = chat.app.session_id
                assert sid is not None
                folder = d.harness.runtime.settings.session_dir(sid)
                after_1 = tree_of(folder)
                reader.type("second")
                await screen.wait_for("two")
                actor = d.harness.runtime.sessions.actor(sid)
                assert actor is not None
                await actor.idle.wait()
                after_2 = tree_of(folder)
                # The chat's own view too: the daemon's run can be over while the chat has
                # not read its end yet (a loaded machine), and a double Esc during a run
                # only says "a run is active", with no list.
                await chat.app._wait_settled()

                reader.press("rewind")  # Esc Esc on an idle prompt: the list
                await screen.wait_for("/rewind N previews")
                assert "   1  m-" in screen.text and "   2  m-" in screen.text
                reader.type("/rewind 2")
                await screen.wait_for("apply it? (y/n)")
                assert "chat: 5 message(s) removed" in screen.text and "new.txt" in screen.text
                reader.type("n")  # no: nothing changes (another line would be a message)
                await screen.wait_for("rewind not applied")
                assert tree_of(folder) == after_2
                reader.type("/rewind 2")
                await wait_count(screen, "apply it? (y/n)", 2)
                reader.type("y")
                await screen.wait_for("rewound: 5 message(s) removed")
                assert tree_of(folder) == after_1
                assert reader.prefilled == ["second"]
                users = [m for m in await d.harness.runtime.store.load_messages(sid)
                         if m["role"] == "user"]  # fmt: skip
                assert [m["content"] for m in users] == ["first"]

                reader.type("/rewind undo")
                await wait_count(screen, "apply it? (y/n)", 3)
                reader.type("yes")
                await wait_count(screen, "rewound: ", 2)
                assert "0 message(s) removed, 5 brought back" in screen.text
                assert tree_of(folder) == after_2

                reader.type("/fork 2 files")
                await screen.wait_for("resumed session")
                new = chat.app.session_id
                assert new is not None and new != sid
                assert tree_of(d.harness.runtime.settings.session_dir(new)) == after_1
                reader.type("in the new one")
                await screen.wait_for("in the fork")
                forked = await d.harness.runtime.store.load_messages(new)
                assert [m["content"] for m in forked if m["role"] == "user"] == [
                    "first",
                    "in the new one",
                ]
                reader.type("/quit")
                await chat.done.wait()
            assert chat.error is None
