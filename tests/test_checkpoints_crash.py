"""A SIGKILL in the middle of a restore or a snapshot leaves the folder before or after.

A child process (this file run as a script) opens the engine on the test's data folder
and restores (or snapshots); the test kills it with SIGKILL at a random moment, then
opens the engine itself, which completes any journal the child left. The folder must
then be exactly the tree before or the tree after, and exactly after when the child
died with its journal written (mid-apply). Half the kills are timed from the moment the
journal appears, so the test always hits the apply phase; the count is bounded and
each wait has a deadline. Real time is used: the child is a real process.

A killed snapshot leaves no record that does not restore, and nothing in ``tmp/``
once the next engine has opened.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
import trio
from test_checkpoints_support import (
    DEADLINE,
    diff,
    engine_for,
    export,
    make_settings,
    private_for,
    real_dir,
    snap,
    tree_of,
    users_own,
)

pytestmark = pytest.mark.slow  # its tests start processes

RUNS = 6
SNAPSHOT_RUNS = 4


def _state_a(work: Path) -> None:
    for d in range(20):
        folder = work / f"d{d:02}"
        folder.mkdir()
        for f in range(50):
            (folder / f"f{f:02}.txt").write_text(f"A {d} {f}\n" * 20)


def _state_b(work: Path) -> None:
    """From A: 600 files changed, 200 deleted, 5 folders gone, 300 new files in 10 new
    folders, 100 modes changed."""
    for d in range(12):
        for f in range(50):
            (work / f"d{d:02}" / f"f{f:02}.txt").write_text(f"B {d} {f}\n" * 30)
    for d in range(12, 16):
        for f in range(50):
            os.unlink(work / f"d{d:02}" / f"f{f:02}.txt")
    for d in range(12, 16):
        os.rmdir(work / f"d{d:02}")
    for f in range(50):
        os.unlink(work / "d16" / f"f{f:02}.txt")
    os.rmdir(work / "d16")
    for d in range(10):
        folder = work / "new" / f"n{d}"
        folder.mkdir(parents=True)
        for f in range(30):
            (folder / f"g{f}.txt").write_text(f"new {d} {f}\n")
    for f in range(50):
        for d in (17, 18):
            os.chmod(work / f"d{d:02}" / f"f{f:02}.txt", 0o600)


def _journals(journal: Path) -> list[Path]:
    return list(journal.glob("*.json"))


def _leftovers(work: Path) -> list[str]:
    return [k for k in tree_of(work) if "navi-restore" in k]


async def _child(mode: str, tmp_path: Path, work: Path, checkpoint: str) -> trio.Process:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return await trio.lowlevel.open_process(
        [sys.executable, __file__, mode, str(tmp_path), str(work), checkpoint],
        stdout=-1,  # subprocess.PIPE
        env=env,
    )


async def _wait_line(process: trio.Process, word: bytes) -> None:
    assert process.stdout is not None
    seen = b""
    while word not in seen:
        chunk = await process.stdout.receive_some(256)
        assert chunk, f"the child ended before saying {word!r}: {seen!r}"
        seen += chunk


async def _journal_appears(journal: Path, process: trio.Process) -> bool:
    """Wait (bounded) until the child's journal exists; False when it ended first."""
    while not _journals(journal):
        if process.poll() is not None:
            return False
        await trio.sleep(0.0005)
    return True


async def test_a_restore_killed_at_random_points_is_completed_by_the_next_open(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    journal = settings.data_dir / "checkpoints" / "journal"
    rng = random.Random(2222)
    with trio.fail_after(DEADLINE * 4):
        async with engine_for(settings) as engine:
            _state_a(work)
            users_own(work)  # the user's own files
            a = await snap(engine, "s", [work], private)
            tree_a = tree_of(work)
            _state_b(work)
            users_own(work)
            b = await snap(engine, "s", [work], private)
            tree_b = tree_of(work)
            await engine.restore("s", a, private=private)
            assert tree_of(work) == tree_a

        # Calibrate: how long the apply takes when nothing kills it.
        child = await _child("restore", tmp_path, work, b)
        await _wait_line(child, b"ready")
        assert await _journal_appears(journal, child)
        started = time.monotonic()
        assert await child.wait() == 0
        apply_sec = time.monotonic() - started
        assert tree_of(work) == tree_b

        mid_apply = torn = 0
        for run in range(RUNS):
            async with engine_for(settings) as engine:
                await engine.restore("s", a, private=private)
            assert tree_of(work) == tree_a
            child = await _child("restore", tmp_path, work, b)
            await _wait_line(child, b"ready")
            if run % 2:  # during the apply, at a random point
                if await _journal_appears(journal, child):
                    await trio.sleep(rng.uniform(0, apply_sec * 0.8))
            else:  # anywhere from the start (the scan, the undo checkpoint, the apply)
                await trio.sleep(rng.uniform(0, apply_sec * 3))
            child.send_signal(signal.SIGKILL)
            await child.wait()
            journaled = bool(_journals(journal))
            mid_apply += journaled
            torn += tree_of(work) not in (tree_a, tree_b)  # half done until the next open
            async with engine_for(settings):  # the next open completes the journal
                pass
            now = tree_of(work)
            assert now in (tree_a, tree_b), diff(tree_b, now)
            if journaled:
                assert now == tree_b, f"run {run}: a journal was left, the restore must finish"
            assert not _journals(journal) and _leftovers(work) == []
        assert mid_apply >= RUNS // 4, f"only {mid_apply} kills landed mid-apply"
        assert torn >= 1, "no kill left a half-restored folder: the test proved nothing"


async def test_a_snapshot_killed_at_random_points_leaves_only_whole_checkpoints(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    rng = random.Random(2323)
    with trio.fail_after(DEADLINE * 4):
        _state_a(work)
        child = await _child("snapshot", tmp_path, work, "-")
        await _wait_line(child, b"ready")
        started = time.monotonic()
        assert await child.wait() == 0
        snapshot_sec = time.monotonic() - started
        async with engine_for(settings) as engine:
            assert await engine.delete_all("s") == 1
        seen = []  # the trees the folder had when a child snapshotted it
        for run in range(SNAPSHOT_RUNS):
            (work / "d00" / "f00.txt").write_text(f"run {run}\n")  # something new each time
            seen.append(tree_of(work))
            child = await _child("snapshot", tmp_path, work, "-")
            await _wait_line(child, b"ready")
            await trio.sleep(rng.uniform(0, snapshot_sec))
            child.send_signal(signal.SIGKILL)
            await child.wait()
            async with engine_for(settings) as engine:
                assert os.listdir(engine.folder / "tmp") == []
                # Every checkpoint there is whole: it restores one of those trees.
                for k, info in enumerate(await engine.checkpoints("s")):
                    copy = tmp_path / f"copy-{run}-{k}"
                    assert await export(engine, "s", info.id, work, copy) == []
                    assert tree_of(copy) in seen


async def _child_main(mode: str, base: Path, work: Path, checkpoint: str) -> None:
    from navi_trio.core.checkpoints import open_checkpoints

    settings = make_settings(base)
    private = private_for(settings)
    async with open_checkpoints(settings) as engine:
        print("ready", flush=True)
        if mode == "restore":
            await engine.restore("s", checkpoint, private=private)
        else:
            await engine.snapshot("s", [work], private=private)
    print("done", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    trio.run(_child_main, sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
