"""Garbage collection: remove every object nothing refers to any more.

Kept: what any record of any owner reaches (its root listings, the listings below
them, the contents they name), what a pending journal writes, and what this process's
cached scans trust (a cached digest is reused without being stored again). Runs under
the store's exclusive flock, so no snapshot is writing objects meanwhile. The number in
``gc`` goes up by one: another process whose cached scan was made under an older number
drops it before trusting it (`engine`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from navi_trio.core.checkpoints._apply import Journal
from navi_trio.core.checkpoints._model import CheckpointDamagedError
from navi_trio.core.checkpoints._objects import FileLock, ObjectStore, key_of, write_atomic
from navi_trio.core.checkpoints._records import Records
from navi_trio.core.checkpoints._state import RootState


def gc_number(folder: Path) -> int:
    try:
        return int((folder / "gc").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def collect(
    folder: Path,
    objects: ObjectStore,
    records: Records,
    journal: Journal,
    states: Iterable[RootState],
) -> tuple[int, int]:
    """(objects removed, the new gc number)."""
    lock = FileLock(folder / "lock")
    lock.acquire(exclusive=True)
    try:
        objects.clean_tmp()
        marked: set[str] = set()
        stack = list(records.all_trees())
        for state in states:  # a committed folder always has its listing: it names the rest
            stack += [cached.tree for cached in state.folders.values() if cached.tree]
        while stack:
            digest = stack.pop()
            if digest in marked:
                continue
            marked.add(digest)
            try:
                rows = objects.tree(digest)
            except CheckpointDamagedError:
                continue
            for row in rows:
                if row.kind == "f":
                    marked.add(row.ref)
                elif row.kind == "d" and row.ref:
                    stack.append(row.ref)
        marked |= journal.digests()
        marked = {key_of(ref) for ref in marked}  # a ref's namespace aside: the stored name
        removed = objects.packs.collect(marked)
        for digest, path in list(objects.digests()):
            if digest not in marked:
                path.unlink(missing_ok=True)
                removed += 1
        generation = gc_number(folder) + 1
        write_atomic(folder / "gc", str(generation).encode())
        return removed, generation
    finally:
        lock.release()
