"""A files rewind through a real ``navi serve`` keeps what the person made by hand.

A user (written to the daemon's database as ``navi users add`` writes one) works in a
folder of their `workspace_roots`; the fake LLM is scripted to write files with the
filesystem tool and with `terminal` commands (in the real bwrap sandbox, as the tool
user: the daemon runs as root here); between the turns the test writes files straight
into the folder, as an editor would.
Rewinding the files to before both turns then undoes navi's changes only: the files
made by hand survive, and the file navi wrote and the person edited after is a
conflict, kept as the person left it. The conflict is shown in the WebSocket preview
frame, in `navi rewind`'s preview (a process of its own, forked as the daemon is from
the tests' warm fork server: tests/navi_forks.py), and in `navi chat`'s ``/rewind``
preview (the chat app on a real connection); ``--force`` restores it.

Real time (real processes): every test has an absolute limit; nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client
from reliability import clean_env
from rewind_kit import calls, run, say, write
from served import Served, outside_tmp, send, served
from test_cli import forked
from test_client_app import Chat, PrefillReader, Screen

from navi_trio.client.app import ChatApp, ChatOptions
from navi_trio.client.render import Renderer
from navi_trio.tools.sandbox import sandbox_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox_available()[0], reason="the sandbox is unavailable here"),
]
TIMEOUT = 240  # real seconds: Python processes start on 2 busy cores


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder outside /tmp (the sandbox's /tmp is private), open to the tool user."""
    with outside_tmp("navi-rewind-") as folder:
        yield folder


async def turn(s: Served, client: Client, replies: list[dict[str, Any]], text: str,
               sid: str | None = None, **fields: Any) -> str:  # fmt: skip
    s.fake.add_replies(*replies)
    session = str((await send(client, text, sid, **fields))["session_id"])
    await client.until_end(session)
    await client.idle(session)
    return session


async def test_a_files_rewind_keeps_the_persons_files_and_shows_the_conflict_everywhere(
    base: Path,
) -> None:
    ws = base / "ws"
    proj = ws / "proj"
    proj.mkdir(parents=True)
    for folder in (ws, proj):
        folder.chmod(0o777)
    (proj / "a.txt").write_text("a, before navi\n")
    (proj / "a.txt").chmod(0o666)
    async with served(base, users=("alice",), roots={"user": [str(ws)]}, forked=True) as s:
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice:
                sid = await turn(s, alice, [
                    calls(write("a.txt", "a, by navi\n")),
                    calls(run("mkdir -p out && echo built > out/app.log")),
                    say("one"),
                ], "first", cwd=str(proj))  # fmt: skip
                (proj / "budget.json").write_text('{"rent": 900}\n')  # by hand, in an editor
                await turn(s, alice, [
                    calls(write("notes.md", "navi's notes\n")),
                    calls(run("mv a.txt a-renamed.txt && echo more >> out/app.log")),
                    say("two"),
                ], "second", sid, cwd=str(proj))  # fmt: skip
                (proj / "web-replies.json").write_text("[]\n")
                (proj / "notes.md").write_text("navi's notes, and mine\n")
                (proj / "out" / "mine.txt").write_text("mine\n")
                listed = await alice.request({"type": "checkpoints", "session_id": sid})
                first = next(m for m in listed["messages"] if m["text"] == "first")
                ask = {"type": "rewind", "session_id": sid, "to": first["message_id"],
                       "restore": "files"}  # fmt: skip

                # The WebSocket preview frame.
                preview = await alice.request(ask)
                assert preview["action"] == "preview", preview
                assert preview["conflicts"] == "keep"
                (root,) = [r for r in preview["files"]["roots"] if r["root"] == str(proj)]
                assert root["conflicts"] == ["notes.md"], root
                assert {"budget.json", "web-replies.json", "out/mine.txt"} <= set(root["others"])
                changed = {c["path"]: c["what"] for c in root["changes"]}
                assert changed.get("a.txt") == "created" and "a-renamed.txt" in changed
                assert "budget.json" not in changed and "notes.md" not in changed

                # `navi rewind` (no terminal, no --yes: the preview only).
                environ = clean_env(base / "cli")
                args = ("rewind", "--session", sid, "--to", "1", "--restore", "files",
                        "--url", s.daemon.url, "--token", s.tokens["alice"])  # fmt: skip
                done = await forked(*args, env=environ, cwd=base)
                assert done.code == 0, done.err
                assert "1 conflict(s), changed by navi and by someone else" in done.out, done.out
                assert "kept as they are now; --force restores them too" in done.out
                assert "notes.md" in done.out and "budget.json" in done.out
                assert "nothing was changed" in done.out

                # `navi chat`'s /rewind.
                await chat_preview(s, sid)

                # Applied with the default: the person's files all stay.
                applied = await alice.request({**ask, "confirm": preview["token"]})
                assert applied["action"] == "done", applied
                assert (proj / "a.txt").read_text() == "a, before navi\n"
                assert not (proj / "a-renamed.txt").exists()
                assert not (proj / "out" / "app.log").exists()
                assert (proj / "budget.json").read_text() == '{"rent": 900}\n'
                assert (proj / "web-replies.json").read_text() == "[]\n"
                assert (proj / "notes.md").read_text() == "navi's notes, and mine\n"
                assert (proj / "out" / "mine.txt").read_text() == "mine\n"

                # Undone, then again with --force: the conflict goes back too.
                undo = {"type": "rewind", "session_id": sid, "branch": applied["undo"],
                        "restore": "files"}  # fmt: skip
                back = await alice.request(undo)
                await alice.request({**undo, "confirm": back["token"]})
                assert (proj / "a-renamed.txt").exists() and not (proj / "a.txt").exists()
                forced = await forked(*args, "--force", "--yes", env=environ, cwd=base)
                assert forced.code == 0, forced.err
                assert "restored too, as asked" in forced.out, forced.out
                assert not (proj / "notes.md").exists()
                assert (proj / "budget.json").exists() and (proj / "out" / "mine.txt").exists()


async def chat_preview(s: Served, sid: str) -> None:
    """`navi chat` on the session: ``/rewind 1 files`` shows the conflict; ``n`` keeps
    everything as it is."""
    reader, screen = PrefillReader(), Screen()
    opts = ChatOptions(url=s.daemon.url, token=s.tokens["alice"], session_id=sid, backoff=0)
    chat = Chat(ChatApp(opts, Renderer(screen.console), reader), reader, screen)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(chat.run)
        await screen.wait_for(f"resumed session {sid}")
        reader.type("/rewind 1 files")
        await screen.wait_for("apply it? (y/n)")
        text = screen.text
        assert "1 conflict(s), changed by navi and by someone else since" in text, text
        assert "add force (/rewind N files force) to restore them too" in text, text
        assert "notes.md" in text and "web-replies.json" in text, text
        reader.type("n")
        await screen.wait_for("rewind not applied")
        reader.press("eof")
        await chat.done.wait()
        nursery.cancel_scope.cancel()
