"""Who changed what: the engine's marks, and a restore that puts back only the owner's.

The engine is the real one on real folders under tmp_path, with inotify: what changes
inside `engine.calling` (an owner's writing call) is the owner's, what changes outside
it someone else's. Python file operations and real shell commands (``mkdir -p``, ``mv``
of a folder, ``rm -r``, ``chmod``) do the changes. The `Ledger`'s own bounds (how many
owners a folder marks for, how big a marks file grows) are held on the ledger itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from test_checkpoints_support import (
    DEADLINE,
    engine_for,
    make_settings,
    private_for,
    real_dir,
    sh,
    snap,
    tree_of,
    users_own,
)

from navi_trio.core.checkpoints import RootChanges, Scope
from navi_trio.core.checkpoints import _marks as marks_module
from navi_trio.core.checkpoints._marks import NAVI, OTHER, Ledger
from navi_trio.core.checkpoints._state import Batch
from navi_trio.tools.roots import Root


def only_root(changes: tuple[RootChanges, ...]) -> RootChanges:
    (root,) = changes
    return root


@pytest.mark.slow
async def test_a_scoped_restore_undoes_the_owners_calls_and_keeps_what_others_did(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    private = private_for(settings)
    work = real_dir(tmp_path / "w")
    (work / "d" / "in").mkdir(parents=True)
    (work / "d" / "in" / "f.txt").write_text("in d\n")
    (work / "gone").mkdir()
    for n in range(3):
        (work / "gone" / f"g{n}.txt").write_text(f"{n}\n")
    (work / "mine.txt").write_text("the person's\n")
    (work / "run.sh").write_text("#!/bin/sh\n")
    users_own(work)  # the user's own files
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            before = tree_of(work)
            with Root.open(work, "the working folder") as root:
                async with engine.calling("s", [root], private=private):
                    sh(work, "sh", "-c", "mkdir -p new/deep && echo n > new/deep/n.txt")
                    sh(work, "mv", "d", "e")
                    sh(work, "rm", "-r", "gone")
                    sh(work, "chmod", "700", "run.sh")
            # Someone else, between calls: in the folder navi made, and an old file.
            (work / "new" / "deep" / "theirs.txt").write_text("theirs\n")
            (work / "mine.txt").write_text("the person's, edited\n")
            preview = await engine.preview("s", first, private=private, scope=Scope())
            root_changes = only_root(preview.roots)
            assert set(root_changes.others) == {"mine.txt", "new/deep/theirs.txt"}
            assert root_changes.conflicts == ()
            await engine.restore("s", first, private=private, confirm=preview.token, scope=Scope())
            now = tree_of(work)
            expected = {
                **before,
                "mine.txt": now["mine.txt"],
                "new": now["new"],
                "new/deep": now["new/deep"],
                "new/deep/theirs.txt": now["new/deep/theirs.txt"],
            }
            assert now == expected
            assert (work / "mine.txt").read_text() == "the person's, edited\n"
            assert not (work / "new" / "deep" / "n.txt").exists()


async def test_another_owners_calls_on_the_same_folder_are_someone_elses(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    private = private_for(settings)
    work = real_dir(tmp_path / "w")
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            mine = await snap(engine, "s", [work], private)
            theirs = await snap(engine, "t", [work], private)
            with Root.open(work, "the working folder") as root:
                async with engine.calling("s", [root], private=private):
                    (work / "by-s.txt").write_text("s\n")
                async with engine.calling("t", [root], private=private):
                    (work / "by-t.txt").write_text("t\n")
            preview = await engine.preview("s", mine, private=private, scope=Scope())
            root_changes = only_root(preview.roots)
            assert [(c.path, c.what) for c in root_changes.changes] == [("by-s.txt", "deleted")]
            assert root_changes.others == ("by-t.txt",)
            preview = await engine.preview("t", theirs, private=private, scope=Scope())
            root_changes = only_root(preview.roots)
            assert [(c.path, c.what) for c in root_changes.changes] == [("by-t.txt", "deleted")]
            assert root_changes.others == ("by-s.txt",)


FIRST = "0" * 24  # the owner's one checkpoint, for the ledger's own tests


def ledger_at(tmp_path: Path) -> Ledger:
    return Ledger(lambda owner: tmp_path / owner, lambda owner: FIRST)


def test_a_drain_that_cannot_name_paths_marks_every_path_for_its_time(tmp_path: Path) -> None:
    ledger = ledger_at(tmp_path)
    root = Path("/w")
    ledger.register("s", [root])
    ledger.note(root, Batch(frozenset({"a.txt"})))  # someone else's
    ledger.begin("s", [root])
    ledger.note(root, Batch(everything=True))  # an overflow while a call ran
    ledger.end("s", [root])
    marks = ledger.since("s", FIRST)[root]
    assert marks.flags("a.txt", None) == NAVI | OTHER
    assert marks.flags("anything/else", None) == NAVI


def test_a_folder_marks_for_its_latest_owners_only(tmp_path: Path) -> None:
    ledger = ledger_at(tmp_path)
    root = Path("/w")
    owners = [f"s{n}" for n in range(marks_module.OWNERS_MAX + 8)]
    ledger.begin(owners[0], [root])  # one with a call running is never dropped
    for owner in owners:
        ledger.register(owner, [root])
    ledger.note(root, Batch(frozenset({"x"})))
    marked = sorted(p.name for p in tmp_path.iterdir() if (p / marks_module.MARKS).exists())
    assert len(marked) == marks_module.OWNERS_MAX
    assert owners[0] in marked and set(owners[-(marks_module.OWNERS_MAX - 1) :]) <= set(marked)


def test_a_marks_file_stays_bounded_and_keeps_what_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(marks_module, "FILE_MAX", 64 << 10)
    ledger = ledger_at(tmp_path)
    root = Path("/w")
    ledger.register("s", [root])
    for n in range(400):
        ledger.begin("s", [root])
        ledger.note(root, Batch(frozenset({f"navi-{n}-{'x' * 200}.txt"})))
        ledger.end("s", [root])
        ledger.note(root, Batch(frozenset({f"other-{n}.txt"})))
    path = tmp_path / "s" / marks_module.MARKS
    assert path.stat().st_size <= marks_module.FILE_MAX
    for line in path.read_text().splitlines():
        json.loads(line)
    marks = ledger.since("s", FIRST)[root]
    # Merged into whole-folder marks: every change of that time is a conflict now.
    assert marks.flags("navi-0-" + "x" * 200 + ".txt", None) == NAVI | OTHER
    assert marks.flags("never.txt", None) & OTHER
