"""A workspace that is a git repository: the user's `.git` is never read or written.

The engine never runs git; `.git` is always left out. These tests compare, before and
after snapshots and restores, `git status --porcelain`, the reflog and every byte and
permission bit under `.git` (git is run with GIT_OPTIONAL_LOCKS=0, so the status itself
does not refresh the index). A folder that is not a repository at all is the default
of every other checkpoint test.
"""

from __future__ import annotations

import os
import subprocess
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

pytestmark = [
    pytest.mark.slow,  # its tests start processes
    pytest.mark.skipif(
        subprocess.run(["git", "--version"], capture_output=True).returncode != 0,
        reason="git is not installed",
    ),
]


def git_env(tmp_path: Path) -> dict[str, str]:
    home = real_dir(tmp_path / "home")
    return {
        **os.environ,
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }


def git(repo: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, timeout=DEADLINE
    )
    return done.stdout.decode()


def repo_view(repo: Path, env: dict[str, str]) -> tuple[str, str, object]:
    return (
        git(repo, env, "status", "--porcelain=v1", "-uall", "--ignored"),
        git(repo, env, "reflog", "--all"),
        tree_of(repo / ".git"),
    )


async def test_a_repository_keeps_its_git_folder_untouched_through_snapshot_and_restore(
    tmp_path: Path,
) -> None:
    env = git_env(tmp_path)
    settings = make_settings(tmp_path)
    repo = real_dir(tmp_path / "repo")
    git(repo, env, "init", "-q")
    (repo / "tracked.txt").write_text("v1\n")
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, env, "add", "-A")
    git(repo, env, "commit", "-qm", "first")
    (repo / "tracked.txt").write_text("v2, not committed\n")  # a dirty work tree
    (repo / "untracked.txt").write_text("u\n")
    (repo / "debug.log").write_text("ignored\n")
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            before = repo_view(repo, env)
            work_before = tree_of(repo, skip=[".git"])
            first = await snap(engine, "s", [repo], private)
            assert repo_view(repo, env) == before
            info = await engine.get("s", first)
            assert info.files == 3  # tracked, untracked, .gitignore: not .git, not the log

            (repo / "tracked.txt").write_text("v3 by the agent\n")
            os.unlink(repo / "untracked.txt")
            (repo / "new.txt").write_text("n\n")
            preview = await engine.preview("s", first, private=private)
            await engine.restore("s", first, private=private, confirm=preview.token)
            assert tree_of(repo, skip=[".git"]) == work_before
            assert repo_view(repo, env) == before


async def test_a_commit_made_after_the_checkpoint_stays_after_a_file_restore(
    tmp_path: Path,
) -> None:
    env = git_env(tmp_path)
    settings = make_settings(tmp_path)
    repo = real_dir(tmp_path / "repo")
    git(repo, env, "init", "-q")
    (repo / "a.txt").write_text("a1\n")
    git(repo, env, "add", "-A")
    git(repo, env, "commit", "-qm", "first")
    private = private_for(settings)
    with trio.fail_after(DEADLINE):
        async with engine_for(settings) as engine:
            first = await snap(engine, "s", [repo], private)
            (repo / "a.txt").write_text("a2\n")
            git(repo, env, "commit", "-qam", "by the agent")  # .git changes: not ours
            after_commit = repo_view(repo, env)[1:]
            await engine.restore("s", first, private=private)
            assert (repo / "a.txt").read_text() == "a1\n"
            # The restore reverted the file, never the repository: the commit and its
            # reflog entry are there, .git byte for byte as the commit left it.
            assert repo_view(repo, env)[1:] == after_commit
            assert "by the agent" in after_commit[0]
