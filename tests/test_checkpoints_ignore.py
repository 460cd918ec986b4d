"""What a checkpoint leaves out: `.gitignore` (git's rules), the configured names.

The `.gitignore` reading is checked against git itself: in a fresh repository, the
files `git ls-files --others --exclude-standard` lists (untracked and not ignored) are
exactly the files a checkpoint holds (seen by exporting it), for a tree of patterns
covering negation, anchoring, folder-only patterns, ``**``, classes, escapes, trailing
spaces and a nested `.gitignore` overriding its parent.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import trio
from test_checkpoints_git import git, git_env
from test_checkpoints_support import (
    DEADLINE,
    engine_for,
    export,
    make_settings,
    private_for,
    real_dir,
    snap,
    tree_of,
)

from navi_trio.core.checkpoints._ignore import Ignorer, Rules

HAS_GIT = subprocess.run(["git", "--version"], capture_output=True).returncode == 0

ROOT_RULES = (
    """\
# comment line
*.log
!keep.log
/top-only.txt
build-out/
docs/**/*.md
!docs/README.md
**/cache
tmp?.txt
[abc]x.dat
\\#hash.txt
trailing.txt"""
    + "   "
    + """
spaced\\ .txt
a/**/z.txt
sub/*.gen
[unclosed
\\
"""
)
SUB_RULES = """\
!*.log
local.txt
"""
PATHS = [
    "x.log", "keep.log", "dir/y.log", "dir/keep.log",
    "top-only.txt", "dir/top-only.txt",
    "build-out/o.txt", "dir/build-out/o.txt", "build-out-file.txt",
    "docs/a.md", "docs/x/y/b.md", "docs/README.md", "docs/c.txt",
    "cache/c1", "deep/er/cache/c2", "cachefile",
    "tmp1.txt", "tmp12.txt", "ax.dat", "dx.dat",
    "#hash.txt", "trailing.txt", "spaced .txt", "spaced.txt",
    "a/z.txt", "a/b/c/z.txt", "b/a/z.txt",
    "sub/x.gen", "sub/deeper/x.gen", "sub/s.log", "sub/local.txt", "local.txt",
    "plain.txt", "[unclosed",
]  # fmt: skip


def _build(root: Path) -> None:
    (root / ".gitignore").write_text(ROOT_RULES)
    (root / "sub").mkdir()
    (root / "sub" / ".gitignore").write_text(SUB_RULES)
    for rel in PATHS:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
async def test_the_files_a_checkpoint_holds_are_those_git_does_not_ignore(
    tmp_path: Path,
) -> None:
    env = git_env(tmp_path)
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    _build(work)
    git(work, env, "init", "-q")
    listed = git(work, env, "ls-files", "--others", "--exclude-standard", "-z")
    expected = {p for p in listed.split("\0") if p}
    assert "x.log" not in expected and "sub/s.log" in expected  # the oracle itself works
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            await export(engine, "s", first, work, tmp_path / "copy")
    held = {k for k, v in tree_of(tmp_path / "copy").items() if v[0] == "file"}
    assert held == expected


def test_a_hostile_gitignore_is_matched_in_linear_time() -> None:
    """Stars against a long name: a plain regex translation backtracks polynomially
    (~2 s here for 5 stars and 110 characters, hours for 10 and 250) holding the GIL,
    which would freeze the daemon."""
    rules = Rules.parse("", "*a*a*a*a*b\n**/**/**/**/**/**/q/**/**/z\n")
    assert rules is not None
    ignorer = Ignorer((rules,))
    name = "a" * 110
    deep = "/".join(["q"] * 400)
    started = time.perf_counter()
    assert not ignorer.ignored(name, False)
    assert not ignorer.ignored(deep + "/" + name, False)
    assert ignorer.ignored(deep + "/z", False)
    assert ignorer.ignored("x" + name + "b", False)
    assert time.perf_counter() - started < 0.5


async def test_the_ignore_list_leaves_names_out_everywhere_and_git_always(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path, checkpoint_ignore=("*.tmp", "cache"))
    work = real_dir(tmp_path / "work")
    for rel in ["a.tmp", "d/b.tmp", "cache/x", "d/cache/y", ".git/config", "node_modules/m", "ok"]:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(rel)
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            await export(engine, "s", first, work, tmp_path / "copy")
    held = {k for k, v in tree_of(tmp_path / "copy").items() if v[0] == "file"}
    # node_modules is only in the default list, which this setting replaced; .git stays out.
    assert held == {"ok", "node_modules/m"}


async def test_a_restore_follows_the_rules_of_the_checkpoint_and_keeps_what_it_cannot_undo(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    (work / ".gitignore").write_text("*.log\n")
    (work / "old.log").write_text("ignored when the checkpoint was taken")
    (work / "notes.txt").write_text("v1")
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [work], private)
            # The agent stops ignoring logs and starts ignoring notes.txt, then edits it.
            (work / ".gitignore").write_text("notes.txt\n")
            (work / "notes.txt").write_text("v2, now ignored: no checkpoint holds it")
            preview = await engine.preview("s", first, private=private)
            kept = {k.path for r in preview.roots for k in r.kept}
            assert kept == {"notes.txt"}
            await engine.restore("s", first, private=private, confirm=preview.token)
            assert (work / ".gitignore").read_text() == "*.log\n"
            # Not deleted: the checkpoint ignored it, so it knows nothing of it.
            assert (work / "old.log").read_text() == "ignored when the checkpoint was taken"
            # Not overwritten: its current content is in no checkpoint.
            assert (work / "notes.txt").read_text().startswith("v2")


def test_gitignore_size_and_oddities_do_not_break_parsing() -> None:
    assert Rules.parse("", "\n# only comments\n   \n!\n/\n") is None
    # As git reads them: an unclosed class matches nothing, a lone backslash is skipped.
    assert Rules.parse("d", "[unclosed\n\\\n") is None
    rules = Rules.parse("d", "[unclosed\n*.x\n")
    assert rules is not None
    assert Ignorer((rules,)).ignored("d/a.x", False)
    assert not Ignorer((rules,)).ignored("d/[unclosed", False)
    assert os.sep == "/"
