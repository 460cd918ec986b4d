"""A rewind or a fork acts only in folders the asking user may use now.

A checkpoint remembers the folders of the run that made it. When an admin once worked in
a user's session with a cwd of their own, or the user's `workspace_roots` were narrowed
since, those folders are no longer the user's: a files rewind the user asks for leaves
them out (nothing there is written or deleted), a fork with files copies nothing of them,
and both name what they left out. The chat and the session's own folder still rewind.

Real WebSocket connections to a daemon in this process (tests/api_ws.py: a real runtime,
real SQLite, the fake LLM over HTTP), real folders under tmp_path; the config is a real
file, narrowed by rewriting it and reloading. Every test has an absolute limit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import trio
from api_ws import Client, Daemon, open_daemon
from rewind_kit import PROFILES, TIMEOUT, calls, say, write

from navi_trio.profiles import ConfigSource
from navi_trio.settings import default_config_path


def config_at(path: Path, roots: list[str]) -> ConfigSource:
    """The shipped config folder at `path`'s, with the test's profile and
    `workspace_roots.user` in its config file."""
    shutil.copytree(default_config_path().parent, path.parent, dirs_exist_ok=True)
    data = json.loads(default_config_path().read_text(encoding="utf-8"))
    data["profiles"]["general"].update(PROFILES["general"])
    data["workspace_roots"] = {"user": roots}
    path.write_text(json.dumps(data), encoding="utf-8")
    source = ConfigSource(path)
    source.reload()
    return source


async def message(c: Client, text: str, cwd: Path, sid: str | None = None) -> str:
    frame: dict[str, Any] = {"type": "message", "content": text, "cwd": str(cwd)}
    if sid is not None:
        frame["session_id"] = sid
    reply = await c.request(frame)
    if reply["type"] == "session":
        reply = await c.until(lambda f: f.get("id") == reply.get("id") and f["type"] != "session")
    assert reply["type"] == "ok", reply
    session = str(reply["session_id"])
    await c.until_end(session)
    return session


async def idle(d: Daemon, sid: str) -> None:
    actor = d.harness.runtime.sessions.actor(sid)
    if actor is not None:
        await actor.idle.wait()


def point(listed: dict[str, Any], text: str) -> str:
    return str(next(m["message_id"] for m in listed["messages"] if m["text"] == text))


async def test_an_admins_folder_in_a_users_session_is_never_rewound_or_forked_by_the_user(
    tmp_path: Path,
) -> None:
    projects, admin_only = tmp_path / "projects" / "p", tmp_path / "admin-only"
    projects.mkdir(parents=True)
    admin_only.mkdir()
    (admin_only / "admin.txt").write_text("the admin's, before\n")
    source = config_at(tmp_path / "config" / "config.json", [str(tmp_path / "projects")])
    replies = [
        calls(write("mine.txt", "alice\n")), say("mine"),
        calls(write("admin.txt", "the admin's, after\n")), say("admin"),
    ]  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies, config=source) as d:
            async with d.connect("alice") as alice, d.connect("root") as admin:
                sid = await message(alice, "mine", projects.resolve())
                await idle(d, sid)
                await message(admin, "admin work", admin_only.resolve(), sid)
                await idle(d, sid)
                listed = await alice.request({"type": "checkpoints", "session_id": sid})

                # A files rewind to the admin's message: their folder is left out.
                ask = {"type": "rewind", "session_id": sid, "restore": "files",
                       "to": point(listed, "admin work")}  # fmt: skip
                preview = await alice.request(ask)
                assert preview["action"] == "preview", preview
                (left,) = preview["roots_left_out"]
                assert left["root"] == str(admin_only.resolve()), left
                assert "you may not use this folder now" in left["why"], left
                roots = [r["root"] for r in (preview["files"] or {}).get("roots", [])]
                assert str(admin_only.resolve()) not in roots, roots
                done = await alice.request({**ask, "confirm": preview["token"]})
                assert done["action"] == "done", done
                assert (admin_only / "admin.txt").read_text() == "the admin's, after\n"

                # A fork with files copies nothing of it, and says so.
                for at in (point(listed, "admin work"), None):
                    fork: dict[str, Any] = {"type": "fork", "session_id": sid, "files": True}
                    if at is not None:
                        fork["at"] = at
                    made = await alice.request(fork)
                    assert made["type"] == "fork", made
                    assert any(str(admin_only.resolve()) in x for x in made["left_out"]), made
                    assert made["folder"] is None, made
                    copy = d.harness.runtime.settings.session_dir(made["new_session_id"])
                    assert not list(copy.rglob("admin.txt")), sorted(copy.rglob("*"))

                # The admin still rewinds it: the folder is theirs to use.
                preview = await admin.request(ask)
                assert preview["roots_left_out"] == [], preview
                done = await admin.request({**ask, "confirm": preview["token"]})
                assert (admin_only / "admin.txt").read_text() == "the admin's, before\n"


async def test_a_folder_workspace_roots_no_longer_grant_is_left_out_of_a_rewind(
    tmp_path: Path,
) -> None:
    projects = tmp_path / "projects" / "p"
    projects.mkdir(parents=True)
    (tmp_path / "other").mkdir()
    path = tmp_path / "config" / "config.json"
    source = config_at(path, [str(tmp_path / "projects")])
    replies = [calls(write("mine.txt", "alice\n")), say("mine")]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies, config=source) as d:
            async with d.connect("alice") as alice:
                sid = await message(alice, "mine", projects.resolve())
                await idle(d, sid)
                listed = await alice.request({"type": "checkpoints", "session_id": sid})
                ask = {"type": "rewind", "session_id": sid, "restore": "both",
                       "to": point(listed, "mine")}  # fmt: skip
                before = await alice.request(ask)
                assert before["roots_left_out"] == [] and before["files"] is not None, before
                config_at(path, [str(tmp_path / "other")])  # narrowed, and reloaded:
                assert source.reload()
                preview = await alice.request(ask)
                (left,) = preview["roots_left_out"]
                assert left["root"] == str(projects.resolve()), left
                assert "workspace_roots.user" in left["why"], left
                roots = [r["root"] for r in preview["files"]["roots"]]  # the session folder's
                assert roots == [str(d.harness.runtime.settings.session_dir(sid))], roots
                # The token of the earlier preview named the folder: refused now.
                stale = await alice.request({**ask, "confirm": before["token"]})
                assert stale["type"] == "error" and stale["code"] == "changed", stale
                done = await alice.request({**ask, "confirm": preview["token"]})
                assert done["action"] == "done" and done["messages_removed"] > 0, done
                assert (projects / "mine.txt").read_text() == "alice\n"
