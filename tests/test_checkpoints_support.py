"""Helpers for the checkpoint tests (tests/test_checkpoints_*.py), and tests of the
oracle they all compare with: `tree_of` must see every difference a restore could get
wrong (content, permission bits, a symlink's text, an empty folder), or every restore
test would pass vacuously.

The engine under test is the real one on real folders in tmp_path: real files, real
system calls, real ``sed``/``mv``/``chmod`` processes where a test says so.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from navi_trio.core.checkpoints import CheckpointEngine, Created, open_checkpoints
from navi_trio.settings import Settings
from navi_trio.tools.private import PrivatePaths, private_paths
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import run_as

DEADLINE = 60
Tree = dict[str, tuple[Any, ...]]


def tree_of(root: Path, *, skip: Iterable[str] = ()) -> Tree:
    """Everything below `root` (never following a link): rel path -> (kind, bits, what);
    `skip`: top-level or nested relative paths left out (with what is below them)."""
    skipped = set(skip)
    out: Tree = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        rel_folder = os.path.relpath(folder, root)
        for name in sorted(dirs + files):
            rel = name if rel_folder == "." else f"{rel_folder}/{name}"
            if rel in skipped or any(rel.startswith(s + "/") for s in skipped):
                continue
            path = Path(folder) / name
            st = os.lstat(path)
            bits = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", oct(bits))
            else:
                out[rel] = ("file", oct(bits), hashlib.sha256(path.read_bytes()).hexdigest())
        dirs[:] = [d for d in dirs if os.path.relpath(Path(folder) / d, root) not in skipped]
    out["."] = ("dir", oct(stat.S_IMODE(os.lstat(root).st_mode)))
    return out


def diff(a: Tree, b: Tree) -> dict[str, tuple[Any, Any]]:
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def make_settings(base: Path, **overrides: Any) -> Settings:
    data = base / "data"
    values: dict[str, Any] = {
        "data_dir": data,
        "db_path": data / "navi.db",
        "config_path": base / "config" / "config.json",
    }
    values.update(overrides)
    return Settings(**values)


def private_for(settings: Settings, session_dir: Path | None = None) -> PrivatePaths:
    return private_paths(settings, session_dir)


@asynccontextmanager
async def engine_for(settings: Settings, **kwargs: Any) -> AsyncIterator[CheckpointEngine]:
    async with open_checkpoints(settings, **kwargs) as engine:
        yield engine


async def snap(
    engine: CheckpointEngine,
    owner: str,
    roots: list[Path],
    private: PrivatePaths,
    namespace: str | None = None,
) -> str:
    outcome = await engine.snapshot(owner, roots, private=private, namespace=namespace)
    assert isinstance(outcome, Created), outcome
    return outcome.checkpoint.id


async def export(
    engine: CheckpointEngine, owner: str, checkpoint_id: str, root: Path, dest: Path
) -> list[Any]:
    """Export `root` of a checkpoint into the new folder `dest` (its parent held for
    the export, as a fork holds it); the paths that could not be written."""
    parent = await trio.to_thread.run_sync(os.path.realpath, dest.parent)
    with Root.open(Path(parent), "the copy's folder") as held:
        made = await engine.export(owner, checkpoint_id, root, held, dest.name)
    return made.failed


def sh(cwd: Path, *args: str) -> None:
    """Run a real command in `cwd` (the shell commands a tool would run)."""
    subprocess.run(list(args), cwd=cwd, check=True, timeout=DEADLINE, capture_output=True)


def users_own(root: Path, tool_user: str = "") -> Path:
    """`root` and everything below it made the tool user's (`tool_user`: the
    NAVI_TOOL_USER setting) when the suite runs as root; `root`. A root daemon's
    restore acts with that user's rights (tools/runas.py), and the suite makes files as
    root: a test about a user's own files makes them that user's, as they are for real."""
    who = run_as(tool_user)
    if who is None:
        return root
    os.chown(root, who.uid, who.gid, follow_symlinks=False)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), who.uid, who.gid, follow_symlinks=False)
    return root


def real_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return Path(os.path.realpath(path))


# --------------------------------------------------------------------- the oracle


def test_tree_of_sees_content_bits_links_and_empty_folders(tmp_path: Path) -> None:
    root = real_dir(tmp_path / "w")
    (root / "f").write_text("a")
    (root / "d").mkdir()
    os.symlink("f", root / "l")
    base = tree_of(root)
    assert set(base) == {".", "f", "d", "l"}

    (root / "f").write_text("b")
    assert diff(base, tree_of(root)) == {"f": (base["f"], tree_of(root)["f"])}
    (root / "f").write_text("a")
    os.chmod(root / "f", 0o600)
    assert list(diff(base, tree_of(root))) == ["f"]
    os.chmod(root / "f", stat.S_IMODE(int(base["f"][1], 8)))
    os.unlink(root / "l")
    os.symlink("d", root / "l")
    assert list(diff(base, tree_of(root))) == ["l"]
    os.unlink(root / "l")
    os.symlink("f", root / "l")
    os.rmdir(root / "d")
    assert list(diff(base, tree_of(root))) == ["d"]
    (root / "d").mkdir()
    os.chmod(root, 0o750)
    assert list(diff(base, tree_of(root))) == ["."] or oct(0o750) == base["."][1]


def test_tree_of_skips_what_it_is_told_and_what_is_below(tmp_path: Path) -> None:
    root = real_dir(tmp_path / "w")
    (root / "node_modules" / "x").mkdir(parents=True)
    (root / "node_modules" / "x" / "y").write_text("y")
    (root / "keep").write_text("k")
    assert set(tree_of(root, skip=["node_modules"])) == {".", "keep"}
