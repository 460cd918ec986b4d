"""A SIGKILL of the daemon in the middle of a rewind or of a run's checkpoint leaves the
workspace before or after, never half-restored (issue 22, "Tests").

A session is built once with real runs (the fake LLM over HTTP, a real SQLite file, a
workspace of 1,000 files that the second message's run changed in bulk with a terminal
command: 600 files changed, 250 deleted, 300 new in new folders, 100 modes: a rewind puts
back only what navi's own calls changed) and copied whole (`cp -a`: contents, modes,
owners, times). Each round after the first starts from that copy, put back in the same
place (the session's folders are absolute), starts a real `navi serve` on it, asks for a
rewind of chat and files to the first message (its restore is the whole change back),
and kills the daemon with SIGKILL at a random moment after the confirm went out; half
the kills are timed from the moment the restore's journal appears, so the apply phase
is always hit. A second `navi serve` then starts (the checkpoint engine completes what
the journal holds before anything runs): the workspace is exactly the tree before or the
tree after, and exactly after when the journal was written; the history is the one
before or the one after. A kill during a run's checkpoint leaves the workspace as it was
and only checkpoints that restore.

A copy's files have new inodes and change times, which navi reads as edits it did not
see (a file navi changed keeps the stamp its call left: size, times, inode): in a copy,
every file the runs changed is a conflict, which a plain rewind keeps. So the rewind
asks `"conflicts": "restore"`, and each round's preview must plan what the first
round's (on the files the runs left, no conflict) planned: the same restore.

Real processes and real time (the daemon is a real process, forked from the tests'
warm process by tests/navi_forks.py: its work after a kill is the subject, not its
interpreter's start): the waits for the journal poll its folder every half millisecond,
bounded; the number of rounds is fixed.
"""

from __future__ import annotations

import random
import shlex
import sys
from pathlib import Path
from typing import Any

import navi_forks
import pytest
import trio
from rewind_kit import FULL, PROFILES, calls, run, say, tree_of, turn, write
from test_api_daemon import client
from test_checkpoints_crash import _state_a
from test_checkpoints_support import diff, users_own

from navi_trio.testing import FakeLLMServer, open_harness

pytestmark = pytest.mark.slow
ROUNDS = 4
DEADLINE = 240
SID = "s-crash"


def _paths(base: Path, env: dict[str, str]) -> tuple[Path, Path, dict[str, str]]:
    base.mkdir()
    data = base / "data"
    environ = {**env, "NAVI_DB": str(base / "navi.db"), "NAVI_DATA_DIR": str(data)}
    return base / "work", data, environ


def _first_tree(work: Path) -> dict[str, Any]:
    work.mkdir()
    _state_a(work)
    users_own(work)  # the user's own files, which their run's command changes
    return tree_of(work)


# The bulk change, as a command of the second message's run (the test's own code).
BULK = (
    f"{shlex.quote(sys.executable)} -c 'import sys; sys.path.insert(0, sys.argv[1]); "
    "from pathlib import Path; from test_checkpoints_crash import _state_b; "
    f'_state_b(Path("."))\' {shlex.quote(str(Path(__file__).parent))}'
)


async def _session(base: Path, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two messages: the first writes a marker (its checkpoint: state A), the second
    changes the workspace in bulk and writes another marker. The trees before the
    rewind (now) and after it (state A)."""
    after = _first_tree(work)
    replies = [
        calls(write("m1.txt", "1\n")), say("one"),
        calls(run(BULK)), calls(write("m2.txt", "2\n")), say("2"),
    ]  # fmt: skip
    async with open_harness(base, replies=replies, profiles=PROFILES) as h:
        await turn(h, SID, "one", cwd=work, **FULL)
        await turn(h, SID, "two", cwd=work, **FULL)
    now = tree_of(work)
    assert now["d00/f00.txt"] != after["d00/f00.txt"] and "new/n0/g0.txt" in now, "not run"
    return now, after


async def _journal(data: Path, proc: navi_forks.Forked) -> bool:
    """Whether the restore's journal appeared before the daemon ended."""
    folder = data / "checkpoints" / "journal"
    ended = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal ended
            await proc.wait()
            ended = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        while not list(folder.glob("*.json")):  # noqa: ASYNC110 - another process writes it
            await trio.sleep(0.0005)
        nursery.cancel_scope.cancel()
    return not ended


def _plan(preview: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """What a rewind's preview says its restore does, per folder (conflicts aside)."""
    counts = ("restored", "created", "deleted", "modes", "dirs_created", "dirs_deleted")
    return [(r["root"], [r[k] for k in (*counts, "bytes")]) for r in preview["files"]["roots"]]


async def _users(url: str, data: Path) -> list[str]:
    async with client(url, data) as c:
        history = await c.request({"type": "sessions", "action": "history", "session_id": SID})
    return [m["content"] for m in history["messages"] if m["role"] == "user"]


async def test_a_daemon_killed_mid_rewind_leaves_the_workspace_before_or_after(
    tmp_path: Path, env: dict[str, str]
) -> None:
    rng = random.Random(22)
    seen: list[str] = []
    plans: list[list[tuple[str, list[int]]]] = []
    with trio.fail_after(DEADLINE):
        # The session's runs are the same every round: built once, copied back each round.
        base, saved = tmp_path / "round", tmp_path / "saved"
        work, data, environ = _paths(base, env)
        before, after = await _session(base, work)
        assert before != after
        await trio.run_process(["cp", "-a", str(base), str(saved)])
        for n in range(ROUNDS):
            if n:
                await trio.run_process(["rm", "-rf", str(base)])
                await trio.run_process(["cp", "-a", str(saved), str(base)])
                assert tree_of(work) == before
            journaled = False
            async with navi_forks.serving(environ, "http://127.0.0.1:9") as proc:
                async with client(proc.url, data) as c:
                    listed = await c.request({"type": "checkpoints", "session_id": SID})
                    ask = {
                        "type": "rewind",
                        "session_id": SID,
                        "to": listed["messages"][0]["message_id"],
                        "conflicts": "restore",  # a copy's files are all conflicts
                    }
                    preview = await c.request(ask)
                    assert preview["action"] == "preview", preview
                    plans.append(_plan(preview))
                    assert plans[n] == plans[0], f"round {n}: another restore planned"
                    await c.send({**ask, "confirm": preview["token"], "id": "go"})
                    if n % 2:
                        journaled = await _journal(data, proc)
                        await trio.sleep(rng.uniform(0, 0.02))
                    else:
                        await trio.sleep(rng.uniform(0, 0.4))
                    proc.kill()
                    await proc.wait()
            async with navi_forks.serving(environ, "http://127.0.0.1:9") as proc:
                now = tree_of(work)
                left = sorted(diff(after, now).items())
                assert now in (before, after), f"round {n}: half restored {left[:10]}"
                if journaled:
                    assert now == after, f"round {n}: a written journal was not completed"
                assert not [k for k in now if "navi-restore" in k]
                users = await _users(proc.url, data)
                assert users in (["one", "two"], []), users
                seen.append("after" if now == after else "before")
    assert len(seen) == ROUNDS


async def test_a_daemon_killed_mid_checkpoint_leaves_the_workspace_and_whole_checkpoints(
    tmp_path: Path, env: dict[str, str]
) -> None:
    rng = random.Random(23)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            fake = FakeLLMServer([calls(write("x.txt", "x\n")), say("done")], loop=True)
            await nursery.start(fake.serve)
            for n in range(2):
                work, data, environ = _paths(tmp_path / f"round{n}", env)
                before = _first_tree(work)
                async with navi_forks.serving(environ, fake.url) as proc:
                    async with client(proc.url, data) as c:
                        await c.request(
                            {"type": "message", "content": "go", "session_id": SID,
                             "cwd": str(work.resolve())}
                        )  # fmt: skip
                        await trio.sleep(rng.uniform(0, 0.3))
                        proc.kill()
                        await proc.wait()
                (work / "x.txt").unlink(missing_ok=True)  # the call may have run
                assert tree_of(work) == before
                async with (
                    navi_forks.serving(environ, fake.url) as proc,
                    client(proc.url, data) as c,
                ):
                    listed = await c.request({"type": "checkpoints", "session_id": SID})
                    for point in listed.get("messages") or []:
                        if point["checkpoint"]:
                            preview = await c.request(
                                {"type": "rewind", "session_id": SID, "to": point["message_id"],
                                 "restore": "files"}
                            )  # fmt: skip
                            assert preview["action"] == "preview", preview
            nursery.cancel_scope.cancel()
