"""Confinement through a real daemon with two users (issue 17, items 1 and 2).

A user's ``cwd`` must lie inside the roots their role is allowed (never ``/``, never
navi's data, never another user's session folder, symlinks resolved), and a sandboxed
command never sees the daemon's own data: the token file, other sessions' folders, the
database (with its WAL), wherever they are.

Rules: the runtime and ApiServer run in this process, clients connect over real
WebSocket connections on 127.0.0.1 (tests/api_ws.py), the model is the fake LLM server
over real HTTP, scripted to make the attacker's tool calls; terminal and code_exec run
under the real bwrap. The data folder lives outside /tmp (in /var/tmp), as the default
``~/.local/share/navi`` does: the sandbox's private /tmp would hide a /tmp path anyway.
Every test has an absolute time limit.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from agent_tools import call
from api_ws import Client, Daemon, open_daemon
from sandbox_args import by_path

from navi_trio.api.auth import ensure_local_token
from navi_trio.errors import ConfigError, ToolInputError
from navi_trio.profiles import ConfigSource, parse_config
from navi_trio.settings import REPO_ROOT, Settings, default_config_path
from navi_trio.tools.private import private_paths
from navi_trio.tools.sandbox import SandboxSpec, bwrap_argv, sandbox_available

TIMEOUT = 60
OK, REASON = sandbox_available()
needs_sandbox = pytest.mark.skipif(not OK, reason=f"the sandbox is unavailable: {REASON}")


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder outside /tmp (the sandbox hides /tmp anyway), removed afterwards; open
    to others (mkdtemp makes it 0700): a root daemon's commands run as nobody, and a
    workspace is open to them."""
    parent = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else REPO_ROOT
    folder = Path(tempfile.mkdtemp(prefix="navi-confine-", dir=parent)).resolve()
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def config(roots: dict[str, list[str]] | None = None, **general: Any) -> ConfigSource:
    """The shipped config with `workspace_roots`, and the general profile without a plan
    on the first message (the scripted replies are the run's own)."""
    path = default_config_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    data["profiles"]["general"].update(planning_first_message=False, **general)
    if roots is not None:
        data["workspace_roots"] = roots
    return ConfigSource(path, initial=parse_config(data, path))


def daemon(tmp_path: Path, base: Path, replies: list[Any], **roots: list[str]) -> Any:
    return open_daemon(
        tmp_path, replies=replies, config=config(roots or None),
        data_dir=base / "data", db_path=base / "db" / "navi.db",
    )  # fmt: skip


async def refused(c: Client, cwd: str, **fields: Any) -> dict[str, Any]:
    reply = await c.request({"type": "message", "content": "hi", "cwd": cwd, **fields})
    assert reply["type"] == "error", reply
    return reply


async def accepted(c: Client, cwd: str | None = None, **fields: Any) -> str:
    """Send a message (in `cwd`); its session id once the run ended."""
    frame: dict[str, Any] = {"type": "message", "content": "hi", **fields}
    if cwd is not None:
        frame["cwd"] = cwd
    reply = await c.request(frame)
    assert reply["type"] in ("session", "ok"), reply
    sid = str(reply["session_id"])
    await c.until_end(sid)
    return sid


async def new_session(d: Daemon, c: Client) -> tuple[str, Path]:
    reply = await c.request({"type": "sessions", "action": "create"})
    assert reply["type"] == "session", reply
    sid = str(reply["session_id"])
    folder = d.harness.runtime.settings.session_dir(sid)
    folder.mkdir(parents=True, exist_ok=True)
    return sid, folder


def frames_text(c: Client) -> str:
    return json.dumps(c.frames)


# -- item 1: the cwd a client sends ---------------------------------------------------


async def test_cwd_root_is_forbidden_for_users_and_admins_and_nothing_runs(
    tmp_path: Path, base: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, base, [{"text": "never"}]) as d:
            for who in ("alice", "root"):
                async with d.connect(who) as c:
                    err = await refused(c, "/")
                    assert err["code"] == "forbidden" and "workspace_roots" in err["message"]
                    listed = await c.request({"type": "sessions", "action": "list"})
                    assert listed["sessions"] == []  # refused before a session was made
            assert d.harness.fake is not None and d.harness.fake.chat_requests == []


async def test_another_users_session_folder_is_never_a_cwd_but_ones_own_is(
    tmp_path: Path, base: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, base, [{"text": "fine"}]) as d:
            async with d.connect("bob") as bob:
                _, bobs = await new_session(d, bob)
                (bobs / "notes.txt").write_text("bob's notes")
                (bobs / "sub").mkdir()
            data = d.harness.runtime.settings.data_dir
            async with d.connect("alice") as alice, d.connect("root") as root:
                for cwd in (bobs, bobs / "sub", data, data / "sessions", bobs / ".." / ".."):
                    err = await refused(alice, str(cwd))
                    assert err["code"] == "forbidden", err
                    assert "workspace_roots" in err["message"], err
                # An admin may drive bob's session, but not work in his folder either.
                assert (await refused(root, str(bobs)))["code"] == "forbidden"
                assert (await refused(root, str(data)))["code"] == "forbidden"
                sid, mine = await new_session(d, alice)
                await accepted(alice, str(mine), session_id=sid)
            assert (bobs / "notes.txt").read_text() == "bob's notes"


async def test_a_symlink_is_resolved_before_the_check(tmp_path: Path, base: Path) -> None:
    root = base / "projects"
    (root / "real").mkdir(parents=True)
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, base, [{"text": "fine"}], user=[str(root)]) as d:
            async with d.connect("bob") as bob:
                _, bobs = await new_session(d, bob)
            data = d.harness.runtime.settings.data_dir
            (root / "to-data").symlink_to(data)
            (root / "to-bob").symlink_to(bobs)
            (root / "to-etc").symlink_to("/etc")
            (root / "to-real").symlink_to(root / "real")
            async with d.connect("alice") as alice:
                for link in ("to-data", "to-bob", "to-etc"):
                    err = await refused(alice, str(root / link))
                    assert err["code"] == "forbidden" and "really" in err["message"], err
                sid = await accepted(alice, str(root / "to-real"))
                history = await alice.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
            # The run got the real folder: a link swapped later changes nothing.
            assert history["messages"][0]["cwd"] == str(root / "real")


async def test_a_user_stays_inside_the_configured_roots_an_admin_anywhere_else(
    tmp_path: Path, base: Path
) -> None:
    inside, outside = base / "projects" / "web", base / "elsewhere"
    inside.mkdir(parents=True)
    outside.mkdir()
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, base, [{"text": "fine"}], user=[str(base / "projects")]) as d:
            async with d.connect("alice") as alice, d.connect("root") as root:
                err = await refused(alice, str(outside))
                assert err["code"] == "forbidden", err
                assert f"workspace_roots.user in config.json: {base / 'projects'}" in err["message"]
                await accepted(alice, str(inside))
                await accepted(root, str(outside))  # no admin entry: anything but navi's data
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, base, [{"text": "fine"}], admin=[str(inside)]) as d:
            async with d.connect("root") as root, d.connect("alice") as alice:
                err = await refused(root, str(outside))
                assert "workspace_roots.admin" in err["message"], err
                await accepted(root, str(inside))
                # No user entry: a user's own session folders only.
                err = await refused(alice, str(inside))
                assert "none but your session folders" in err["message"], err


def test_workspace_roots_are_checked_strictly() -> None:
    path = default_config_path()
    shipped = json.loads(path.read_text(encoding="utf-8"))
    cases = [
        ({"guest": ["/srv"]}, "unknown role 'guest'"),
        ({"user": "/srv"}, "expected a list of names"),
        ({"user": ["srv"]}, "workspace_roots['user'][0]: expected an absolute folder"),
        ({"user": ["/srv", "//"]}, "workspace_roots['user'][1]: '/' would let"),
    ]
    for roots, expected in cases:
        with pytest.raises(ConfigError) as info:
            parse_config({**shipped, "workspace_roots": roots}, path)
        assert str(path) in str(info.value) and expected in str(info.value), info.value


# -- item 2: what a sandboxed command sees -------------------------------------------


@pytest.mark.slow
@needs_sandbox
async def test_a_sandboxed_command_never_sees_the_daemons_data(tmp_path: Path, base: Path) -> None:
    """The attacks of the issue, from alice's session, with a cwd that contains the data
    folder and the database (which lives outside the data folder)."""
    data, db = base / "data", base / "db" / "navi.db"
    bob_says = f"BOB-ANSWER-{secrets.token_hex(4)}"
    bob_file = f"BOB-FILE-{secrets.token_hex(4)}"
    attack = (
        f"cat {data}/local-token; cat {data}/sessions/*/notes.txt; ls -R {data}; "
        f"cat {db} {db}-wal | strings | grep BOB; "
        'echo own > "$HOME/own.txt" && echo OWN-WRITE-OK'
    )
    query = (
        "import sqlite3\n"
        f"for path in ({str(db)!r}, {str(data / 'local-token')!r}):\n"
        "    try:\n"
        "        if path.endswith('.db'):\n"
        "            c = sqlite3.connect(path)\n"
        "            print(c.execute('select content from messages').fetchall())\n"
        "        else:\n"
        "            print(open(path).read())\n"
        "    except Exception as exc:\n"
        "        print('refused:', type(exc).__name__)\n"
    )
    replies = [
        {"text": bob_says},  # bob's turn: stored in the database
        call("terminal", action="run", command=attack),
        call("code_exec", code=query),
        {"text": "done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, base, replies, user=[str(base)]) as d:
            store = d.harness.runtime.store
            token_file = await ensure_local_token(store, data)  # as `navi serve` writes it
            token = token_file.read_text().strip()
            async with d.connect("bob") as bob:
                bob_sid = await accepted(bob)
                folder = d.harness.runtime.settings.session_dir(bob_sid)
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "notes.txt").write_text(bob_file)
            async with d.connect("alice") as alice:
                sid = await accepted(alice, str(base))
                results = [f for f in alice.frames if f["type"] == "tool_result"]
            seen = frames_text(alice)
    assert len(results) == 2, results
    assert token not in seen and bob_file not in seen and bob_says not in seen
    assert "OWN-WRITE-OK" in seen, results[0]  # its own session folder stays writable
    assert (d.harness.runtime.settings.session_dir(sid) / "own.txt").read_text() == "own\n"
    assert "refused:" in results[1]["output"], results[1]


@pytest.mark.slow
@needs_sandbox
async def test_the_data_folder_is_hidden_wherever_the_cwd_reaches_it(
    tmp_path: Path, base: Path
) -> None:
    """Its own session folder as cwd: the command runs there, while the data folder
    around it shows neither the token nor the other session folders."""
    command = f"cat {base}/data/local-token; ls {base}/data/sessions; pwd; echo RAN-IN-OWN"
    replies = [call("terminal", action="run", command=command), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, base, replies) as d:
            token = (await ensure_local_token(d.harness.runtime.store, base / "data")).read_text()
            async with d.connect("bob") as bob:
                _, bobs = await new_session(d, bob)
            async with d.connect("alice") as alice:
                sid, mine = await new_session(d, alice)
                await accepted(alice, str(mine), session_id=sid)
                result = next(f for f in alice.frames if f["type"] == "tool_result")
            assert token.strip() not in frames_text(alice)
            assert result["ok"] and f"{mine}\nRAN-IN-OWN" in result["output"], (
                result
            )  # in its folder
            assert bobs.name not in result["output"]  # other session folders: not listed


def test_the_masks_come_after_the_binds_and_the_own_folder_again_on_top(base: Path) -> None:
    data, db = base / "data", base / "db" / "navi.db"
    own = data / "sessions" / "s-mine"
    own.mkdir(parents=True)
    db.parent.mkdir()
    db.write_text("")
    settings = Settings.from_env({}, data_dir=data, db_path=db)
    spec = SandboxSpec(writable=(own, base), private=private_paths(settings, own))
    with ExitStack() as stack:
        argv = by_path(bwrap_argv(Path("/bwrap"), spec, ["true"], base, stack=stack).argv)

    def at(*words: str) -> list[int]:
        return [i for i in range(len(argv)) if argv[i : i + len(words)] == list(words)]

    (cwd_bind,), (mask,) = at("--bind", str(base), str(base)), at("--tmpfs", str(data))
    assert cwd_bind < mask < max(at("--bind", str(own), str(own)))  # own folder on top
    assert at("--ro-bind", "/dev/null", str(db))  # the database outside the data folder
    # Never a hidden folder as cwd or writable, never a writable / or /proc.
    for writable, cwd in (((data,), data), ((Path("/"),), base), ((Path("/proc"),), base)):
        with pytest.raises(ToolInputError), ExitStack() as stack:
            wrong = attrs.evolve(spec, writable=writable)
            bwrap_argv(Path("/bwrap"), wrong, ["true"], cwd, stack=stack)


# -- session id squatting --------------------------------------------------------------


async def test_a_user_names_sessions_only_in_their_own_namespace(
    tmp_path: Path, base: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, base, [{"text": "fine"}]) as d:
            await d.add_user("alice.x")  # a name that extends alice's: its ids are its own

            async def create(c: Client, sid: str) -> dict[str, Any]:
                return await c.request({"type": "sessions", "action": "create", "session_id": sid})

            async with d.connect("alice") as alice, d.connect("bob") as bob:
                for sid in ("nightly", "bob.notes", "alice", "alice.x.notes", "s-12345"):
                    err = await create(alice, sid)
                    assert err["code"] == "forbidden" and "alice.NAME" in err["message"], err
                err = await alice.request(
                    {"type": "message", "content": "hi", "session_id": "nightly"}
                )
                assert err["code"] == "forbidden", err
                assert (await create(alice, "alice.notes"))["session_id"] == "alice.notes"
                assert (await create(bob, "s-0123456789ab"))["type"] == "session"  # random form
                assert (await create(bob, "alice.notes"))["code"] == "forbidden"
                listed = await alice.request({"type": "sessions", "action": "list"})
                assert [s["session_id"] for s in listed["sessions"]] == ["alice.notes"]
            async with d.connect("alice.x") as other, d.connect("root") as root:
                assert (await create(other, "alice.x.notes"))["type"] == "session"
                assert (await create(root, "nightly"))["type"] == "session"  # admins: any name
            assert d.harness.fake is not None and d.harness.fake.chat_requests == []
