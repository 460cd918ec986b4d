"""Snapshots and restores of real folders, compared whole (content, bits, links, folders).

A scripted sequence changes a folder with Python file operations and with real shell
commands (``sed -i``, ``rm``, ``mv``, ``mkdir``, ``chmod``, ``ln``), snapshotting after
each step; then every checkpoint is restored, in a shuffled order, and the whole tree
must be what it was. Run with inotify (incremental rescans) and without (a full stat
walk each time), so the two ways of noticing changes are held to the same answer.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from test_checkpoints_support import (
    DEADLINE,
    diff,
    engine_for,
    make_settings,
    private_for,
    real_dir,
    sh,
    snap,
    tree_of,
    users_own,
)

from navi_trio.core.checkpoints import (
    CheckpointChangedError,
    CheckpointError,
    Created,
    Skipped,
    _apply,
    _fsops,
)
from navi_trio.tools import runas
from navi_trio.tools.roots import Root


def _step0(w: Path) -> None:
    (w / "src").mkdir()
    (w / "src" / "main.py").write_text("print('alpha')\n" * 20)
    (w / "src" / "util.py").write_text("def a():\n    return 'a'\n")
    (w / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(w / "run.sh", 0o755)
    (w / "secret.txt").write_text("mine")
    os.chmod(w / "secret.txt", 0o600)
    (w / "empty").mkdir()
    (w / "deep" / "er" / "est").mkdir(parents=True)
    (w / "deep" / "er" / "est" / "leaf.txt").write_text("leaf")
    os.symlink("src/main.py", w / "main-link")
    os.symlink("/etc/hostname", w / "outside-link")  # a link out: kept as text, never read


def _step1(w: Path) -> None:  # Python file operations
    (w / "src" / "main.py").write_text("print('beta')\n")
    (w / "notes.md").write_text("new file\n")
    os.unlink(w / "secret.txt")
    os.chmod(w / "src" / "util.py", 0o640)
    (w / "empty2").mkdir()
    os.rmdir(w / "empty")


def _step2(w: Path) -> None:  # real shell commands, as a terminal tool would run them
    sh(w, "sed", "-i", "s/return 'a'/return 'sed'/", "src/util.py")
    sh(w, "rm", "notes.md")
    sh(w, "mv", "src/main.py", "src/app.py")
    sh(w, "mkdir", "-p", "build2/out/x")
    sh(w, "chmod", "700", "deep/er")
    sh(w, "chmod", "644", "run.sh")
    sh(w, "ln", "-sfn", "src/app.py", "main-link")
    sh(w, "sh", "-c", "echo generated > build2/out/x/gen.txt")


def _step3(w: Path) -> None:  # kinds swap: a file becomes a folder and back; read-only
    os.unlink(w / "run.sh")
    (w / "run.sh").mkdir()
    (w / "run.sh" / "inside.txt").write_text("i")
    shutil.rmtree(w / "deep")
    (w / "deep").write_text("now a file")
    (w / "ro").mkdir()
    (w / "ro" / "locked.txt").write_text("locked")
    os.chmod(w / "ro", 0o555)
    os.chmod(w / "src" / "util.py", 0o1755)  # the sticky bit on a file: kept too


def _step4(w: Path) -> None:  # a link becomes a file, a file a link, the read-only folder changes
    os.unlink(w / "main-link")
    (w / "main-link").write_text("was a link")
    os.unlink(w / "src" / "util.py")
    os.symlink("app.py", w / "src" / "util.py")
    os.chmod(w / "ro", 0o755)
    (w / "ro" / "second.txt").write_text("2")
    os.chmod(w / "ro", 0o500)
    sh(w, "sh", "-c", "mkdir -p node_modules && echo node > node_modules/m.js")


STEPS: list[Callable[[Path], None]] = [_step0, _step1, _step2, _step3, _step4]


def _unlock(root: Path) -> None:
    """Let pytest remove tmp_path (a read-only folder is left by the steps)."""
    for folder, dirs, _ in os.walk(root):
        for d in dirs:
            p = Path(folder) / d
            if not p.is_symlink():
                os.chmod(p, 0o755)


@pytest.mark.slow
@pytest.mark.parametrize("watch", [True, False], ids=["inotify", "full-walk"])
async def test_every_checkpoint_of_a_scripted_sequence_restores_the_whole_tree(
    tmp_path: Path, watch: bool
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    ids: list[str] = []
    trees = []
    try:
        with trio.fail_after(DEADLINE):
            async with engine_for(settings, watch=watch) as engine:
                for step in STEPS:
                    step(work)
                    users_own(work)
                    ids.append(await snap(engine, "s1", [work], private))
                    trees.append(tree_of(work, skip=["node_modules"]))
                assert len(set(ids)) == len(STEPS)
                node_modules = tree_of(work / "node_modules")
                order = list(range(len(STEPS))) * 2
                random.Random(22).shuffle(order)
                for k in order:
                    preview = await engine.preview("s1", ids[k], private=private)
                    done = await engine.restore(
                        "s1", ids[k], private=private, confirm=preview.token
                    )
                    assert done.failed == ()
                    now = tree_of(work, skip=["node_modules"])
                    assert diff(trees[k], now) == {}, f"checkpoint {k}"
                    # ignored: never captured, never touched by a restore
                    assert tree_of(work / "node_modules") == node_modules
                    # The next snapshot sees exactly the restored tree (same digests).
                    again = await engine.snapshot("s1", [work], private=private)
                    assert isinstance(again, Created)
                    info = await engine.get("s1", ids[k])
                    assert again.checkpoint.roots == info.roots
                    # Nothing left to do: restoring it again changes nothing.
                    assert (await engine.preview("s1", ids[k], private=private)).empty
    finally:
        _unlock(work)


async def test_the_preview_counts_what_the_restore_does_and_changes_nothing(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            (work / "keep.txt").write_text("k")
            (work / "edit.txt").write_text("before")
            (work / "gone.txt").write_text("gone")
            (work / "mode.txt").write_text("m")
            (work / "olddir").mkdir()
            users_own(work)
            first = await snap(engine, "s", [work], private)
            (work / "edit.txt").write_text("after!")
            os.unlink(work / "gone.txt")
            os.chmod(work / "mode.txt", 0o600)
            (work / "added.txt").write_text("added")
            os.rmdir(work / "olddir")
            (work / "newdir").mkdir()
            users_own(work)
            changed = tree_of(work)
            preview = await engine.preview("s", first, private=private)
            assert tree_of(work) == changed  # computed before anything is applied
            (root,) = preview.roots
            assert (root.restored, root.created, root.deleted, root.modes) == (1, 1, 1, 1)
            assert (root.dirs_created, root.dirs_deleted) == (1, 1)
            assert root.bytes == len("before") + len("gone")
            assert {(c.path, c.what) for c in root.changes} == {
                ("edit.txt", "restored"),
                ("gone.txt", "created"),
                ("added.txt", "deleted"),
                ("mode.txt", "mode"),
                ("olddir", "dir_created"),
                ("newdir", "dir_deleted"),
            }
            assert preview.undo is not None and "full mode" in preview.not_covered

            # A folder changed after the preview: refused, nothing applied.
            (work / "added.txt").write_text("changed after the preview")
            after_preview = tree_of(work)
            with pytest.raises(CheckpointChangedError):
                await engine.restore("s", first, private=private, confirm=preview.token)
            assert tree_of(work) == after_preview

            # Restore, then undo the restore with the checkpoint its preview took.
            again = await engine.preview("s", first, private=private)
            await engine.restore("s", first, private=private, confirm=again.token)
            assert again.undo is not None
            await engine.restore("s", again.undo, private=private)
            assert tree_of(work) == after_preview


async def test_two_roots_one_inside_the_other_are_each_restored_without_the_other(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    inner = real_dir(work / "session")  # e.g. a session folder inside the cwd
    private = private_for(settings, inner)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            (work / "a.txt").write_text("a1")
            (inner / "s.txt").write_text("s1")
            first = await snap(engine, "s", [inner, work], private)
            info = await engine.get("s", first)
            assert info.files == 2  # the inner root is not counted twice
            before = tree_of(work)
            (work / "a.txt").write_text("a2")
            (inner / "s.txt").write_text("s2")
            (inner / "new.txt").write_text("n")
            await engine.restore("s", first, private=private)
            assert tree_of(work) == before


async def test_links_are_kept_as_links_and_never_followed_out_of_the_root(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    outside = real_dir(tmp_path / "outside")
    (outside / "precious.txt").write_text("do not touch")
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            (work / "sub").mkdir()
            (work / "sub" / "f.txt").write_text("in the root")
            os.symlink(str(outside), work / "out")
            first = await snap(engine, "s", [work], private)
            info = await engine.get("s", first)
            assert info.files == 2  # sub/f.txt and the link itself; nothing of outside/
            before, outside_before = tree_of(work), tree_of(outside)
            # The folder is swapped for a link to the outside folder, which then changes.
            shutil.rmtree(work / "sub")
            os.symlink(str(outside), work / "sub")
            (outside / "f.txt").write_text("outside")
            outside_now = tree_of(outside)
            users_own(work)
            await engine.restore("s", first, private=private)
            assert tree_of(work) == before
            assert tree_of(outside) == outside_now  # the restore wrote nothing through it
            assert "f.txt" in outside_now and outside_before != outside_now


async def test_navi_data_inside_the_folder_is_neither_read_nor_restored(tmp_path: Path) -> None:
    work = real_dir(tmp_path / "work")
    settings = make_settings(tmp_path, data_dir=work / ".navi-data", db_path=work / "navi.db")
    private = private_for(settings)
    (work / "navi.db").write_text("the database")
    (work / "code.py").write_text("x = 1")
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            info = await engine.get("s", first)
            assert info.files == 1  # code.py: not the database, not the checkpoints
            (work / "navi.db").write_text("the database, later")
            (work / "code.py").write_text("x = 2")
            await engine.restore("s", first, private=private)
            assert (work / "navi.db").read_text() == "the database, later"
            assert (work / "code.py").read_text() == "x = 1"


async def test_a_hard_link_to_navis_database_inside_the_folder_is_neither_read_nor_restored(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path, db_path=real_dir(tmp_path / "db") / "navi.db")
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    settings.db_path.write_text("the database")
    os.link(settings.db_path, work / "db-link")  # its path is no private one: its inode is
    (work / "code.py").write_text("x = 1")
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            assert (await engine.get("s", first)).files == 1  # code.py only
            settings.db_path.write_text("the database, later")
            await engine.restore("s", first, private=private)
            assert (work / "db-link").read_text() == "the database, later"


async def test_a_checkpoint_exports_into_a_new_folder_as_it_was(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            _step0(work)
            users_own(work)
            first = await snap(engine, "s", [work], private)
            expected = tree_of(work)
            _step1(work)
            dest = real_dir(tmp_path) / "fork"
            with Root.open(dest.parent, "the fork's folder") as parent:
                made = await engine.export("s", first, work, parent, dest.name)
                assert made.failed == []
                st = os.stat(dest)
                assert made.ident == (st.st_dev, st.st_ino)
                assert tree_of(dest) == expected
                with pytest.raises(CheckpointError, match="already exists"):
                    await engine.export("s", first, work, parent, dest.name)
            assert not [n for n in tree_of(tmp_path) if "navi-export" in n]


async def test_a_missing_root_folder_is_made_again_by_the_restore(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    home = users_own(real_dir(tmp_path / "home"))
    work = real_dir(home / "work")
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            _step0(work)
            users_own(work)
            first = await snap(engine, "s", [work], private)
            expected = tree_of(work)
            shutil.rmtree(work)
            preview = await engine.preview("s", first, private=private)
            assert preview.undo is None and preview.roots[0].created >= 5
            done = await engine.restore("s", first, private=private, confirm=preview.token)
            assert done.failed == ()
            assert tree_of(work) == expected
            # Made again with the owner of its folder (a root daemon's: the user's).
            assert (work.stat().st_uid, work.stat().st_gid) == (
                home.stat().st_uid,
                home.stat().st_gid,
            )


async def test_the_session_folder_inside_the_data_folder_inside_the_cwd(tmp_path: Path) -> None:
    """The daemon's own layout with the cwd at a home folder: the data folder (hidden)
    holds the session folder (its own root, allowed) and the checkpoints."""
    home = real_dir(tmp_path / "home")
    data = home / ".local" / "share" / "navi"
    settings = make_settings(tmp_path, data_dir=data, db_path=data / "navi.db")
    session = real_dir(settings.session_dir("s1"))
    private = private_for(settings, session)
    (home / "project.txt").write_text("p1")
    (session / "notes.md").write_text("n1")
    (data / "other-session-secret").write_text("not ours")
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s1", [session, home], private)
            info = await engine.get("s1", first)
            assert info.files == 2  # project.txt and notes.md: nothing else of the data
            before_home = tree_of(home, skip=[".local"])
            before_session = tree_of(session)
            (home / "project.txt").write_text("p2")
            (session / "notes.md").write_text("n2")
            (session / "scratch.txt").write_text("s")
            done = await engine.restore("s1", first, private=private)
            assert done.failed == ()
            assert tree_of(home, skip=[".local"]) == before_home
            assert tree_of(session) == before_session
            assert (data / "other-session-secret").read_text() == "not ours"


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root ignores permission bits: a read-only folder binds no one"
)
async def test_a_restore_writes_into_folders_made_read_only_and_makes_them_so_again(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    (work / "ro").mkdir()
    (work / "ro" / "a.txt").write_text("a1")
    os.chmod(work / "ro", 0o555)
    try:
        with trio.fail_after(DEADLINE):
            async with engine_for(settings) as engine:
                first = await snap(engine, "s", [work], private)
                expected = tree_of(work)
                os.chmod(work / "ro", 0o755)
                (work / "ro" / "a.txt").write_text("a2")
                (work / "ro" / "b.txt").write_text("b")
                os.chmod(work / "ro", 0o500)
                done = await engine.restore("s", first, private=private)
                assert done.failed == ()
                assert tree_of(work) == expected
    finally:
        _unlock(work)


async def test_a_restore_never_makes_a_file_setuid_or_setgid(tmp_path: Path) -> None:
    """A restore writes as the daemon: a program of the user's made setuid to its
    account would hand that account to whoever runs it."""
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    tool = work / "tool"
    tool.write_text("#!/bin/sh\nid\n")
    (work / "shared").mkdir()
    users_own(work)  # before the bits: a chown clears set-user-ID
    os.chmod(tool, 0o6755)
    os.chmod(work / "shared", 0o2775)  # a folder's setgid bit (group inheritance) stays
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            tool.unlink()
            os.chmod(work / "shared", 0o755)
            await engine.restore("s", first, private=private)
            assert tool.stat().st_mode & 0o7777 == 0o755
            assert (work / "shared").stat().st_mode & 0o7777 == 0o2775
            os.chmod(tool, 0o6755)  # only its bits changed since: a chmod, not a put
            second = await snap(engine, "s", [work], private)
            os.chmod(tool, 0o700)
            await engine.restore("s", second, private=private)
            assert tool.stat().st_mode & 0o7777 == 0o755


@pytest.mark.skipif(os.geteuid() != 0, reason="only a daemon running as root gives owners")
async def test_what_a_restore_makes_as_root_belongs_to_the_owner_of_its_folder(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    (work / "d").mkdir()
    (work / "d" / "f.txt").write_text("f")
    os.symlink("f.txt", work / "d" / "link")
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            shutil.rmtree(work / "d")
            os.chown(work, 4242, 4343)  # the folder's owner, whom commands run as
            await engine.restore("s", first, private=private)
    for path in (work / "d", work / "d" / "f.txt", work / "d" / "link"):
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (4242, 4343), path


async def test_a_restore_refuses_a_folder_that_became_a_link_and_names_it(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    victim = real_dir(tmp_path / "victim")
    (victim / "theirs.txt").write_text("theirs")
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            (work / "mine.txt").write_text("mine")
            first = await snap(engine, "s", [work], private)
            work.rename(tmp_path / "work.old")
            os.symlink(victim, work)
            with pytest.raises(CheckpointError, match=f"{work} is a symlink now"):
                await engine.preview("s", first, private=private)
            with pytest.raises(CheckpointError, match=f"{work} is a symlink now"):
                await engine.restore("s", first, private=private)
    assert sorted(p.name for p in victim.iterdir()) == ["theirs.txt"]


async def test_an_engine_opened_while_another_restores_does_not_replay_its_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second engine on the same data folder (another process, or a second daemon)
    completes a journal only when no live restore holds it: the restore under way is
    paused after its first step while the second engine opens, and the journal is left
    to it. (flock works per open file description: two engines in one process exclude
    each other as two processes do.)"""
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "w")
    for n in range(5):
        (work / f"f{n}.txt").write_text(f"before {n}\n")
    private = private_for(settings)
    journal = settings.data_dir / "checkpoints" / "journal"
    paused, resume = threading.Event(), threading.Event()
    one = _apply._one

    def first_then_wait(*args: Any) -> None:
        one(*args)
        if not paused.is_set():
            paused.set()
            resume.wait(DEADLINE)

    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            before = await snap(engine, "s", [work], private)
            tree_before = tree_of(work)
            for n in range(5):
                (work / f"f{n}.txt").write_text(f"after {n}\n")
            after = tree_of(work)
            monkeypatch.setattr(_apply, "_one", first_then_wait)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(engine.restore, "s", before, private=private))
                try:
                    await trio.to_thread.run_sync(paused.wait, DEADLINE)
                    assert len(list(journal.glob("*.json"))) == 1
                    halfway = tree_of(work)
                    async with engine_for(settings) as second:
                        assert await second.recover() == []
                    # Nothing was replayed: the journal is still the first engine's.
                    assert len(list(journal.glob("*.json"))) == 1
                    assert tree_of(work) == halfway and halfway not in (tree_before, after)
                finally:
                    resume.set()
            assert tree_of(work) == tree_before
            assert not list(journal.glob("*.json"))


class _Killed(BaseException):
    """The restore's process dying at one step (the journal is left, as by SIGKILL;
    nothing catches it as a failed path)."""


async def test_a_replayed_journal_reports_only_the_steps_it_could_not_do(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A journal run again after a crash that came late in its restore: the files and
    folders inside a folder its first run removed are gone, which is what those steps
    want, so they are done, not failures; a step that truly fails (a folder that is a
    file now, a file to put in a folder that is gone) is logged with its path and why."""
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "w")
    (work / "kept.txt").write_text("a file, not a folder\n")
    journal = settings.data_dir / "checkpoints" / "journal"
    journal.mkdir(parents=True)
    ops = [
        ["rm", "gone/a.txt"],
        ["rm", "gone/sub/b.txt"],
        ["rmdir", "gone/sub"],
        ["rmdir", "gone"],
        ["rm", "kept.txt/c.txt"],
        ["put", "missing/new.txt", "0" * 64, 0o644],  # only a removal is done by a folder gone
    ]
    body = {"v": 1, "id": "j1", "checkpoint": "c", "owner": "", "after": "", "roots": []}
    body["roots"] = [{"path": str(work), "ops": ops}]
    (journal / "j1.json").write_text(json.dumps(body))
    with caplog.at_level(logging.WARNING, logger="navi_trio.core.checkpoints.engine"):
        async with engine_for(settings):
            pass
    said = [r.getMessage() for r in caplog.records if "completed after a crash" in r.getMessage()]
    assert len(said) == 1, said
    assert "left 2 path(s)" in said[0] and f"{work}/kept.txt/c.txt (Not a directory)" in said[0]
    assert f"{work}/missing/new.txt (" in said[0]
    assert not list(journal.glob("*.json"))
    assert sorted(p.name for p in work.iterdir()) == ["kept.txt"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon acts as the tool user")
@pytest.mark.parametrize(
    ("gone", "theirs", "dies_at"),
    [("work/d", True, 1), ("work", True, 1), ("work/d", False, 3)],
    ids=["a-folder", "the-root", "in-someone-elses-folder"],
)
async def test_a_root_restore_killed_before_a_made_folder_was_given_is_completed_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gone: str, theirs: bool, dies_at: int
) -> None:
    """A root daemon's restore makes a folder (one in the root, or the root itself) and
    then gives it to the owner of the folder it is in. Killed between the two, the next
    open replays the journal with the tool user's rights: a folder left as root's would
    refuse every file the replay puts in it (it stayed empty: a half restore). The
    folder appears only once it is theirs. In a folder of someone else's that the tool
    user may write in (0777), a made folder is that someone's, 0700 until the restore's
    last step: killed after it was made (`dies_at` the first file), the replay counts
    it as its own making, as the first attempt did."""
    settings = make_settings(tmp_path)
    home = users_own(real_dir(tmp_path / "home"))
    work = real_dir(home / "work")
    private = private_for(settings)
    (work / "d" / "e").mkdir(parents=True)
    for name in ("d/f.txt", "d/e/g.txt", "top.txt"):
        (work / name).write_text(name)
    users_own(home)
    if not theirs:
        for up, dirs, files in os.walk(home):
            for name in [up, *(os.path.join(up, n) for n in dirs + files)]:
                os.chown(name, 4242, 4343)
        for path in (home, work):
            os.chmod(path, 0o777)
    journal = settings.data_dir / "checkpoints" / "journal"
    give = runas.inherit
    calls = 0

    def dies_at_the_first_gift(fd: int, folder_fd: int) -> None:
        nonlocal calls
        calls += 1
        if calls == dies_at:
            raise _Killed
        give(fd, folder_fd)

    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            tree = tree_of(work)
            shutil.rmtree(home / gone)
            monkeypatch.setattr(_apply, "inherit", dies_at_the_first_gift)
            monkeypatch.setattr(_fsops, "inherit", dies_at_the_first_gift)
            with pytest.raises(_Killed):
                await engine.restore("s", first, private=private)
            monkeypatch.setattr(_apply, "inherit", give)
            monkeypatch.setattr(_fsops, "inherit", give)
        assert len(list(journal.glob("*.json"))) == 1
        async with engine_for(settings):  # the next open completes the journal
            pass
    assert tree_of(work) == tree, diff(tree, tree_of(work))
    assert not list(journal.glob("*.json"))
    assert sorted(p.name for p in home.iterdir()) == ["work"]
    for path in (work, work / "d", work / "d" / "e", work / "d" / "e" / "g.txt"):
        assert path.lstat().st_uid == home.stat().st_uid, path


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon acts as the tool user")
async def test_a_root_daemons_restore_leaves_what_the_tool_user_may_not_change(
    tmp_path: Path,
) -> None:
    # The user's folder holds a folder of root's (0755), a shared sticky one (1777,
    # root's) with a file of root's, and a file of root's: the tool user (nobody) may
    # change none of them (nor the last one's mode), so a restore rewrites, deletes and
    # re-modes none of it, and names each path; the preview names them first. The
    # user's own files are restored as ever.
    settings = make_settings(tmp_path)
    work = users_own(real_dir(tmp_path / "work"))
    private = private_for(settings)
    (work / "own.txt").write_text("o1")
    (work / "gone.txt").write_text("g1")
    users_own(work)
    closed = work / "closed"
    closed.mkdir(mode=0o755)
    (closed / "keep.txt").write_text("k1")
    shared = work / "shared"
    shared.mkdir(mode=0o1777)
    (shared / "root.txt").write_text("r1")
    os.chmod(shared / "root.txt", 0o644)  # readable: checkpointed, but not theirs
    (work / "roots.txt").write_text("in the user's folder, but root's")
    tool = runas.run_as(settings.tool_user)
    assert tool is not None
    os.chown(work / "roots.txt", 0, tool.gid)  # their group's: its mode is still root's
    os.chmod(work / "roots.txt", 0o644)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            (closed / "keep.txt").write_text("k2")
            (closed / "new.txt").write_text("root's own")
            (shared / "root.txt").write_text("r2")
            (shared / "later.txt").write_text("root's too")
            os.chmod(work / "roots.txt", 0o640)  # its mode: only its owner may change it
            (work / "own.txt").write_text("o2")
            os.unlink(work / "gone.txt")
            (work / "added.txt").write_text("a")
            users_own(work / "added.txt")
            preview = await engine.preview("s", first, private=private)
            done = await engine.restore("s", first, private=private, confirm=preview.token)
    refused = {
        "closed/keep.txt", "closed/new.txt", "shared/root.txt", "shared/later.txt", "roots.txt"
    }  # fmt: skip
    why = "the tool user may not change it (permission denied)"
    assert {k.path for k in preview.roots[0].kept if k.why == why} == refused
    assert {k.path: k.why for k in done.failed} == {
        str(work / rel): "Permission denied" for rel in refused
    }
    assert (closed / "keep.txt").read_text() == "k2"
    assert (closed / "new.txt").read_text() == "root's own"
    assert (shared / "root.txt").read_text() == "r2"
    assert (shared / "later.txt").read_text() == "root's too"
    assert (work / "roots.txt").stat().st_mode & 0o7777 == 0o640
    assert (work / "own.txt").read_text() == "o1"
    assert (work / "gone.txt").read_text() == "g1"
    assert not (work / "added.txt").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon acts as the tool user")
async def test_a_root_daemon_takes_no_checkpoint_of_a_folder_the_tool_user_may_not_list(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    (work / "f.txt").write_text("root's")
    os.chmod(work, 0o700)  # root's: its commands could not look in
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            outcome = await engine.snapshot("s", [work], private=private)
    assert isinstance(outcome, Skipped), outcome
    assert outcome.code == "unreadable"
    assert outcome.reason == f"{work} cannot be read by the tool user (permission denied)"


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon acts as the tool user")
async def test_a_root_daemon_never_reads_a_gitignore_the_tool_user_may_not_read(
    tmp_path: Path,
) -> None:
    # Its rules would tell what root's file says; the file itself is left out too.
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    (work / "a.log").write_text("a log")
    (work / ".gitignore").write_text("*.log\n")
    os.chmod(work / ".gitignore", 0o600)
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            info = await engine.get("s", await snap(engine, "s", [work], private))
    assert info.files == 1  # a.log
    assert [(item.path, item.reason) for item in info.left_out] == [
        (".gitignore", "the tool user may not read it (permission denied)")
    ]


def test_a_folder_swapped_for_a_link_is_never_opened_through_it(tmp_path: Path) -> None:
    # What a scan or a restore opens below a root is opened from its parent's fd without
    # following a link: a folder swapped for one since it was listed is an error there.
    work = real_dir(tmp_path / "work")
    outside = real_dir(tmp_path / "outside")
    (work / "sub").mkdir()
    root_fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    fds = _fsops.Folders(root_fd)
    try:
        (work / "sub").rmdir()
        os.symlink(outside, work / "sub")
        with pytest.raises(OSError):
            fds.get("sub")
    finally:
        fds.close()
        os.close(root_fd)


def test_a_folder_inside_navis_data_is_no_root_of_a_checkpoint(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    inside = real_dir(settings.data_dir / "checkpoints" / "objects")
    with pytest.raises(_fsops.RootUnusableError):
        _fsops.open_root(inside, private_for(settings))


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon acts as the tool user")
async def test_a_root_daemon_makes_no_missing_root_where_the_tool_user_may_not(
    tmp_path: Path,
) -> None:
    # The user's folder lies in one of root's (0755): gone, it is not made again, as the
    # tool user could not make it; the restore names it.
    settings = make_settings(tmp_path)
    above = real_dir(tmp_path / "roots")
    above.chmod(0o755)
    work = real_dir(above / "work")
    (work / "f.txt").write_text("f1")
    users_own(work)
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            shutil.rmtree(work)
            done = await engine.restore("s", first, private=private)
    assert not work.exists()
    assert [k.path for k in done.failed] == [str(work)]
