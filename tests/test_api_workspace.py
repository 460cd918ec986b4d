"""The ``folders`` and ``changes`` frames over a real WebSocket.

``folders`` lists only what the sender could send as a message's cwd: the role's
`workspace_roots`, their real sub-folders (never a symlink, never navi's data), the
session's own folder, the folders last used; a folder outside the roots, a link swapped
in to one outside, ``/`` and another user's session are refused as a cwd would be.
``changes`` gives what a session's tools changed since a message as difflib diffs, a
filesystem edit and a terminal ``sed -i`` alike, a binary file named and not shown,
and only to the session's owner.

Rules: as tests/test_api_rewind.py (loopback, port 0, real SQLite, the fake LLM over
real HTTP, an absolute timeout on every test, no sleeps).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client, open_daemon
from rewind_kit import PROFILES, TIMEOUT, call, calls, run, say, write
from test_rewind_asker import config_at, idle

from navi_trio.core.checkpoints import ChangedFile
from navi_trio.core.history.changes import DIFF_MAX_BYTES, FILES_MAX, TOTAL_MAX_BYTES, diffs
from navi_trio.core.turn import FOLDERS_MAX


async def message(c: Client, text: str, cwd: Path | None = None, **extra: Any) -> str:
    frame: dict[str, Any] = {"type": "message", "content": text, **extra}
    if cwd is not None:
        frame["cwd"] = str(cwd)
    reply = await c.request(frame)
    if reply["type"] == "session":
        reply = await c.until(lambda f: f.get("id") == reply.get("id") and f["type"] != "session")
    assert reply["type"] == "ok", reply
    session = str(reply["session_id"])
    await c.until_end(session)
    return session


def projects_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace root with folders (one named with markup), a file, a link to a
    folder outside; and that outside folder."""
    projects = (tmp_path / "projects").resolve()
    (projects / "app").mkdir(parents=True)
    (projects / "<b>x<b>").mkdir()
    (projects / ".hidden").mkdir()
    (projects / "file.txt").write_text("not a folder\n")
    outside = (tmp_path / "outside").resolve()
    (outside / "secret").mkdir(parents=True)
    (projects / "link").symlink_to(outside)
    return projects, outside


async def test_folders_lists_only_what_may_be_a_cwd_and_the_last_used(tmp_path: Path) -> None:
    projects, outside = projects_tree(tmp_path)
    source = config_at(tmp_path / "config" / "config.json", [str(projects)])
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[say("ok")], config=source) as d:
            async with d.connect("alice") as alice:
                start = await alice.request({"type": "folders"})
                assert start["type"] == "folders", start
                assert start["starts"] == [str(projects)] and start["recent"] == []
                listed = await alice.request({"type": "folders", "path": str(projects)})
                # Real sub-folders only: no file, no link (it leads outside), markup as is.
                assert listed["folders"] == ["<b>x<b>", "app", ".hidden"], listed
                assert listed["path"] == str(projects) and listed["parent"] is None
                inner = await alice.request({"type": "folders", "path": str(projects / "app")})
                assert inner["parent"] == str(projects) and inner["folders"] == []
                bad = await alice.request({"type": "folders", "path": "projects"})
                assert bad["type"] == "error" and bad["code"] == "bad_frame", bad
                for refused in (outside, projects / "link", Path("/")):
                    no = await alice.request({"type": "folders", "path": str(refused)})
                    assert no["type"] == "error" and no["code"] == "forbidden", (refused, no)
                # A folder worked in is offered again, newest first.
                sid = await message(alice, "hi", projects / "app")
                start = await alice.request({"type": "folders", "session_id": sid})
                assert start["recent"] == [str(projects / "app")], start
                own = d.harness.runtime.settings.session_dir(sid).resolve()
                assert start["session_folder"] == str(own)
                assert start["starts"] == [str(projects), str(own)]
                # A folder no longer granted is not offered again.
                config_at(tmp_path / "config" / "config.json", [str(outside)])
                assert source.reload()
                start = await alice.request({"type": "folders"})
                assert start["recent"] == [] and start["starts"] == [str(outside)], start
            async with d.connect("bob") as bob:
                theirs = await bob.request({"type": "folders", "session_id": sid})
                assert theirs["type"] == "error" and theirs["code"] == "forbidden", theirs
                # Another user's session folder is never listed, even by its path.
                no = await bob.request({"type": "folders", "path": str(own)})
                assert no["type"] == "error" and no["code"] == "forbidden", no


async def test_folders_is_bounded_and_never_lists_navis_data(tmp_path: Path) -> None:
    projects, _ = projects_tree(tmp_path)
    many = projects / "many"
    for i in range(FOLDERS_MAX + 7):
        (many / f"d{i:04}").mkdir(parents=True)
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[say("ok")]) as d:
            data = d.harness.runtime.settings.data_dir.resolve()
            os.symlink(data, projects / "data-link")
            async with d.connect("root") as admin:
                listed = await admin.request({"type": "folders", "path": str(many)})
                assert len(listed["folders"]) == FOLDERS_MAX and listed["more"] == 7
                # The data folder itself, and a folder holding it, list no private part.
                up = await admin.request({"type": "folders", "path": str(data.parent)})
                assert data.name not in up["folders"], up
                inside = await admin.request({"type": "folders", "path": str(data)})
                assert inside["type"] == "error" and inside["code"] == "forbidden", inside


EDITS = [
    calls(write("notes.txt", "one\ntwo\nthree\n"), write("blob.bin", "x\u0000y")),
    say("made"),
    calls(call("filesystem", action="edit", path="notes.txt", old="two", new="TWO")),
    calls(run("sed -i s/three/3/ notes.txt && printf 'x\\0z' > blob.bin")),
    calls(write("<i>page<i>.txt", "<script>alert(1)</script>\n")),
    say("edited"),
]


@pytest.mark.slow  # the terminal's command runs in bwrap
async def test_changes_are_diffs_of_a_filesystem_edit_and_a_terminal_sed(tmp_path: Path) -> None:
    work = (tmp_path / "work").resolve()
    work.mkdir()
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=EDITS, profiles=PROFILES) as d:
            async with d.connect("root") as admin:
                sid = await message(admin, "make", work, mode="full")
                await message(admin, "edit", work, mode="full", session_id=sid)
                await idle(d, sid)
                listed = await admin.request({"type": "checkpoints", "session_id": sid})
                first, second = (m["message_id"] for m in listed["messages"])
                got = await admin.request({"type": "changes", "session_id": sid, "since": second})
                assert got["type"] == "changes" and got["since"] == second, got
                files = {f["path"]: f for f in got["files"]}
                assert set(files) == {"notes.txt", "blob.bin", "<i>page<i>.txt"}, files
                notes = files["notes.txt"]
                assert notes["what"] == "modified" and notes["root"] == str(work)
                lines = notes["diff"].splitlines()
                assert lines[:2] == ["--- a/notes.txt", "+++ b/notes.txt"], lines
                # The filesystem edit and the terminal's sed -i, in one diff.
                assert {"-two", "-three", "+TWO", "+3"} <= set(lines), lines
                assert files["blob.bin"]["binary"] and files["blob.bin"]["diff"] == ""
                made = files["<i>page<i>.txt"]
                assert made["what"] == "created"
                assert "+<script>alert(1)</script>" in made["diff"].splitlines()
                # Since the first message: the first turn's files are new.
                since_first = await admin.request({"type": "changes", "session_id": sid})
                assert since_first["since"] == first
                news = {f["path"]: f["what"] for f in since_first["files"]}
                assert news["notes.txt"] == "created", news
                # Nothing was stored by looking: no new checkpoint.
                again = await admin.request({"type": "checkpoints", "session_id": sid})
                assert len(again["checkpoints"]) == len(listed["checkpoints"])
            async with d.connect("alice") as alice:
                theirs = await alice.request({"type": "changes", "session_id": sid})
                assert theirs["type"] == "error" and theirs["code"] == "forbidden", theirs


@pytest.mark.slow  # the terminal's command runs in bwrap
async def test_changes_list_at_most_files_max_and_say_how_many_more(tmp_path: Path) -> None:
    made = FILES_MAX + 3
    replies = [
        calls(run(f"for i in $(seq {made}); do echo $i > f$i.txt; done")),
        say("made them"),
    ]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies, profiles=PROFILES) as d:
            async with d.connect("alice") as alice:
                sid = await message(alice, "make many", mode="full")
                await idle(d, sid)
                got = await alice.request({"type": "changes", "session_id": sid})
                assert got["type"] == "changes", got
                assert len(got["files"]) == FILES_MAX and got["more_files"] == 3, (
                    len(got["files"]),
                    got.get("more_files"),
                )
                assert all(f["what"] == "created" for f in got["files"]), got["files"]


async def test_changes_of_a_session_that_changed_nothing_say_so(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[say("hello")]) as d:
            async with d.connect("alice") as alice:
                sid = await message(alice, "hi")
                got = await alice.request({"type": "changes", "session_id": sid})
                assert got["files"] == [] and "no file was changed" in got["note"], got
                bad = await alice.request({"type": "changes", "session_id": sid, "since": "m-x"})
                assert bad["type"] == "error" and bad["code"] == "not_found", bad


async def test_a_changed_file_swapped_for_a_link_is_never_read_through(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-OF-THE-HOST\n")
    replies = [calls(write("notes.txt", "mine\n")), say("wrote")]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies, profiles=PROFILES) as d:
            async with d.connect("alice") as alice:
                sid = await message(alice, "write")
                await idle(d, sid)
                notes = d.harness.runtime.settings.session_dir(sid) / "notes.txt"
                notes.unlink()
                notes.symlink_to(secret)
                got = await alice.request({"type": "changes", "session_id": sid})
                (entry,) = got["files"]
                assert entry["path"] == "notes.txt" and entry["what"] == "created", entry
                assert "SECRET" not in json.dumps(got)
                assert str(secret) in entry["diff"]  # the link's text, as a link shows


def changed(path: str, before: bytes | None, after: bytes | None, **extra: Any) -> ChangedFile:
    return ChangedFile(Path("/w"), path, "modified", before, after, **extra)


def test_diffs_are_bounded_and_a_binary_file_is_named_not_shown() -> None:
    big = "".join(f"line {i}\n" for i in range(20_000)).encode()
    found = [
        changed("a.txt", b"one\ntwo", b"one\n2"),
        changed("blob.bin", b"x\x00y", b"x\x00z"),
        changed("latin.txt", b"caf\xe9\n", b"cafe\n"),
        changed("huge.txt", None, None, too_large=True),
        changed("big.txt", b"", big),
        *(changed(f"more{i}.txt", b"", big) for i in range(12)),
    ]
    out = {f["path"]: f for f in diffs(found)}
    assert out["a.txt"]["diff"].endswith("+2\n\\ No newline at end of file\n"), out["a.txt"]
    assert out["blob.bin"]["binary"] and out["blob.bin"]["diff"] == ""
    assert out["latin.txt"]["binary"]  # not UTF-8: not shown as text
    assert out["huge.txt"]["omitted"].startswith("larger than") and out["huge.txt"]["diff"] == ""
    assert out["big.txt"]["cut"] and len(out["big.txt"]["diff"].encode()) <= DIFF_MAX_BYTES
    total = sum(len(f["diff"].encode()) for f in out.values())
    assert total <= TOTAL_MAX_BYTES
    assert any(f["omitted"].startswith("not shown: the diffs above") for f in out.values())
