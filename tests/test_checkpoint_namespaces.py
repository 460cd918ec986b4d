"""The checkpoint store tells no user whether another's file exists.

Objects are stored once; were they shared across users, what a snapshot newly stored
(``new_bytes``, the users' totals) would be smaller when another user's file had the
same content: bob writes a guess of alice's ``.env`` and learns from one event whether
he guessed right. Each user's objects have their own addresses (core/checkpoints
`_objects`), so a right guess and a wrong one of the same size cost the same; one user's
two sessions still share.

Rules: the runtime with the fake LLM server over real HTTP, scripted to write with the
filesystem tool (a checkpoint is taken before each round that writes); a real SQLite
file and the real checkpoint store. Every test has an absolute time limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from agent_tools import call
from test_checkpoints_support import engine_for, make_settings, private_for, real_dir

from navi_trio.core.checkpoints import Created
from navi_trio.testing import open_harness

TIMEOUT = 60
SECRET = "AWS_SECRET=wJalrXUtnFEMI-K7MDENG-bPxRfiCY\n"
WRONG = "AWS_SECRET=wJalrXUtnFEMI-K7MDENG-bPxRfiCZ\n"  # one letter off, the same size


def writes(path: str, content: str) -> list[dict[str, Any]]:
    """A turn writing `content`, then something else (the second round's checkpoint
    holds the first file), then done."""
    return [
        call("filesystem", action="write", path=path, content=content),
        call("filesystem", action="write", path="after.txt", content="x"),
        {"text": "done"},
    ]


async def test_a_right_guess_of_another_users_file_costs_what_a_wrong_one_does(
    tmp_path: Path,
) -> None:
    turns = [
        ("s-alice", "alice", SECRET),
        ("s-bob-1", "bob", SECRET),
        ("s-bob-2", "bob", WRONG),
        ("s-bob-3", "bob", SECRET),  # bob's own file again, in another session of his
    ]
    replies = [reply for _, _, content in turns for reply in writes(".env", content)]
    stored: dict[str, int] = {}
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, profiles={"general": {"planning_first_message": False}}
        ) as h:
            ids = {name: await h.user(name) for name in ("alice", "bob")}
            for sid, user, _ in turns:
                frames = await h.turn(sid, "write", user_id=ids[user])
                made = [f for f in frames if f["type"] == "checkpoint_created"]
                assert len(made) == 2, made
                stored[sid] = made[1]["new_bytes"]  # the .env, its listing
    assert stored["s-bob-1"] == stored["s-bob-2"], stored  # nothing learnt of alice's
    assert stored["s-bob-1"] > len(SECRET), stored
    assert stored["s-bob-3"] == 0, stored  # one user's sessions share what they store


async def test_one_users_sessions_share_their_objects_and_restore_them(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    (work / "big.bin").write_bytes(b"z" * 300_000)
    private = private_for(settings)
    with trio.fail_after(TIMEOUT):
        async with engine_for(settings) as engine:
            first = await engine.snapshot("s1", [work], private=private, namespace="alice")
            again = await engine.snapshot("s2", [work], private=private, namespace="alice")
            other = await engine.snapshot("s3", [work], private=private, namespace="bob")
            assert isinstance(first, Created) and isinstance(again, Created)
            assert isinstance(other, Created)
            assert first.checkpoint.new_bytes > 300_000
            assert again.checkpoint.new_bytes < 1_000  # alice's: stored once
            assert other.checkpoint.new_bytes > 300_000  # bob's own copy
            (work / "big.bin").write_bytes(b"changed")
            for owner, info in (("s2", again), ("s3", other)):
                await engine.restore(owner, info.checkpoint.id, private=private)
                assert (work / "big.bin").read_bytes() == b"z" * 300_000
                (work / "big.bin").write_bytes(b"changed")
            assert await engine.delete_all("s1") == 1  # s2 still needs alice's objects
            await engine.restore("s2", again.checkpoint.id, private=private)
            assert (work / "big.bin").read_bytes() == b"z" * 300_000
