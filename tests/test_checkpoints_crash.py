"""A SIGKILL in the middle of a restore or a snapshot leaves the folder before or after.

A child process (forked from this file run as a script, which imported the engine once
for the test) opens the engine on the test's data folder and restores (or snapshots),
each restore to the other of two trees (A to B, B to A: no restore back between kills);
the test kills it with SIGKILL at a random moment, then
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
import select
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from test_checkpoints_support import (
    DEADLINE,
    Tree,
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

from navi_trio.core.checkpoints import open_checkpoints

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


def _leftovers(tree: Tree) -> list[str]:
    return [k for k in tree if "navi-restore" in k]


class Warm:
    """One process per test that has imported the engine once and forks a child for each
    restore or snapshot (this file run with ``--warm``). The child that is killed is still
    a real process of its own: its own pid, its own engine opened after the fork, a real
    SIGKILL; only the Python start (1 to 2 s each on a busy machine, most of the time
    between kills) is paid once. Its lines on the shared stdout: ``pid N`` from the warm
    process, ``ready`` and ``done`` from the child, ``exit CODE`` once the test asks it
    to reap the child (until then the pid cannot be reused)."""

    def __init__(self, proc: trio.Process) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.stdin = proc.stdin
        self.stdout = proc.stdout
        self.buffer = b""
        self.lines: list[str] = []

    async def until(self, prefix: str) -> str:
        """The first line not yet taken that starts with `prefix` (read as needed)."""
        while True:
            for i, line in enumerate(self.lines):
                if line.startswith(prefix):
                    return self.lines.pop(i)
            while b"\n" not in self.buffer:
                chunk = await self.stdout.receive_some(256)
                assert chunk, f"the warm process ended before {prefix!r}: {self.lines}"
                self.buffer += chunk
            *done, self.buffer = self.buffer.split(b"\n")
            self.lines += [line.decode() for line in done]

    async def child(self, mode: str, checkpoint: str) -> Child:
        self.lines.clear()
        await self.stdin.send_all(f"{mode} {checkpoint}\n".encode())
        pid = int((await self.until("pid ")).split()[1])
        return Child(self, pid, os.pidfd_open(pid))


class Child:
    """A forked child of `Warm`: what the tests use of a trio.Process."""

    def __init__(self, warm: Warm, pid: int, pidfd: int) -> None:
        self.warm, self.pid, self.pidfd = warm, pid, pidfd

    def poll(self) -> int | None:
        """None while it runs (its pidfd turns readable when it ends)."""
        return 0 if select.select([self.pidfd], [], [], 0)[0] else None

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)  # not reaped before `wait`: the pid is still its own

    async def wait(self) -> int:
        await trio.lowlevel.wait_readable(self.pidfd)
        await self.warm.stdin.send_all(b"wait\n")
        code = int((await self.warm.until("exit ")).split()[1])
        os.close(self.pidfd)
        return code


@asynccontextmanager
async def _warm(tmp_path: Path, work: Path) -> AsyncIterator[Warm]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = await trio.lowlevel.open_process(
        [sys.executable, __file__, "--warm", str(tmp_path), str(work)],
        stdin=-1, stdout=-1, env=env,  # subprocess.PIPE
    )  # fmt: skip
    try:
        yield Warm(proc)
    finally:
        proc.kill()  # and with it what it forked: its children are already reaped
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await proc.wait()


async def _wait_line(child: Child, word: str) -> None:
    await child.warm.until(word)


async def _journal_appears(journal: Path, process: Child) -> bool:
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
        trees = {a: tree_a, b: tree_b}

        async with _warm(tmp_path, work) as warm:
            # Calibrate: how long the apply takes when nothing kills it (B back to A).
            child = await warm.child("restore", a)
            await _wait_line(child, "ready")
            assert await _journal_appears(journal, child)
            started = time.monotonic()
            assert await child.wait() == 0
            apply_sec = time.monotonic() - started
            now = tree_of(work)
            assert now == tree_a

            mid_apply = torn = 0
            for run in range(RUNS):
                # To the other tree: A to B, B to A (a kill before the restore began left
                # the folder where it was, and the next run restores the same way again).
                before, target = (tree_a, b) if now == tree_a else (tree_b, a)
                after = trees[target]
                child = await warm.child("restore", target)
                await _wait_line(child, "ready")
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
                assert now in (before, after), diff(after, now)
                if journaled:
                    assert now == after, f"run {run}: a journal was left, the restore must finish"
                assert not _journals(journal) and _leftovers(now) == []
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
        async with _warm(tmp_path, work) as warm:
            child = await warm.child("snapshot", "-")
            await _wait_line(child, "ready")
            started = time.monotonic()
            assert await child.wait() == 0
            snapshot_sec = time.monotonic() - started
            async with engine_for(settings) as engine:
                assert await engine.delete_all("s") == 1
            seen = []  # the trees the folder had when a child snapshotted it
            for run in range(SNAPSHOT_RUNS):
                (work / "d00" / "f00.txt").write_text(f"run {run}\n")  # something new each time
                seen.append(tree_of(work))
                child = await warm.child("snapshot", "-")
                await _wait_line(child, "ready")
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
    settings = make_settings(base)
    private = private_for(settings)
    async with open_checkpoints(settings) as engine:
        print("ready", flush=True)
        if mode == "restore":
            await engine.restore("s", checkpoint, private=private)
        else:
            await engine.snapshot("s", [work], private=private)
    print("done", flush=True)


def _warm_main(base: Path, work: Path) -> None:
    """`Warm`'s process: a line ``MODE CHECKPOINT`` forks a child that runs it; ``wait``
    reaps the last child and says how it ended."""
    pid = 0
    while line := sys.stdin.readline():
        words = line.split()
        if words == ["wait"]:
            _, status = os.waitpid(pid, 0)
            print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                trio.run(_child_main, words[0], base, work, words[1])
                code = 0
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(f"pid {pid}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    _warm_main(Path(sys.argv[2]), Path(sys.argv[3]))
