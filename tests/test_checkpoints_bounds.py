"""Bounds: a snapshot over one is skipped with its reason; nothing half-made is visible.

- a file over NAVI_CHECKPOINT_MAX_FILE_BYTES (a 200 MB sparse file) is left out of the
  checkpoint, named with the reason, and the checkpoint is still made;
- new content over NAVI_CHECKPOINT_MAX_BYTES, more entries than
  NAVI_CHECKPOINT_MAX_FILES, longer than NAVI_CHECKPOINT_MAX_SEC (a fake clock handed to
  the engine: the bound is the worker thread's clock, not trio's) skip the whole
  snapshot;
- a cancel (Stop) during a snapshot abandons it: no record, nothing in ``tmp/``;
- 10,000 small files snapshot within the default time bound;
- the totals, through real runs (the harness, the fake LLM, the filesystem tool): a
  user's kept checkpoints (NAVI_CHECKPOINT_USER_MAX_BYTES) and everyone's
  (NAVI_CHECKPOINT_TOTAL_MAX_BYTES) hold at most their bound of new content; a round
  over one is skipped with a ``checkpoint_skipped`` warning naming it, and the call runs.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from rewind_kit import FULL, PROFILES, TIMEOUT, calls, say, turn, write
from test_checkpoints_support import (
    DEADLINE,
    engine_for,
    make_settings,
    private_for,
    real_dir,
    snap,
    tree_of,
)

from navi_trio.core.checkpoints import Created, Skipped
from navi_trio.core.checkpoints._objects import FileLock
from navi_trio.testing import open_harness


def _poke(path: Path, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.write(data)


def _head(path: Path, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


async def test_a_200_mb_file_is_left_out_with_its_reason_and_the_checkpoint_is_made(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    (work / "code.py").write_text("x = 1")
    _sparse(work / "big.bin", 200 << 20)
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            outcome = await engine.snapshot("s", [work], private=private)
            assert isinstance(outcome, Created)
            (left,) = outcome.checkpoint.left_out
            assert (left.path, left.size) == ("big.bin", 200 << 20)
            assert "NAVI_CHECKPOINT_MAX_FILE_BYTES" in left.reason
            assert outcome.checkpoint.new_bytes < 1 << 20  # the big file was not read
            # A restore leaves the file it has no copy of as it finds it.
            (work / "code.py").write_text("x = 2")
            _poke(work / "big.bin", b"changed")
            await engine.restore("s", outcome.checkpoint.id, private=private)
            assert (work / "code.py").read_text() == "x = 1"
            assert _head(work / "big.bin", 7) == b"changed"


async def test_a_big_file_made_after_the_checkpoint_is_kept_by_the_restore(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            _sparse(work / "dataset.bin", 200 << 20)
            preview = await engine.preview("s", first, private=private)
            (kept,) = preview.roots[0].kept
            assert kept.path == "dataset.bin" and "no checkpoint holds a copy" in kept.why
            await engine.restore("s", first, private=private, confirm=preview.token)
            assert (work / "dataset.bin").stat().st_size == 200 << 20


async def test_new_content_over_the_byte_bound_skips_the_snapshot(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, checkpoint_max_bytes=10_000)
    work = real_dir(tmp_path / "work")
    (work / "a.txt").write_text("a" * 6000)
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            (work / "b.txt").write_text("b" * 6000)  # 6000 new: fine
            await snap(engine, "s", [work], private)
            (work / "c.txt").write_text("c" * 6000)
            (work / "d.txt").write_text("d" * 6000)  # 12000 new: over
            outcome = await engine.snapshot("s", [work], private=private)
            assert isinstance(outcome, Skipped) and outcome.code == "too_large"
            assert "NAVI_CHECKPOINT_MAX_BYTES" in outcome.reason
            assert len(await engine.checkpoints("s")) == 2
            # Over the bound, a preview still compares (without storing) and says the
            # restore cannot be undone; the restore works.
            preview = await engine.preview("s", first, private=private)
            assert preview.undo is None and "NAVI_CHECKPOINT_MAX_BYTES" in preview.undo_skipped
            assert preview.roots[0].deleted == 3
            await engine.restore("s", first, private=private, confirm=preview.token)
            assert set(tree_of(work)) == {".", "a.txt"}


async def test_too_many_files_skips_the_snapshot(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, checkpoint_max_files=20)
    work = real_dir(tmp_path / "work")
    for k in range(25):
        (work / f"f{k}").write_text(str(k))
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            outcome = await engine.snapshot("s", [work], private=private)
            assert isinstance(outcome, Skipped) and outcome.code == "too_many_files"
            assert "25 files and folders" in outcome.reason
            assert await engine.checkpoints("s") == []


class StepClock:
    """A clock that moves `step` seconds each time it is read (from any thread)."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            self.now += self.step
            return self.now


async def test_a_snapshot_over_its_time_bound_is_skipped_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path, checkpoint_max_sec=10.0)
    work = real_dir(tmp_path / "work")
    for k in range(60):
        (work / f"d{k % 3}").mkdir(exist_ok=True)
        (work / f"d{k % 3}" / f"f{k}").write_text(str(k))
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings, clock=StepClock(1.0)) as engine:
            outcome = await engine.snapshot("s", [work], private=private)
            assert isinstance(outcome, Skipped) and outcome.code == "too_slow"
            assert "NAVI_CHECKPOINT_MAX_SEC=10" in outcome.reason
            assert await engine.checkpoints("s") == []
            assert os.listdir(engine.folder / "tmp") == []
        # The same folder, a clock that keeps time: complete and restorable.
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            expected = tree_of(work)
            os.unlink(work / "d0" / "f0")
            await engine.restore("s", first, private=private)
            assert tree_of(work) == expected


async def test_a_cancel_during_a_snapshot_abandons_it_cleanly(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    for k in range(200):
        (work / f"f{k}").write_text(str(k) * 100)
    private = private_for(settings)
    scope = trio.CancelScope()
    reads = 0

    def clock() -> float:
        """Cancels the snapshot's scope from its worker thread, mid-walk."""
        nonlocal reads
        reads += 1
        if reads == 5:
            trio.from_thread.run_sync(scope.cancel)
        return 0.0

    with trio.fail_after(DEADLINE):
        async with engine_for(settings, clock=clock) as engine:
            with scope:
                await engine.snapshot("s", [work], private=private)
            assert scope.cancelled_caught
            assert await engine.checkpoints("s") == []
            assert os.listdir(engine.folder / "tmp") == []
            # Not poisoned: the next snapshot holds every file.
            first = await snap(engine, "s", [work], private)
            assert (await engine.get("s", first)).files == 200


async def test_checkpoints_switched_off_skip_with_the_setting_named(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, checkpoints=False)
    work = real_dir(tmp_path / "work")
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            outcome = await engine.snapshot("s", [work], private=private_for(settings))
            assert isinstance(outcome, Skipped) and "NAVI_CHECKPOINTS=false" in outcome.reason


async def test_ten_thousand_small_files_snapshot_within_the_time_bound(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    for d in range(100):
        folder = work / f"pkg{d:03}"
        folder.mkdir()
        for f in range(100):
            (folder / f"mod{f:03}.py").write_text(f"value = {d * 100 + f}\n")
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await engine.snapshot("s", [work], private=private)
            assert isinstance(first, Created), first
            assert first.checkpoint.files == 10_000
            assert first.seconds < settings.checkpoint_max_sec
            (work / "pkg050" / "mod050.py").write_text("value = 'changed'\n")
            second = await engine.snapshot("s", [work], private=private)
            assert isinstance(second, Created) and second.checkpoint.changed == 1
            assert second.seconds < 2.0


@pytest.mark.parametrize("bad", [Path("relative"), Path("/a/../b")])
async def test_a_root_that_is_not_an_absolute_real_path_is_refused(
    tmp_path: Path, bad: Path
) -> None:
    from navi_trio.core.checkpoints import CheckpointError

    settings = make_settings(tmp_path)
    async with engine_for(settings) as engine:
        with pytest.raises(CheckpointError, match="absolute real path"):
            await engine.snapshot("s", [bad], private=private_for(settings))


FILE = 60_000  # bytes of new content each session's folder brings


async def test_a_users_checkpoints_and_all_checkpoints_have_a_total(tmp_path: Path) -> None:
    folders = {}
    for sid in ("a1", "a2", "b1", "b2"):
        folders[sid] = real_dir(tmp_path / f"work-{sid}")
        (folders[sid] / "data.bin").write_bytes(os.urandom(FILE))  # no two alike
    replies = [r for i in range(5) for r in (calls(write(f"w{i}.txt", "w\n")), say("ok"))]
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, profiles=PROFILES,
            checkpoint_user_max_bytes=100_000, checkpoint_total_max_bytes=150_000,
        ) as h:  # fmt: skip
            store = h.runtime.store
            ids = {"a": await h.user("alice"), "b": await h.user("bob")}
            for sid in folders:
                await store.create_session(f"s-{sid}", profile_id="general", user_id=ids[sid[0]])

            async def write_in(sid: str) -> list[dict[str, Any]]:
                user = ids[sid[0]]
                frames = await turn(h, f"s-{sid}", "write", cwd=folders[sid], user_id=user,
                                    **FULL)  # fmt: skip
                assert frames[-1]["reason"] == "complete"
                return [f for f in frames if f["type"] in ("checkpoint_created", "warning")]

            def skipped(said: list[dict[str, Any]]) -> str:
                (warning,) = [f for f in said if f.get("code") == "checkpoint_skipped"]
                assert not [f for f in said if f["type"] == "checkpoint_created"]
                return str(warning["message"])

            assert [f["type"] for f in await write_in("a1")] == ["checkpoint_created"]
            # Alice's second session: her checkpoints would pass her total.
            said = skipped(await write_in("a2"))
            assert "NAVI_CHECKPOINT_USER_MAX_BYTES" in said and "cannot be rewound" in said
            assert (folders["a2"] / "w1.txt").exists()  # the call ran anyway
            # Bob has his own total; the second of his would pass everyone's first.
            assert [f["type"] for f in await write_in("b1")] == ["checkpoint_created"]
            said = skipped(await write_in("b2"))
            assert "NAVI_CHECKPOINT_TOTAL_MAX_BYTES" in said
            engine = h.runtime.checkpoints.engine
            assert FILE * 2 <= await engine.stored_bytes() <= 150_000
            # Alice's first session goes, and with it its checkpoints: room again.
            await h.runtime.session_service.delete("s-a1")
            assert [f["type"] for f in await write_in("a2")] == ["checkpoint_created"]


@pytest.mark.parametrize("bound", ["user", "total"])
async def test_snapshots_running_at_once_cannot_pass_a_total_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: str
) -> None:
    # Two sessions (alice's both, or alice's and bob's), in two folders, each bringing
    # 60,000 new bytes against a total of 100,000 (alice's, or everyone's); their
    # snapshots are held until both have started, so each reads the store before the
    # other stored anything. The room the first reserved is
    # spent for the second: one checkpoint, one skipped (before: both, 120,000 bytes).
    folders = {sid: real_dir(tmp_path / f"work-{sid}") for sid in ("a1", "a2")}
    for folder in folders.values():
        (folder / "data.bin").write_bytes(os.urandom(FILE))
    replies = [calls(write("w0.txt", "w\n")), calls(write("w1.txt", "w\n")), say("ok"), say("ok")]
    bounds: dict[str, Any] = {f"checkpoint_{bound}_max_bytes": 100_000}
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, profiles=PROFILES,
            **bounds,
        ) as h:  # fmt: skip
            alice = await h.user("alice")
            owners = {"a1": alice, "a2": alice if bound == "user" else await h.user("bob")}
            engine = h.runtime.checkpoints.engine
            snapshot = engine.snapshot
            started: list[str] = []
            both = trio.Event()

            async def held_until_both(session_id: str, *args: Any, **kwargs: Any) -> Any:
                started.append(session_id)
                if len(started) == 2:
                    both.set()
                await both.wait()
                return await snapshot(session_id, *args, **kwargs)

            monkeypatch.setattr(engine, "snapshot", held_until_both)
            said: dict[str, list[str]] = {}

            async def write_in(sid: str) -> None:
                user = owners[sid]
                await h.runtime.store.create_session(sid, profile_id="general", user_id=user)
                frames = await turn(h, sid, "write", cwd=folders[sid], user_id=user, **FULL)
                assert frames[-1]["reason"] == "complete", frames[-1]
                said[sid] = [str(f.get("code", f["type"])) for f in frames
                             if f["type"] in ("checkpoint_created", "warning")]  # fmt: skip

            async with trio.open_nursery() as nursery:
                for sid in folders:
                    nursery.start_soon(write_in, sid)
            assert sorted(started) == sorted(folders)
            assert sorted(said.values()) == [["checkpoint_created"], ["checkpoint_skipped"]], said
            assert FILE <= await engine.stored_bytes() <= 100_000


async def test_what_killed_restores_left_beside_the_journals_goes_at_the_next_open(
    tmp_path: Path,
) -> None:
    """A kill while a journal was being written leaves its temp file; one before the
    journal (or between its removal and its lock's) leaves the lock alone. Nothing read
    them again, and they stayed for ever. The next open with no restore anywhere removes
    them; one while another process restores (the store's lock held shared) keeps them."""
    settings = make_settings(tmp_path)
    journal = settings.data_dir / "checkpoints" / "journal"
    left = [".0123456789abcdef.json.deadbeef.tmp", "0123456789abcdef.lock"]
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            folder = engine.folder
        for name in left:
            (journal / name).write_bytes(b"{")
        restoring = FileLock(folder / "lock")
        restoring.acquire(exclusive=False)  # a restore going on in another process
        try:
            async with engine_for(settings):
                pass
            assert sorted(os.listdir(journal)) == sorted(left)
        finally:
            restoring.release()
        async with engine_for(settings):
            pass
        assert os.listdir(journal) == []
