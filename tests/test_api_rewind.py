"""The ``checkpoints``, ``rewind`` and ``fork`` frames over a real WebSocket (issue 22).

A user's runs write into their session folder (the filesystem tool); the frames list the
points, preview a rewind, apply it (a follower of the session gets ``rewound`` then
``resync``), refuse it during a run, while a background job runs, and for anyone but
the session's owner; a fork is a new session of the sender that goes on on its own.

Rules: as tests/test_api_server.py (loopback, port 0, real SQLite, the fake LLM over
real HTTP, an absolute timeout on every test, no sleeps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client, Daemon, open_daemon
from bg_tools import BACKGROUNDABLE, make_kit
from rewind_kit import PROFILES, TIMEOUT, call, calls, say, tree_of, write

GENERAL = PROFILES["general"]
BLOCKING = {"general": {**GENERAL, "tools": {"agent": ["filesystem", "block"], "subagent": []}}}
REPLIES = [
    calls(write("notes.txt", "v1\n")),
    say("one"),
    calls(write("notes.txt", "v2\n"), write("new.txt", "made in turn 2\n")),
    say("two"),
]


async def message(client: Client, text: str, sid: str | None = None) -> str:
    frame: dict[str, Any] = {"type": "message", "content": text}
    if sid is not None:
        frame["session_id"] = sid
    made = await client.request(frame)
    if made["type"] == "session":
        made = await client.until(lambda f: f.get("id") == made.get("id") and f["type"] == "ok")
    assert made["type"] == "ok", made
    session_id = str(made["session_id"])
    await client.until_end(session_id)
    return session_id


async def idle(d: Daemon, sid: str) -> None:
    actor = d.harness.runtime.sessions.actor(sid)
    assert actor is not None
    await actor.idle.wait()


async def two_turns(d: Daemon, alice: Client) -> tuple[str, Path, dict[str, Any]]:
    sid = await message(alice, "first")
    folder = d.harness.runtime.settings.session_dir(sid)
    after_1 = tree_of(folder)
    await message(alice, "second", sid)
    await idle(d, sid)
    assert (folder / "new.txt").exists()
    return sid, folder, after_1


async def test_a_rewind_is_listed_previewed_and_applied_and_a_follower_reloads(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=REPLIES, profiles=PROFILES) as d:
            async with d.connect("alice") as alice, d.connect("alice") as follower:
                sid, folder, after_1 = await two_turns(d, alice)
                await follower.request({"type": "subscribe", "session_id": sid, "last_seq": None})
                listed = await alice.request({"type": "checkpoints", "session_id": sid})
                assert listed["type"] == "checkpoints", listed
                first, second = listed["messages"]
                assert (first["text"], second["text"]) == ("first", "second")
                assert second["checkpoint"] and first["checkpoint"]
                assert {c["message_id"] for c in listed["checkpoints"]} == {
                    first["message_id"],
                    second["message_id"],
                }
                ask = {"type": "rewind", "session_id": sid, "to": second["message_id"]}
                seen = await alice.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
                preview = await alice.request(ask)
                assert preview["action"] == "preview", preview
                assert preview["messages_removed"] == 5 and preview["text"] == "second"
                (root,) = preview["files"]["roots"]
                assert (root["restored"], root["deleted"]) == (1, 1)
                assert {c["path"] for c in root["changes"]} == {"notes.txt", "new.txt"}
                assert (folder / "new.txt").exists()  # nothing changed yet
                done = await alice.request({**ask, "confirm": preview["token"]})
                assert done["action"] == "done" and done["undo"], done
                assert tree_of(folder) == after_1
                rewound = await follower.until_type("rewound", session_id=sid)
                assert rewound["messages_removed"] == 5 and rewound["undo"] == done["undo"]
                resync = await follower.until_type("resync", session_id=sid)
                assert resync["seq"] == rewound["seq"]
                history = await alice.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
                assert [m["content"] for m in history["messages"] if m["role"] == "user"] == [
                    "first"
                ]
                # The same token again: the session moved on since.
                again = await alice.request({**ask, "confirm": preview["token"]})
                assert again["type"] == "error" and again["code"] == "not_found", again
                listed = await alice.request({"type": "checkpoints", "session_id": sid})
                assert [b["branch_id"] for b in listed["branches"]] == [done["undo"]]
            # A client back from a seq before the rewind reloads: the replay is gone.
            async with d.connect("alice") as late:
                await late.request(
                    {"type": "subscribe", "session_id": sid, "last_seq": seen["seq"],
                     "epoch": seen["epoch"]}
                )  # fmt: skip
                first_frame = await late.until(lambda f: f.get("session_id") == sid
                                               and f["type"] != "ok")  # fmt: skip
                assert first_frame["type"] == "resync", first_frame
                # Deleting the session deletes its checkpoints and branches too.
                gone = await late.request(
                    {"type": "sessions", "action": "delete", "session_id": sid}
                )
                assert gone["deleted"] is True, gone
                engine = d.harness.runtime.checkpoints.engine
                assert await engine.checkpoints(sid) == []
                assert await d.harness.runtime.store.kv_list("branches", f"{sid}:") == []


async def test_only_the_owner_lists_rewinds_or_forks_and_hostile_ids_are_refused(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=REPLIES, profiles=PROFILES) as d:
            async with d.connect("alice") as alice, d.connect("bob") as bob:
                sid, folder, _ = await two_turns(d, alice)
                before = tree_of(folder)
                listed = await alice.request({"type": "checkpoints", "session_id": sid})
                to = listed["messages"][1]["message_id"]
                for frame in (
                    {"type": "checkpoints", "session_id": sid},
                    {"type": "rewind", "session_id": sid, "to": to},
                    {"type": "rewind", "session_id": sid, "to": to, "confirm": "ab.cd"},
                    {"type": "fork", "session_id": sid, "files": True},
                ):
                    err = await bob.request(frame)
                    assert err["type"] == "error" and err["code"] == "forbidden", err
                rw = {"type": "rewind", "session_id": sid}
                fk = {"type": "fork", "session_id": sid}
                for frame, code in (
                    ({**rw, "to": "../../etc"}, "bad_frame"),
                    ({**rw, "to": "m-0", "confirm": "x"}, "bad_frame"),
                    ({**rw, "to": "m-0", "branch": "b-1"}, "bad_frame"),
                    ({**rw, "to": "m-000000000000"}, "not_found"),
                    ({**rw, "branch": "b-000000000000"}, "not_found"),
                    ({**fk, "files": "yes"}, "bad_frame"),
                    ({**fk, "files": True, "folder": "/"}, "bad_frame"),
                    ({**fk, "files": True, "folder": "/etc/x"}, "forbidden"),
                    ({**fk, "at": "m-000000000000"}, "not_found"),
                    ({"type": "checkpoints", "session_id": "s-nobody"}, "not_found"),
                ):
                    err = await alice.request(frame)
                    assert err["type"] == "error" and err["code"] == code, (frame, err)
                assert tree_of(folder) == before
                sessions = await alice.request({"type": "sessions", "action": "list"})
                assert [s["session_id"] for s in sessions["sessions"]] == [sid]  # no fork left


async def test_a_fork_to_a_taken_id_answers_exists_the_same_whoever_holds_it(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[say("noted")], loop=True) as d:
            async with d.connect("alice") as alice, d.connect("bob") as bob:
                sid = await message(alice, "first")
                mine = await message(alice, "another of mine")
                theirs = await message(bob, "bob's own")
                said = {}
                for taken in (theirs, mine):
                    err = await alice.request(
                        {"type": "fork", "session_id": sid, "new_session_id": taken}
                    )
                    assert (err["type"], err["code"]) == ("error", "exists"), err
                    said[taken] = err["message"].replace(taken, "ID")
                # One answer: nothing says whose it is, or anything of it.
                assert said[theirs] == said[mine] == "session 'ID' already exists", said
                listed = await alice.request({"type": "sessions", "action": "list"})
                assert sorted(s["session_id"] for s in listed["sessions"]) == sorted([sid, mine])
                history = await bob.request(
                    {"type": "sessions", "action": "history", "session_id": theirs}
                )
                assert [m["content"] for m in history["messages"]] == ["bob's own", "noted"]


async def test_a_rewind_is_refused_during_a_run_and_while_a_background_job_runs(
    tmp_path: Path,
) -> None:
    kit = make_kit()
    replies = [
        calls(write("notes.txt", "v1\n")),
        say("one"),
        calls(call("block")),  # the second run waits in the tool until stopped
        calls(call("block", background=True)),
        say("a job runs"),
    ]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, profiles=BLOCKING, tools=kit.tools(),
            backgroundable_tools=BACKGROUNDABLE,
        ) as d:  # fmt: skip
            async with d.connect("alice") as alice:
                sid = await message(alice, "first")
                await idle(d, sid)
                listed = await alice.request({"type": "checkpoints", "session_id": sid})
                to = listed["messages"][0]["message_id"]
                ask = {"type": "rewind", "session_id": sid, "to": to}
                preview = await alice.request(ask)
                await alice.request({"type": "message", "content": "block", "session_id": sid})
                await kit.block.wait_started()
                for frame in (ask, {**ask, "confirm": preview["token"]}):
                    err = await alice.request(frame)
                    assert err["type"] == "error" and err["code"] == "session_busy", err
                    assert "stop it" in err["message"]
                await alice.request({"type": "stop", "session_id": sid})
                await alice.until_end(sid)
                await idle(d, sid)
                await message(alice, "start a job", sid)
                await idle(d, sid)
                preview = await alice.request(ask)
                err = await alice.request({**ask, "confirm": preview["token"]})
                assert err["type"] == "error" and err["code"] == "session_busy", err
                assert "background task" in err["message"]
                messages = await alice.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
                assert sum(m["role"] == "user" for m in messages["messages"]) == 3


async def test_a_fork_is_a_new_session_of_the_sender_that_goes_on_on_its_own(
    tmp_path: Path,
) -> None:
    replies = [*REPLIES, say("in the fork")]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies, profiles=PROFILES) as d:
            async with d.connect("alice") as alice, d.connect("bob") as bob:
                sid, folder, after_1 = await two_turns(d, alice)
                await alice.request({"type": "subscribe", "session_id": sid, "last_seq": None})
                listed = await alice.request({"type": "checkpoints", "session_id": sid})
                to = listed["messages"][1]["message_id"]
                made = await alice.request(
                    {"type": "fork", "session_id": sid, "at": to, "files": True}
                )
                assert made["type"] == "fork", made
                new = made["new_session_id"]
                assert made["messages"] == 4 and made["folder"] is None  # no cwd: no copy
                forked = await alice.until_type("forked", session_id=sid)
                assert forked["new_session_id"] == new
                new_folder = d.harness.runtime.settings.session_dir(new)
                assert tree_of(new_folder) == after_1
                own = await alice.request({"type": "sessions", "action": "list"})
                assert {s["session_id"] for s in own["sessions"]} == {sid, new}
                # The fork keeps the source's title: its first message is the same.
                assert {s["title"] for s in own["sessions"]} == {"first"}
                theirs = await bob.request({"type": "sessions", "action": "list"})
                assert theirs["sessions"] == []
                await message(alice, "go on", new)
                own = await alice.request({"type": "sessions", "action": "list"})
                assert {s["title"] for s in own["sessions"]} == {"first"}
                # A fork before the first message keeps none: no title until its own.
                first = listed["messages"][0]["message_id"]
                empty = await alice.request({"type": "fork", "session_id": sid, "at": first})
                own = await alice.request({"type": "sessions", "action": "list"})
                titles = {s["session_id"]: s["title"] for s in own["sessions"]}
                assert titles[empty["new_session_id"]] == ""
                body = d.harness.fake.chat_requests[-1]["body"] if d.harness.fake else {}
                users = [m["content"] for m in body["messages"] if m["role"] == "user"]
                assert users == ["first", "go on"]
                source = await alice.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
                assert sum(m["role"] == "user" for m in source["messages"]) == 2


@pytest.mark.parametrize("swap", ["link", "folder"])
async def test_a_forks_folder_swapped_after_its_check_gets_no_copy_nor_does_what_replaced_it(
    tmp_path: Path, swap: str
) -> None:
    # The fork's folder is checked when the frame arrives; before the copy is made, its
    # parent is renamed away and a link to another folder (or another folder itself)
    # takes its place. The copy goes nowhere: refused, naming the folder; no session.
    base = (tmp_path / "base").resolve()
    parent = base / "p"
    parent.mkdir(parents=True)
    other = base / "other"
    other.mkdir()
    work = base / "work"
    work.mkdir()
    replies = [calls(write("a.txt", "in the work folder\n")), say("one")]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies, profiles=PROFILES) as d:
            async with d.connect("root") as admin:
                ok = await admin.request({"type": "message", "content": "one", "cwd": str(work)})
                assert ok["type"] in ("ok", "session"), ok
                sid = str(ok["session_id"])
                await admin.until_end(sid)
                await idle(d, sid)
                engine = d.harness.runtime.rewinds.forker.rewinder.engine
                export = engine.export

                async def swapped_first(*args: Any, **kwargs: Any) -> Any:
                    if not (base / "p-moved").exists():
                        parent.rename(base / "p-moved")
                        if swap == "link":
                            parent.symlink_to(other)
                        else:
                            other.rename(parent)
                    return await export(*args, **kwargs)

                engine.export = swapped_first  # type: ignore[method-assign]
                err = await admin.request(
                    {"type": "fork", "session_id": sid, "files": True,
                     "folder": str(parent / "copy")}
                )  # fmt: skip
                assert (err["type"], err["code"]) == ("error", "restore_failed"), err
                assert str(parent) in err["message"], err
                for place in (base / "p-moved", parent):
                    assert not (place / "copy").exists(), place
                assert not list((base / "p-moved").iterdir())
                listed = await admin.request({"type": "sessions", "action": "list"})
                assert [s["session_id"] for s in listed["sessions"]] == [sid]  # no fork left
