"""A run's roots are resolved once and then held: swapping a folder for a symlink after
its check leads nowhere (issue 28, items 1 and 2).

Through a real ``navi serve`` with two users (tests/served.py, forked: the users written
to its database, the daemon forked from the warm fork server, since none of these tests
is about how a command or the daemon starts), the fake LLM scripted for each step,
terminal commands in the real bwrap sandbox:

- a cwd checked when its message arrives and swapped for a link before the queued run
  starts: the run's commands and its filesystem tool write nothing through the link;
- with `workspace_roots`, a folder one session works in swapped by another session
  while the first one runs: its next calls refuse, naming the folder;
- a rewind after the cwd was swapped for a link to a folder of someone else's: nothing
  there is deleted or overwritten; the rewind is refused, naming the folder;
- a cwd naming another of the user's own session folders is refused at the message.

The victim folder is world-writable, so that what keeps a write out is the held root,
never the uid the commands run as. Each test has an absolute time limit; nothing sleeps:
a command waits on a FIFO the test writes once the moment has come.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client
from rewind_kit import call, calls, run, say, write
from served import Served, outside_tmp, results, send, served

from navi_trio.tools.sandbox import sandbox_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox_available()[0], reason="the sandbox is unavailable here"),
]
TIMEOUT = 180  # real seconds: two Python processes start on 2 busy cores


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder outside /tmp, removed afterwards; open to others (a root daemon's
    commands run as nobody, and a workspace is open to them)."""
    with outside_tmp("navi-roots-") as folder:
        yield folder


def victim(base: Path) -> Path:
    """A folder of someone else's, world-writable, with a file in it."""
    folder = base / "victim"
    folder.mkdir()
    folder.chmod(0o777)
    (folder / "keep.txt").write_text("the victim's own\n")
    (folder / "keep.txt").chmod(0o666)
    return folder


class Gate:
    """A FIFO a command waits on (``head -c1 gate``) until `open` writes a byte. The test
    keeps its own end open until the command read it, so the byte cannot be lost."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path, 0o666)
        path.chmod(0o666)
        self.path = path
        self.fd: int | None = None

    def open(self, path: Path | None = None) -> None:
        # O_RDWR never blocks on a FIFO, and keeps it alive while nobody reads yet.
        self.fd = os.open(path or self.path, os.O_RDWR | os.O_NONBLOCK)
        os.write(self.fd, b"g")

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


async def tool_started(client: Client, sid: str, command: str) -> None:
    await client.until(
        lambda f: (
            f["type"] == "tool_started"
            and f.get("session_id") == sid
            and f["arguments"].get("command") == command
        )
    )


async def turn(
    s: Served,
    client: Client,
    replies: list[dict[str, Any]],
    text: str,
    sid: str | None = None,
    **fields: Any,
) -> str:
    """One message whose run the model answers with `replies`; its session, once done."""
    s.fake.add_replies(*replies)
    session = str((await send(client, text, sid, **fields))["session_id"])
    await client.until_end(session)
    return session


def failed_naming(result: dict[str, Any], folder: Path) -> bool:
    return not result["ok"] and str(folder) in (result["error"] or "")


async def test_a_cwd_swapped_for_a_link_while_its_message_waits_is_never_followed(
    base: Path,
) -> None:
    target = victim(base)
    async with served(base, forked=True) as s:
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice:
                sid = await turn(s, alice, [calls(run("mkdir -p sub")), say("made")], "make sub")
                folder = s.session_dir(sid)
                gate = Gate(folder / "gate")
                swap = f"mv sub sub.old && ln -s {target} sub"
                s.fake.add_replies(
                    calls(run("head -c1 gate")), calls(run(swap)), say("swapped"),
                    calls(run("echo PWNED > h1-term.txt")),
                    calls(write("h1-fs.txt", "PWNED")),
                    calls(call("filesystem", action="list", path=".")),
                    say("done"),
                )  # fmt: skip
                await send(alice, "wait, then swap", sid)
                await tool_started(alice, sid, "head -c1 gate")
                # The check passes now: sub is a real folder of the session.
                queued = await send(alice, "work in sub", sid, cwd=str(folder / "sub"))
                assert queued["queued"] is True, queued
                try:
                    gate.open()
                    await alice.until_end(sid)  # the swapping run
                    await alice.until_end(sid)  # the queued run, in the swapped cwd
                finally:
                    gate.close()
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]
    assert (target / "keep.txt").read_text() == "the victim's own\n"
    assert not list((folder / "sub.old").iterdir())  # nothing went to the moved folder
    echo, fs_write, listing = results(alice, sid)[-3:]
    for result in (echo, fs_write, listing):
        assert failed_naming(result, folder / "sub"), result
        assert "symlink" in result["error"], result
    assert str(target) not in listing["output"] + (listing["error"] or "")
    warnings = [f for f in alice.frames if f["type"] == "warning"]
    assert any(w["code"] == "root_unusable" for w in warnings), warnings


async def test_a_workspace_folder_swapped_by_another_session_mid_run_refuses_the_next_calls(
    base: Path,
) -> None:
    target = victim(base)
    ws = base / "ws"
    sub = ws / "proj" / "sub"
    sub.mkdir(parents=True)
    for folder in (ws, ws / "proj", sub):
        folder.chmod(0o777)
    gate = Gate(sub / "gate")
    async with served(base, roots={"user": [str(ws)]}, forked=True) as s:
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice, s.connect("bob") as bob:
                s.fake.add_replies(calls(run("head -c1 gate")))
                sid = str((await send(alice, "work in sub", cwd=str(sub)))["session_id"])
                await tool_started(alice, sid, "head -c1 gate")
                # Bob, in the project folder above, swaps alice's working folder.
                s.fake.add_replies(calls(run(f"mv sub sub.old && ln -s {target} sub")), say("ok"))
                other = str((await send(bob, "swap it", cwd=str(ws / "proj")))["session_id"])
                await bob.until_end(other)
                assert results(bob, other)[-1]["ok"], results(bob, other)
                assert (ws / "proj" / "sub").is_symlink()
                s.fake.add_replies(
                    calls(run("echo PWNED > h2-term.txt")),
                    calls(write("h2-fs.txt", "PWNED")),
                    calls(write(str(sub / "h2-abs.txt"), "PWNED")),
                    say("done"),
                )
                try:
                    gate.open(ws / "proj" / "sub.old" / "gate")
                    await alice.until_end(sid)
                finally:
                    gate.close()
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]
    moved = ws / "proj" / "sub.old"
    assert sorted(p.name for p in moved.iterdir()) == ["gate"]
    for result in results(alice, sid)[-3:]:
        assert failed_naming(result, sub), result
        assert f"that folder is now {moved}" in result["error"], result


async def test_a_rewind_after_the_cwd_became_a_link_touches_nothing_behind_it(
    base: Path,
) -> None:
    target = victim(base)
    (target / "sub").mkdir()
    (target / "sub" / "deep.txt").write_text("deep\n")
    before = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
    async with served(base, forked=True) as s:
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice:
                sid = await turn(s, alice, [calls(run("mkdir -p sub")), say("made")], "make sub")
                folder = s.session_dir(sid)
                written = [calls(write("notes.txt", "v1\n")), say("written")]
                await turn(s, alice, written, "M1", sid, cwd=str(folder / "sub"))
                swap = f"mv sub sub.old && ln -s {target} sub"
                await turn(s, alice, [calls(run(swap)), say("swapped")], "M2", sid)
                listed = await alice.request({"type": "checkpoints", "session_id": sid})
                m1 = next(m for m in listed["messages"] if m["text"] == "M1")
                assert m1["checkpoint"], listed
                ask = {"type": "rewind", "session_id": sid, "to": m1["message_id"],
                       "restore": "files"}  # fmt: skip
                preview = await alice.request(ask)
                assert preview["type"] == "error", preview
                assert str(folder / "sub") in preview["message"], preview
                assert "symlink" in preview["message"], preview
                # A token of an earlier preview cannot force it either.
                forced = await alice.request({**ask, "confirm": "x" * 64})
                assert forced["type"] == "error", forced
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == before
    assert (target / "keep.txt").read_text() == "the victim's own\n"
    assert (folder / "sub.old" / "notes.txt").read_text() == "v1\n"


async def test_another_of_ones_own_session_folders_is_refused_as_a_cwd(base: Path) -> None:
    async with served(base, forked=True) as s:
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice, s.connect("bob") as bob:
                first = await turn(s, alice, [say("one")], "first")
                second = await turn(s, alice, [say("two")], "second")
                (s.session_dir(first) / "sub").mkdir(parents=True)
                for cwd in (s.session_dir(first), s.session_dir(first) / "sub"):
                    refused = await alice.request(
                        {"type": "message", "content": "x", "session_id": second,
                         "cwd": str(cwd)}
                    )  # fmt: skip
                    assert refused["code"] == "forbidden", refused
                    assert f"your session {first!r}, not of this one" in refused["message"]
                refused = await bob.request(
                    {"type": "message", "content": "x", "cwd": str(s.session_dir(first))}
                )
                assert refused["code"] == "forbidden" and "not yours" in refused["message"]
                # Its own folder stays a cwd.
                await turn(
                    s, alice, [say("three")], "third", second, cwd=str(s.session_dir(second))
                )


# -- what stays hidden whatever the folders become ---------------------------------------


async def test_a_workspace_root_turned_into_a_link_to_slash_opens_nothing(base: Path) -> None:
    ws, linked, outside = base / "ws", base / "linked", base / "outside"
    for folder in (ws / "proj", linked, outside):
        folder.mkdir(parents=True)
    async with served(base, roots={"user": [str(ws), str(linked)]}, forked=True) as s:
        linked.rmdir()
        linked.symlink_to("/")  # after the config was loaded and checked
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice:
                for cwd in (outside, Path("/var/tmp"), Path("/etc"), linked / "etc"):
                    refused = await alice.request(
                        {"type": "message", "content": "x", "cwd": str(cwd)}
                    )
                    assert refused["code"] == "forbidden", (cwd, refused)
                await turn(s, alice, [say("fine")], "in proj", cwd=str(ws / "proj"))


async def test_a_workspace_root_replaced_by_another_folder_opens_nothing(base: Path) -> None:
    # A root is the folder found when the config took effect: another folder made at its
    # path since (the first one moved away) is not it, and nothing in it is a cwd.
    ws = base / "ws"
    (ws / "proj").mkdir(parents=True)
    async with served(base, roots={"user": [str(ws)]}) as s:
        ws.rename(base / "ws.old")
        (ws / "proj").mkdir(parents=True)
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice:
                for cwd in (ws, ws / "proj"):
                    refused = await alice.request(
                        {"type": "message", "content": "x", "cwd": str(cwd)}
                    )
                    assert refused["code"] == "forbidden", (cwd, refused)


async def test_a_nested_workspace_root_swapped_from_its_parent_root_opens_nothing(
    base: Path,
) -> None:
    """A root inside another one: a run in the outer root swaps the inner one for a link
    to a folder of someone else's, which must not become a root with it."""
    target = victim(base)
    ws = base / "ws"
    (ws / "inner").mkdir(parents=True)
    for folder in (ws, ws / "inner"):
        folder.chmod(0o777)
    async with served(base, roots={"user": [str(ws), str(ws / "inner")]}, forked=True) as s:
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice:
                swap = f"mv inner inner.old && ln -s {target} inner"
                await turn(s, alice, [calls(run(swap)), say("swapped")], "swap", cwd=str(ws))
                assert (ws / "inner").is_symlink()
                for cwd in (target, ws / "inner"):
                    refused = await alice.request(
                        {"type": "message", "content": "x", "cwd": str(cwd)}
                    )
                    assert refused["code"] == "forbidden", (cwd, refused)
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]


async def test_the_user_config_folder_stays_hidden_when_the_config_lives_elsewhere(
    base: Path,
) -> None:
    xdg = base / "xdg"
    (xdg / "navi").mkdir(parents=True)
    (xdg / "navi" / "secret.json").write_text('{"token": "TOPSECRET"}')
    secret = xdg / "navi" / "secret.json"
    env = {"XDG_CONFIG_HOME": str(xdg)}
    async with served(base, roots={"user": [str(base)]}, env=env, forked=True) as s:
        assert not str(s.data_dir).startswith(str(xdg))  # the config folder: base/config
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice:
                s.fake.add_replies(
                    calls(call("filesystem", action="read", path="xdg/navi/secret.json")),
                    calls(call("filesystem", action="list", path="xdg/navi")),
                    calls(run(f"cat {secret} xdg/navi/secret.json; ls -a xdg/navi")),
                    say("done"),
                )
                sid = str((await send(alice, "look", cwd=str(base)))["session_id"])
                await alice.until_end(sid)
    read, listing, cat = results(alice, sid)[-3:]
    assert not read["ok"] and "navi's own data" in read["error"], read
    assert not listing["ok"] and "navi's own data" in listing["error"], listing
    # An empty folder over it: the file is not there at all.
    assert "No such file" in cat["output"] and "\n.\n..\n" in cat["output"], cat
    assert "TOPSECRET" not in json.dumps(alice.frames)


async def test_a_session_folder_turned_into_a_link_to_the_data_folder_shows_nothing_of_it(
    base: Path,
) -> None:
    async with served(base, forked=True) as s:
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice:
                sid = await turn(s, alice, [say("one")], "first")
                folder = s.session_dir(sid)
                shutil.rmtree(folder, ignore_errors=True)
                folder.parent.mkdir(parents=True, exist_ok=True)
                folder.symlink_to(s.data_dir)
                token = (s.data_dir / "local-token").read_text().strip()
                s.fake.add_replies(
                    calls(call("filesystem", action="list", path=".", recursive=True)),
                    calls(call("filesystem", action="read", path="local-token")),
                    calls(run("ls -aR; cat local-token")),
                    say("done"),
                )
                await send(alice, "look around", sid)
                await alice.until_end(sid)
    for result in results(alice, sid)[-3:]:
        assert not result["ok"] and str(folder) in result["error"], result
        assert "symlink" in result["error"], result
    assert token not in json.dumps(alice.frames)
    shown = json.dumps(results(alice, sid))  # the calls named local-token: not their results
    assert "local-token" not in shown and "checkpoints" not in shown
