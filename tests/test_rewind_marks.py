"""A files rewind puts back only what the session's own calls changed: a file the person
made or edited between turns (as an editor would) is theirs and stays; one both changed
is a conflict, kept as the person left it unless the rewind asks to restore it.

Real runs through the fake LLM over HTTP (`open_harness`), real folders under tmp_path,
the model writing with `filesystem` and with `terminal` commands (a new folder, a move);
the "person" writes with plain file calls between turns. Every test has an absolute
`fail_after`; nothing sleeps.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import trio
from rewind_kit import FULL, PROFILES, TIMEOUT, calls, run, say, turn, write

from navi_trio.core.checkpoints import RootChanges
from navi_trio.core.history import RewindPreview, Target
from navi_trio.errors import ProtocolError
from navi_trio.testing import Harness, open_harness

SID = "s-marks"


async def user_ids(h: Harness) -> list[str]:
    messages = await h.runtime.store.load_messages(SID)
    return [m["id"] for m in messages if m["role"] == "user"]


async def files_preview(
    h: Harness, target: Target, work: Path
) -> tuple[RewindPreview, RootChanges]:
    """The preview of a files rewind, and what it says of the folder `work`."""
    preview = await h.runtime.rewinds.preview(SID, target)
    assert preview.files is not None, preview.files_note
    (root,) = [r for r in preview.files.roots if r.root == work]
    return preview, root


async def bring_back(h: Harness, branch: str) -> None:
    """Undo a rewind: its branch's files back."""
    undo = Target(branch=branch, restore="files")
    preview = await h.runtime.rewinds.preview(SID, undo)
    await h.runtime.rewinds.apply(SID, undo, preview.token)


def folder(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("alpha\n")
    return work.resolve()


@pytest.mark.slow
async def test_files_made_by_hand_between_turns_survive_a_rewind_to_before_both(
    tmp_path: Path,
) -> None:
    work = folder(tmp_path)
    replies = [
        calls(write("a.txt", "alpha, by navi\n")),
        say("one"),
        calls(run("mkdir -p out/deep && echo o > out/deep/o.txt && mv a.txt moved.txt")),
        say("two"),
    ]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            await turn(h, SID, "first", cwd=work, **FULL)
            (work / "budget.json").write_text('{"by": "hand"}\n')  # the person, in an editor
            await turn(h, SID, "second", cwd=work, **FULL)
            (work / "web-replies.json").write_text("[]\n")
            (work / "out" / "deep" / "mine.txt").write_text("mine\n")  # in navi's new folder
            first, _ = await user_ids(h)
            target = Target(to=first, restore="files")
            preview, root = await files_preview(h, target, work)
            changed = {c.path for c in root.changes}
            assert "budget.json" not in changed and "web-replies.json" not in changed
            assert {"budget.json", "web-replies.json", "out/deep/mine.txt"} <= set(root.others)
            assert root.conflicts == ()
            await h.runtime.rewinds.apply(SID, target, preview.token)
            # Navi's changes are undone; the person's files are all still there.
            assert (work / "a.txt").read_text() == "alpha\n"
            assert not (work / "moved.txt").exists()
            assert not (work / "out" / "deep" / "o.txt").exists()
            assert (work / "budget.json").read_text() == '{"by": "hand"}\n'
            assert (work / "web-replies.json").read_text() == "[]\n"
            assert (work / "out" / "deep" / "mine.txt").read_text() == "mine\n"


async def test_a_file_navi_wrote_and_the_person_then_edited_is_a_conflict_kept_by_default(
    tmp_path: Path,
) -> None:
    work = folder(tmp_path)
    replies = [calls(write("notes.txt", "by navi\n"), write("a.txt", "navi's a\n")), say("ok")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            await turn(h, SID, "write notes", cwd=work, **FULL)
            (work / "notes.txt").write_text("by navi, then edited by hand\n")
            (first,) = await user_ids(h)
            target = Target(to=first, restore="files")
            preview, root = await files_preview(h, target, work)
            assert root.conflicts == ("notes.txt",) and root.conflicts_count == 1
            assert [c.path for c in root.changes] == ["a.txt"]
            event = await h.runtime.rewinds.apply(SID, target, preview.token)
            assert (work / "notes.txt").read_text() == "by navi, then edited by hand\n"
            assert (work / "a.txt").read_text() == "alpha\n"
            # The undo brings navi's a.txt back and leaves the person's file alone.
            await bring_back(h, event.undo)
            assert (work / "a.txt").read_text() == "navi's a\n"
            assert (work / "notes.txt").read_text() == "by navi, then edited by hand\n"


async def test_a_conflict_is_restored_when_the_rewind_asks_for_it(tmp_path: Path) -> None:
    work = folder(tmp_path)
    replies = [calls(write("notes.txt", "by navi\n")), say("ok")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            await turn(h, SID, "write notes", cwd=work, **FULL)
            (work / "notes.txt").write_text("edited by hand\n")
            (first,) = await user_ids(h)
            target = Target(to=first, restore="files", conflicts="restore")
            preview, root = await files_preview(h, target, work)
            assert root.conflicts == ("notes.txt",)
            assert [(c.path, c.what) for c in root.changes] == [("notes.txt", "deleted")]
            # The token is the choice's: one for "keep" does not apply "restore".
            keep = await h.runtime.rewinds.preview(SID, Target(to=first, restore="files"))
            assert keep.token != preview.token
            event = await h.runtime.rewinds.apply(SID, target, preview.token)
            assert not (work / "notes.txt").exists()
            # Nothing is lost: the branch brings the person's version back.
            await bring_back(h, event.undo)
            assert (work / "notes.txt").read_text() == "edited by hand\n"
            with pytest.raises(ProtocolError, match="conflicts"):
                Target(to=first, conflicts="theirs")


@pytest.mark.slow
async def test_a_file_the_person_writes_while_a_call_runs_counts_as_navis_and_the_branch_keeps_it(
    tmp_path: Path,
) -> None:
    """The rule for the one case nobody can tell apart: written while one of the
    session's calls runs, it is navi's (a rewind removes it; its branch brings it back).
    The command tells the test it runs through one FIFO and waits on another."""
    work = folder(tmp_path)
    gates = tmp_path / "gates"
    gates.mkdir()
    started, go = gates / "started", gates / "go"
    os.mkfifo(started)
    os.mkfifo(go)
    command = f"echo s > {started} && head -c1 {go} >/dev/null && echo n > navi.txt"
    replies = [calls(run(command)), say("ok")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(turn, h, SID, "go", cwd=work, **FULL))
                await trio.to_thread.run_sync(_read_once, started, abandon_on_cancel=True)
                (work / "during.txt").write_text("typed while navi worked\n")
                await trio.to_thread.run_sync(_write_once, go, abandon_on_cancel=True)
            (first,) = await user_ids(h)
            target = Target(to=first, restore="files")
            preview, root = await files_preview(h, target, work)
            assert {(c.path, c.what) for c in root.changes} == {
                ("navi.txt", "deleted"),
                ("during.txt", "deleted"),
            }
            event = await h.runtime.rewinds.apply(SID, target, preview.token)
            assert not (work / "during.txt").exists()
            await bring_back(h, event.undo)
            assert (work / "during.txt").read_text() == "typed while navi worked\n"


def _read_once(path: Path) -> None:
    with path.open("rb") as fifo:
        fifo.read(1)


def _write_once(path: Path) -> None:
    with path.open("wb") as fifo:
        fifo.write(b"g")


async def test_what_navi_changed_is_still_known_after_a_restart_and_an_unseen_edit_is_a_conflict(
    tmp_path: Path,
) -> None:
    """The marks outlive the daemon: after a restart navi's files are still navi's; one
    the person edited while no daemon watched (its stamp moved) is a conflict."""
    work = folder(tmp_path)
    replies = [calls(write("kept.txt", "navi\n"), write("edited.txt", "navi\n")), say("ok")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            await turn(h, SID, "write", cwd=work, **FULL)
        (work / "edited.txt").write_text("edited while navi was down\n")
        async with open_harness(tmp_path, profiles=PROFILES) as h:
            (first,) = await user_ids(h)
            target = Target(to=first, restore="files")
            preview, root = await files_preview(h, target, work)
            assert root.conflicts == ("edited.txt",)
            assert [(c.path, c.what) for c in root.changes] == [("kept.txt", "deleted")]
            await h.runtime.rewinds.apply(SID, target, preview.token)
            assert not (work / "kept.txt").exists()
            assert (work / "edited.txt").read_text() == "edited while navi was down\n"
