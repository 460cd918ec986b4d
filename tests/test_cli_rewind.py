"""`navi rewind` and `navi fork` as real processes (issue 22, "Every client"): through a
daemon (the frames, the token's user checked) and in a runtime of their own on the local
database when no daemon is there; the preview first, nothing changed without a yes, the
undo it prints works, a fork prints the new session.

Rules: real `navi` processes (forked from the warm fork server, tests/navi_forks.py);
the daemon (tests/api_ws.py) and the fake LLM in this process on 127.0.0.1; the DB and
folders under tmp_path; an absolute deadline on every test; no sleeps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trio
from api_ws import Daemon, open_daemon
from rewind_kit import PROFILES, TIMEOUT, calls, say, tree_of, turn, write
from test_api_rewind import REPLIES, idle, message
from test_cli import forked

from navi_trio.testing import open_harness

pytestmark = pytest.mark.slow  # its tests start processes


async def cli(d: Daemon, user: str, *args: str, environ: dict[str, str], cwd: Path) -> tuple[
    int, str, str
]:  # fmt: skip
    done = await forked(*args, "--url", d.url, "--token", d.tokens[user], env=environ, cwd=cwd)
    return done.code, done.out, done.err


async def test_navi_rewind_previews_applies_and_undoes_through_the_daemon(
    tmp_path: Path, env: dict[str, str]
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=REPLIES, profiles=PROFILES) as d:
            async with d.connect("alice") as alice:
                sid = await message(alice, "first")
                folder = d.harness.runtime.settings.session_dir(sid)
                after_1 = tree_of(folder)
                await message(alice, "second", sid)
                await idle(d, sid)
            after_2 = tree_of(folder)
            code, out, err = await cli(d, "alice", "rewind", "--session", sid, "--list",
                                       environ=env, cwd=tmp_path)  # fmt: skip
            assert code == 0, err
            assert re.search(r"^\s+1 +m-\w+ .*first$", out, re.M), out
            assert re.search(r"^\s+2 +m-\w+ .*second$", out, re.M), out
            # No terminal, no --yes: the preview only.
            args = ("rewind", "--session", sid, "--to", "-1")
            code, out, err = await cli(d, "alice", *args, environ=env, cwd=tmp_path)
            assert code == 0, err
            assert "chat: 5 message(s) removed" in out and "nothing was changed" in out
            assert "new.txt" in out and "full mode" in out
            assert tree_of(folder) == after_2
            code, out, err = await cli(d, "alice", *args, "--yes", environ=env, cwd=tmp_path)
            assert code == 0, err
            assert tree_of(folder) == after_1
            undo = re.search(r"undo it with: navi (rewind .*)$", out, re.M)
            assert undo is not None, out
            code, out, err = await cli(d, "alice", *undo.group(1).split(), "--yes",
                                       environ=env, cwd=tmp_path)  # fmt: skip
            assert code == 0, err
            assert tree_of(folder) == after_2
            # Another user's session: refused, one line, exit 1.
            code, out, err = await cli(d, "bob", *args, "--yes", environ=env, cwd=tmp_path)
            assert code == 1 and "belongs to another user" in err and out == ""
            assert tree_of(folder) == after_2


async def test_navi_fork_through_the_daemon_prints_the_new_session_with_json(
    tmp_path: Path, env: dict[str, str]
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=REPLIES, profiles=PROFILES) as d:
            async with d.connect("alice") as alice:
                sid = await message(alice, "first")
                after_1 = tree_of(d.harness.runtime.settings.session_dir(sid))
                await message(alice, "second", sid)
                await idle(d, sid)
            code, out, err = await cli(d, "alice", "fork", "--session", sid, "--at", "2",
                                       "--files", "--json", environ=env, cwd=tmp_path)  # fmt: skip
            assert code == 0, err
            made = json.loads(out)
            assert made["type"] == "fork" and made["messages"] == 4
            new_folder = d.harness.runtime.settings.session_dir(made["new_session_id"])
            assert tree_of(new_folder) == after_1
            row = await d.harness.runtime.store.get_session(made["new_session_id"])
            assert row is not None and row.user_id == d.ids["alice"]


async def test_navi_rewind_and_fork_work_on_the_local_database_without_a_daemon(
    tmp_path: Path, env: dict[str, str]
) -> None:
    work = (tmp_path / "work").resolve()
    work.mkdir()
    (work / "a.txt").write_text("v0\n")
    replies = [calls(write("a.txt", "v1\n")), say("one")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            await turn(h, "s-local", "change it", cwd=work, user_role="admin")
        assert (work / "a.txt").read_text() == "v1\n"
        args = ("--session", "s-local", "--db", str(tmp_path / "navi.db"))
        done = await forked("rewind", *args, "--to", "1", "--restore", "files", "--yes",
                            env=env, cwd=tmp_path)  # fmt: skip
        assert done.code == 0, done.err
        assert (work / "a.txt").read_text() == "v0\n"
        assert "undo it with: navi rewind --session s-local --branch b-" in done.out
        done = await forked("fork", *args, "--new", "s-copy", env=env, cwd=tmp_path)
        assert done.code == 0, done.err
        assert "forked s-local into s-copy (4 message(s))" in done.out
        done = await forked("rewind", "--session", "s-nope", "--db", str(tmp_path / "navi.db"),
                            "--list", env=env, cwd=tmp_path)  # fmt: skip
        assert done.code == 1 and f"no session 's-nope' (in {tmp_path / 'navi.db'})" in done.err
