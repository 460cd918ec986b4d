"""Incremental snapshots see every change a full walk sees.

The oracle: listings are content-addressed, so a snapshot made by a long-lived engine
(inotify, cached stamps) and one made by a fresh engine (no cache, a full walk) of the
same folder must have the same root digest. A seeded random sequence of file-system
operations is checked that way after every round, and so are the cases a cache gets
wrong: a same-size rewrite with the mtime put back, folder moves and swaps, a folder
filled right after it is made, a hard link written from outside the root, a
`.gitignore` change, and a write made inside the bubblewrap sandbox through its bind
mount (what terminal and code_exec do).
"""

from __future__ import annotations

import os
import random
import shutil
from contextlib import ExitStack
from pathlib import Path

import pytest
import trio
from test_checkpoints_support import (
    DEADLINE,
    engine_for,
    make_settings,
    private_for,
    real_dir,
)

from navi_trio.core.checkpoints import CheckpointEngine, Created, _scan
from navi_trio.tools.sandbox import SandboxSpec, bwrap_argv, find_bwrap, sandbox_available


async def _digest(engine: CheckpointEngine, work: Path, private: object, owner: str) -> str:
    outcome = await engine.snapshot(owner, [work], private=private)  # type: ignore[arg-type]
    assert isinstance(outcome, Created), outcome
    return outcome.checkpoint.roots[0].tree


async def _fresh_digest(tmp_path: Path, work: Path, tag: str) -> str:
    """The digest a new engine (no cache, no watches) gives the folder."""
    settings = make_settings(tmp_path / f"fresh-{tag}")
    async with engine_for(settings, watch=False) as fresh:
        return await _digest(fresh, work, private_for(settings), "s")  # one namespace


def _random_op(rng: random.Random, work: Path) -> None:
    files = [p for p in work.rglob("*") if p.is_file() and not p.is_symlink()]
    dirs = [p for p in work.rglob("*") if p.is_dir() and not p.is_symlink()] + [work]
    op = rng.choice(["write", "write", "new", "rm", "mkdir", "rmtree", "mv", "chmod", "link"])
    if op == "write" and files:
        rng.choice(files).write_text(f"content {rng.random()}")
    elif op == "new" or (op == "write" and not files):
        (rng.choice(dirs) / f"f{rng.randrange(10**6)}").write_text("n")
    elif op == "rm" and files:
        rng.choice(files).unlink()
    elif op == "mkdir":
        (rng.choice(dirs) / f"d{rng.randrange(10**6)}").mkdir()
    elif op == "rmtree" and len(dirs) > 1:
        shutil.rmtree(rng.choice([d for d in dirs if d != work]))
    elif op == "mv" and len(dirs) > 1:
        src = rng.choice([d for d in dirs if d != work] + files)
        dst_parent = rng.choice([d for d in dirs if src not in (d, *d.parents)])
        if (dst_parent / src.name).exists() or src == dst_parent:
            return
        os.rename(src, dst_parent / f"{src.name}m")
    elif op == "chmod" and files:
        os.chmod(rng.choice(files), rng.choice([0o600, 0o644, 0o755, 0o640]))
    elif op == "link":
        target = rng.choice(files + dirs)
        link = rng.choice(dirs) / f"l{rng.randrange(10**6)}"
        os.symlink(os.path.relpath(target, link.parent), link)


async def test_a_random_sequence_gives_the_digests_of_a_full_walk(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    private = private_for(settings)
    rng = random.Random(22)
    with trio.fail_after(DEADLINE * 2):
        async with engine_for(settings) as engine:
            for round_ in range(30):
                for _ in range(rng.randrange(1, 6)):
                    _random_op(rng, work)
                assert await _digest(engine, work, private, "s") == await _fresh_digest(
                    tmp_path, work, str(round_)
                ), f"round {round_}"


@pytest.mark.parametrize("watch", [True, False], ids=["inotify", "full-walk"])
async def test_the_cases_a_stat_cache_gets_wrong(
    tmp_path: Path, watch: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Trust every stamp at once: the files here were all written a moment ago, and the
    # 2 s "racy" window would otherwise read them again and hide a wrong stamp check.
    monkeypatch.setattr(_scan, "RACY_NS", 0)
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    outside = real_dir(tmp_path / "outside")
    private = private_for(settings)
    (work / "a").mkdir()
    (work / "a" / "f.txt").write_text("one")
    (work / "b").mkdir()
    (work / "same.txt").write_text("AAAA")
    os.link(work / "same.txt", outside / "hardlink.txt")
    (work / "sub").mkdir()
    (work / "sub" / "x.log").write_text("log")
    (work / ".gitignore").write_text("*.log\n")
    checks = 0

    async def agree(engine: CheckpointEngine) -> None:
        nonlocal checks
        checks += 1
        got = await _digest(engine, work, private, "s")
        assert got == await _fresh_digest(tmp_path, work, str(checks)), f"check {checks}"

    with trio.fail_after(DEADLINE):
        async with engine_for(settings, watch=watch) as engine:
            await agree(engine)
            # Same size, mtime put back: only the ctime tells.
            st = os.stat(work / "same.txt")
            (work / "same.txt").write_text("BBBB")
            os.utime(work / "same.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
            await agree(engine)
            # Written through a hard link kept outside the root.
            (outside / "hardlink.txt").write_text("CCCC")
            await agree(engine)
            # Folders moved, swapped through a third name, removed and made again.
            os.rename(work / "a", work / "b" / "a2")
            await agree(engine)
            os.rename(work / "b", work / "tmp")
            (work / "b").mkdir()
            os.rename(work / "tmp" / "a2", work / "b" / "a2")
            await agree(engine)
            shutil.rmtree(work / "b")
            (work / "b").mkdir()
            (work / "b" / "again.txt").write_text("made again")
            await agree(engine)
            # A folder made and filled at once, several levels deep.
            (work / "n1" / "n2" / "n3").mkdir(parents=True)
            for k in range(20):
                (work / "n1" / "n2" / "n3" / f"{k}.txt").write_text(str(k))
            await agree(engine)
            # The rules change: what was ignored below is now held.
            (work / ".gitignore").write_text("")
            await agree(engine)
            (work / "sub" / ".gitignore").write_text("*\n")
            await agree(engine)


OK, REASON = sandbox_available()


@pytest.mark.slow
@pytest.mark.skipif(not OK, reason=f"the sandbox is unavailable: {REASON}")
async def test_a_write_inside_the_sandbox_is_seen_by_the_next_incremental_snapshot(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    work = real_dir(tmp_path / "work")
    (work / "src").mkdir()
    (work / "src" / "m.py").write_text("x = 1\n")
    private = private_for(settings)
    bwrap = find_bwrap(settings.bwrap_path)
    assert bwrap is not None
    spec = SandboxSpec(writable=(work,), private=private)
    command = "sed -i s/1/2/ src/m.py && mkdir -p out && echo built > out/b.txt && rm -f x"
    with trio.fail_after(DEADLINE), ExitStack() as stack:
        cmd = bwrap_argv(bwrap, spec, ["sh", "-c", command], work, stack=stack)
        async with engine_for(settings) as engine:
            first = await _digest(engine, work, private, "s")
            done = await trio.run_process(
                cmd.argv, cwd="/", pass_fds=cmd.fds, capture_stderr=True, check=False
            )
            assert done.returncode == 0, done.stderr
            assert (work / "src" / "m.py").read_text() == "x = 2\n"
            second = await _digest(engine, work, private, "s")
            assert second != first
            assert second == await _fresh_digest(tmp_path, work, "sandbox")
