"""A SIGKILL in the middle of a restore or a snapshot leaves the folder before or after.

A child process (forked from this file run as a script, which imported the engine once
for the test) opens the engine on the test's data folder and restores (or snapshots),
each restore to the other of two trees (A to B, B to A: no restore back between kills).
The restore's child kills itself at a point the test chose (`_kill_at` wraps, in the
child only, the engine's journal write or its per-step apply): before its journal is
written, right after, after the first, the middle or the all-but-last step of the apply;
and, for some, the next open's recovery of that journal is killed the same way. Each
run asserts what its point must leave: the journal or not, the folder half restored or
not, and after the test's own open (which completes any journal) exactly the tree
before or after. A few kills at random moments add what the chosen points miss, with
only the asserts that hold wherever they land. Real time is used (the children are
real processes), but no assert depends on it.

A killed snapshot (killed by itself as its pack is to be published, before or after
its record is written; and a few at random moments) leaves no record that does not
restore, its record only when it was written, and nothing in ``tmp/`` once the next
engine has opened.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

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

from navi_trio.core.checkpoints import _apply, _records, open_checkpoints
from navi_trio.core.checkpoints._objects import write_atomic
from navi_trio.core.checkpoints._result import ScanResult

pytestmark = pytest.mark.slow  # its tests start processes

RANDOM_RUNS = 2
SNAPSHOT_RUNS = 2


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

    async def child(self, mode: str, checkpoint: str, kill_at: str = "-") -> Child:
        self.lines.clear()
        await self.stdin.send_all(f"{mode} {checkpoint} {kill_at}\n".encode())
        pid = int((await self.until("pid ")).split()[1])
        return Child(self, pid, os.pidfd_open(pid))


class Child:
    """A forked child of `Warm`: what the tests use of a trio.Process."""

    def __init__(self, warm: Warm, pid: int, pidfd: int) -> None:
        self.warm, self.pid, self.pidfd = warm, pid, pidfd

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


# Where a restore's child kills itself (`_kill_at`), and where the next open's recovery
# kills itself too ("-": it completes); what the folder must be after the first kill:
# the journal left or not, and half restored (neither tree) or not.
POINTS = [
    ("journal:before", "-", False, False),  # the undo checkpoint made, nothing else
    ("journal:after", "-", True, False),  # the plan on disk, no file touched yet
    ("step:1", "-", True, True),
    ("step:half", "step:1", True, True),  # the recovery killed too, at its first step
    ("step:last", "step:last", True, True),  # all but the last step, and the same again
]


async def _kill_itself(warm: Warm, mode: str, target: str, point: str) -> None:
    child = await warm.child(mode, target, point)
    assert await child.wait() == -signal.SIGKILL, f"{mode} never reached {point}"


async def test_a_restore_killed_at_each_point_is_completed_by_the_next_open(
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

        def way(now: Tree) -> tuple[Tree, str, Tree]:
            """To the other tree: A to B, B to A (a run that left the folder where it
            was restores the same way again)."""
            target = b if now == tree_a else a
            return now, target, trees[target]

        now = tree_b
        apply_sec = 0.0  # how long a whole apply takes (for the random kills)
        async with _warm(tmp_path, work) as warm:
            for run, (point, again, journaled, torn) in enumerate(POINTS):
                before, target, after = way(now)
                await _kill_itself(warm, "restore", target, point)
                assert bool(_journals(journal)) == journaled, f"run {run}: {point}"
                now = tree_of(work)
                assert (now not in (before, after)) == torn, f"run {run}: {point}"
                assert now == before or torn, diff(before, now)
                if again != "-":  # the next open dies in its recovery, with the journal
                    await _kill_itself(warm, "open", "-", again)
                    assert _journals(journal), f"run {run}: {again}"
                    assert tree_of(work) not in (before, after), f"run {run}: {again}"
                started = time.monotonic()
                async with engine_for(settings):  # the next open completes the journal
                    pass
                if point == "journal:after":  # the whole apply, by the recovery
                    apply_sec = time.monotonic() - started
                now = tree_of(work)
                expected = after if journaled else before
                assert now == expected, f"run {run}: {point}, {again}: {diff(expected, now)}"
                assert not _journals(journal) and _leftovers(now) == []

            # Kills at random moments too (the scan, the undo checkpoint, the apply):
            # wherever one lands, the next open leaves one tree or the other.
            for run in range(RANDOM_RUNS):
                before, target, after = way(now)
                child = await warm.child("restore", target)
                await _wait_line(child, "ready")
                await trio.sleep(rng.uniform(0, apply_sec * 3))
                child.send_signal(signal.SIGKILL)
                await child.wait()
                left = bool(_journals(journal))
                async with engine_for(settings):
                    pass
                now = tree_of(work)
                assert now in (before, after), diff(after, now)
                if left:
                    assert now == after, f"random run {run}: a journal was left"
                assert not _journals(journal) and _leftovers(now) == []


# Where a snapshot's child kills itself (`_kill_at`); then whether tmp/ holds what it
# was writing (its pack, not yet published) and whether its record was written.
SNAPSHOT_POINTS = [
    ("scan:finish", True, False),  # everything stored in the pack, in tmp/
    ("record:before", False, False),  # the pack published, no record naming it
    ("record:after", False, True),
]


async def test_a_snapshot_killed_at_each_point_leaves_only_whole_checkpoints(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    tmp = settings.data_dir / "checkpoints" / "tmp"
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
            points = SNAPSHOT_POINTS + [("random", None, None)] * SNAPSHOT_RUNS
            for run, (point, tmp_left, recorded) in enumerate(points):
                (work / "d00" / "f00.txt").write_text(f"run {run}\n")  # something new each time
                seen.append(tree_of(work))
                if point == "random":  # wherever it lands, what follows holds
                    child = await warm.child("snapshot", "-")
                    await _wait_line(child, "ready")
                    await trio.sleep(rng.uniform(0, snapshot_sec))
                    child.send_signal(signal.SIGKILL)
                    await child.wait()
                else:
                    await _kill_itself(warm, "snapshot", "-", point)
                    assert bool(os.listdir(tmp)) == tmp_left, f"run {run}: {point}"
                async with engine_for(settings) as engine:
                    assert os.listdir(tmp) == []
                    # Every checkpoint there is whole: it restores one of those trees.
                    restored = []
                    for k, info in enumerate(await engine.checkpoints("s")):
                        copy = tmp_path / f"copy-{run}-{k}"
                        assert await export(engine, "s", info.id, work, copy) == []
                        restored.append(tree_of(copy))
                    assert all(tree in seen for tree in restored)
                    if recorded is not None:
                        assert (seen[-1] in restored) == recorded, f"run {run}: {point}"


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_at(point: str) -> None:
    """Make this child (only: it is a fork) SIGKILL itself at `point` of a restore's
    apply or of a recovery: ``journal:before`` / ``journal:after`` its journal is
    written, ``step:1`` / ``step:half`` / ``step:last`` after the first, the middle or
    the all-but-last step of its plan; of a snapshot: ``scan:finish`` as its pack is to
    be published, ``record:before`` / ``record:after`` its record is written; ``-``:
    nowhere. The engine's own functions are wrapped, so the steps are the product's."""
    where, _, at = point.partition(":")
    patch = pytest.MonkeyPatch()  # never undone: the child ends with os._exit
    if where in ("journal", "record"):

        def written(path: Path, data: bytes, *, sync: bool = False) -> None:
            if at == "before":
                _die()
            write_atomic(path, data, sync=sync)
            _die()

        patch.setattr(_apply if where == "journal" else _records, "write_atomic", written)
    elif point == "scan:finish":
        patch.setattr(ScanResult, "finish", lambda self: _die())
    elif where == "step":
        apply_ops, one = _apply.apply_ops, _apply._one
        steps = {"done": 0, "stop": 0}

        def counted_ops(
            objects: Any, root_fd: int, ops: list[Any], jid: str, **kw: Any
        ) -> list[Any]:
            steps["done"] = 0
            steps["stop"] = {"1": 1, "half": len(ops) // 2, "last": len(ops) - 1}[at]
            result: list[Any] = apply_ops(objects, root_fd, ops, jid, **kw)
            return result

        def counted_one(*args: Any) -> None:
            try:
                one(*args)
            finally:  # a step that failed is done too (the apply reports it, goes on)
                steps["done"] += 1
                if steps["done"] == steps["stop"]:
                    _die()

        patch.setattr(_apply, "apply_ops", counted_ops)
        patch.setattr(_apply, "_one", counted_one)
    else:
        assert point == "-", point


async def _child_main(mode: str, base: Path, work: Path, checkpoint: str, point: str) -> None:
    settings = make_settings(base)
    private = private_for(settings)
    _kill_at(point)
    async with open_checkpoints(settings) as engine:
        print("ready", flush=True)
        if mode == "restore":
            await engine.restore("s", checkpoint, private=private)
        elif mode == "snapshot":
            await engine.snapshot("s", [work], private=private)
    print("done", flush=True)


def _warm_main(base: Path, work: Path) -> None:
    """`Warm`'s process: a line ``MODE CHECKPOINT KILL_AT`` forks a child that runs it
    (MODE ``open``: only opens the engine, which recovers); ``wait`` reaps the last child
    and says how it ended."""
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
                trio.run(_child_main, words[0], base, work, words[1], words[2])
                code = 0
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(f"pid {pid}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    _warm_main(Path(sys.argv[2]), Path(sys.argv[3]))
