"""Keeping checkpoints: listed per owner, pruned by count and age, deleted with the
session; objects shared between checkpoints (and owners) are stored once and removed
only when nothing refers to them, also when another process collected meanwhile.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from test_checkpoints_support import (
    DEADLINE,
    engine_for,
    make_settings,
    private_for,
    real_dir,
    snap,
    tree_of,
)

from navi_trio.core.checkpoints import CheckpointEngine, Created, UnknownCheckpointError


def objects_in(engine: CheckpointEngine) -> int:
    return engine.objects.count()


class Wall:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_checkpoints_are_listed_per_owner_with_time_files_changed_and_size(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    wall = Wall()
    with trio.fail_after(DEADLINE):
        async with engine_for(settings, wall=wall) as engine:
            (work / "a.txt").write_text("a" * 100)
            first = await snap(engine, "alice-1", [work], private)
            wall.now += 60
            (work / "b.txt").write_text("b" * 50)
            second = await snap(engine, "alice-1", [work], private)
            other = await snap(engine, "bob-1", [work], private)
            listed = await engine.checkpoints("alice-1")
            assert [c.id for c in listed] == [first, second]
            assert [c.created for c in listed] == [1_000_000.0, 1_000_060.0]
            assert [(c.files, c.bytes, c.changed) for c in listed] == [(1, 100, 1), (2, 150, 1)]
            assert listed[1].new_bytes < listed[0].new_bytes + 50 + 200  # shares a.txt
            assert [c.id for c in await engine.checkpoints("bob-1")] == [other]
            # One owner cannot reach another's checkpoint, nor a made-up id.
            with pytest.raises(UnknownCheckpointError):
                await engine.get("bob-1", first)
            with pytest.raises(UnknownCheckpointError, match="not a checkpoint id"):
                await engine.get("alice-1", "../../etc/passwd")
            # The same state again is the same checkpoint.
            again = await engine.snapshot("alice-1", [work], private=private)
            assert isinstance(again, Created) and again.reused and again.checkpoint.id == second


async def test_pruning_keeps_the_newest_by_count_and_drops_the_old_by_age(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path, checkpoint_keep=3, checkpoint_max_age_sec=3600.0)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    wall = Wall()
    with trio.fail_after(DEADLINE):
        async with engine_for(settings, wall=wall) as engine:
            ids = []
            for k in range(5):
                (work / "f.txt").write_text(f"version {k}" * 100)
                ids.append(await snap(engine, "s", [work], private))
                wall.now += 1000
            assert await engine.prune("s") == ids[:2]  # count: the newest 3 stay
            assert [c.id for c in await engine.checkpoints("s")] == ids[2:]
            wall.now = 1_002_000.0 + 3600 + 1  # ids[2] is now older than an hour, ids[3] not
            assert await engine.prune("s") == [ids[2]]
            # What is left still restores: the collection kept its objects.
            (work / "f.txt").write_text("later")
            await engine.restore("s", ids[3], private=private)
            assert (work / "f.txt").read_text() == "version 3" * 100


async def test_delete_all_removes_an_owner_and_only_objects_nobody_else_needs(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            (work / "shared.txt").write_text("both sessions have this")
            # Two sessions of one user: one namespace, so they share objects.
            kept = await snap(engine, "keep", [work], private, "alice")
            baseline = objects_in(engine)
            for k in range(3):
                (work / f"only-doomed-{k}.txt").write_text(f"doomed {k}")
                await snap(engine, "doomed", [work], private, "alice")
            assert objects_in(engine) > baseline
            assert await engine.delete_all("doomed") == 3
            assert await engine.checkpoints("doomed") == []
            # Left: the kept checkpoint's objects, and what this engine's cached scan of
            # the folder still trusts (the doomed files' 3 contents, on disk unchanged,
            # and its root listing): the next snapshot names them without storing.
            assert objects_in(engine) == baseline + 4
            expected = tree_of(work)
            again = await snap(engine, "keep", [work], private, "alice")
            await engine.restore("keep", kept, private=private)
            assert set(tree_of(work)) == {".", "shared.txt"}
            done = await engine.restore("keep", again, private=private)
            assert done.failed == ()
            assert tree_of(work) == expected


async def test_another_process_collecting_does_not_leave_this_ones_cache_pointing_at_nothing(
    tmp_path: Path,
) -> None:
    """Two engines on one data folder (two daemons): B deletes a session and collects
    the objects A's cached scan still trusts; A must not reuse those digests."""
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as a, engine_for(settings) as b:
            (work / "f.txt").write_text("only in s1's checkpoint")
            await snap(a, "s1", [work], private)
            assert await b.delete_all("s1") == 1
            assert objects_in(a) == 0
            second = await snap(a, "s2", [work], private)  # unchanged files, cached in A
            os.unlink(work / "f.txt")
            done = await a.restore("s2", second, private=private)
            assert done.failed == ()
            assert (work / "f.txt").read_text() == "only in s1's checkpoint"
