"""Benchmark the checkpoint engine (issue 22) on a 10,000-file tree.

    python scripts/bench_checkpoints.py [--files 10000] [--runs 9]

Prints, each a median of several runs, in a temp folder:

- the first snapshot (a new store: every file read, hashed and stored);
- an incremental snapshot with one file changed, with inotify (the default) and with
  a full stat walk (inotify off or unavailable), and the first snapshot after a
  daemon restart (the store has everything; every file is read again, nothing stored);
- a restore (preview scan, undo checkpoint, journal, apply) of one file and of 1,000;
- the disk the store uses after the first checkpoint, and per incremental checkpoint;
- for scale, a one-call turn against the fake LLM server (real HTTP on 127.0.0.1, a
  SQLite file): what an agent round costs when the model costs nothing. A real model's
  round is seconds (prefill and generation; see docs/pages/performance.md).

The tree is made, then the script waits out the engine's 2 s "racy" window (a file
changed in the same second as a snapshot is read again by the next one) so the figures
are those of a folder that was not written a moment ago. Bounded: fixed counts, a
600 s limit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from navi_trio.core.checkpoints import (  # noqa: E402
    CheckpointEngine,
    Created,
    open_checkpoints,
)
from navi_trio.settings import Settings  # noqa: E402
from navi_trio.testing import open_harness  # noqa: E402
from navi_trio.tools.private import private_paths  # noqa: E402


def _settings(base: Path) -> Settings:
    data = base / "data"
    return Settings(data_dir=data, db_path=data / "navi.db", config_path=base / "none.json")


def _tree(work: Path, files: int) -> None:
    per = 100
    for d in range((files + per - 1) // per):
        folder = work / f"pkg{d:03}"
        folder.mkdir(parents=True)
        for f in range(min(per, files - d * per)):
            (folder / f"mod{f:03}.py").write_text(f"value = {d * per + f}  # a small module\n")


def _disk(folder: Path) -> int:
    total = 0
    for top, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def _ms(samples: list[float]) -> str:
    median, least = statistics.median(samples) * 1000, min(samples) * 1000
    return f"{median:9.1f} ms (n={len(samples)}, min {least:.1f})"


async def _snapshot_seconds(engine: CheckpointEngine, work: Path, settings: Settings) -> float:
    outcome = await engine.snapshot("bench", [work], private=private_paths(settings))
    assert isinstance(outcome, Created), outcome
    return float(outcome.seconds)


async def bench(base: Path, files: int, runs: int) -> None:
    work = base / "work"
    _tree(work, files)
    await trio.sleep(2.1)  # past the racy window of the files just written
    print(f"tree: {files} files in {files // 100} folders, {os.cpu_count()} cores")

    firsts = []
    for r in range(3):
        settings = _settings(base / f"first{r}")
        async with open_checkpoints(settings) as engine:
            firsts.append(await _snapshot_seconds(engine, work, settings))
    first_disk = _disk(settings.data_dir / "checkpoints")

    target = work / "pkg050" / "mod050.py"
    incremental, full_walk, restore_one = [], [], []
    async with open_checkpoints(settings) as engine:
        await _snapshot_seconds(engine, work, settings)  # the cache of this process
        before = _disk(settings.data_dir / "checkpoints")
        for k in range(runs):
            target.write_text(f"value = {k}  # changed\n")
            incremental.append(await _snapshot_seconds(engine, work, settings))
        per_checkpoint = (_disk(settings.data_dir / "checkpoints") - before) / runs
        listed = await engine.checkpoints("bench")
        for k in range(runs):
            target.write_text(f"value = -{k}  # changed again\n")
            started = time.perf_counter()
            done = await engine.restore("bench", listed[-1].id, private=private_paths(settings))
            restore_one.append(time.perf_counter() - started)
            assert done.failed == () and done.preview.roots[0].restored == 1
        for k in range(1000):
            (work / f"pkg{k // 100:03}" / f"mod{k % 100:03}.py").write_text(f"big change {k}\n")
        started = time.perf_counter()
        done = await engine.restore("bench", listed[-1].id, private=private_paths(settings))
        restore_many = time.perf_counter() - started
        assert done.preview.roots[0].restored == 1000

    restarts = []
    for _ in range(3):
        async with open_checkpoints(settings) as engine:
            restarts.append(await _snapshot_seconds(engine, work, settings))

    async with open_checkpoints(settings, watch=False) as engine:
        await _snapshot_seconds(engine, work, settings)
        for k in range(runs):
            target.write_text(f"value = {k}  # full walk\n")
            full_walk.append(await _snapshot_seconds(engine, work, settings))

    llm = await _fake_llm_rounds(base / "llm", 20)

    print(f"first snapshot (new store)                   {_ms(firsts)}")
    print(f"incremental, 1 file changed (inotify)        {_ms(incremental)}")
    print(f"incremental, 1 file changed (full stat walk) {_ms(full_walk)}")
    print(f"first snapshot after a restart (store full)  {_ms(restarts)}")
    print(f"restore 1 file (preview + undo + apply)      {_ms(restore_one)}")
    print(f"restore 1,000 files                          {restore_many * 1000:9.1f} ms")
    print(f"disk: after the first checkpoint             {first_disk / 1024:9.1f} KiB")
    print(f"disk: per incremental checkpoint             {per_checkpoint / 1024:9.1f} KiB")
    print(f"one-call turn, fake LLM server (HTTP+SQLite) {_ms(llm)}")
    print("one round of a real model                    seconds (prefill + generation)")
    target_ms = 50
    verdict = "met" if statistics.median(incremental) * 1000 < target_ms else "MISSED"
    print(f"target: incremental < {target_ms} ms median: {verdict}")


async def _fake_llm_rounds(tmp: Path, turns: int) -> list[float]:
    profiles = {"general": {"planning_enabled": False}}
    replies: list[dict[str, object]] = [{"text": "ok"}]
    async with open_harness(tmp, replies=replies, loop=True, profiles=profiles) as h:
        samples = []
        for i in range(turns):
            started = time.perf_counter()
            await h.runtime.agent.run(f"s-{i % 5}", "hi")
            samples.append(time.perf_counter() - started)
        return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()

    base = Path(os.path.realpath(tempfile.mkdtemp(prefix="bench-ckpt-")))

    async def bounded() -> None:
        with trio.fail_after(600):
            await bench(base, args.files, args.runs)

    trio.run(bounded)


if __name__ == "__main__":
    main()
