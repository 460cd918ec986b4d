"""Who changed what since a checkpoint: a session's own calls (navi), or someone else.

A files rewind puts back only what the session's tool calls changed; what changed
between its calls is someone else's work (an editor, another program, another session)
and stays. So every change a root's inotify watch sees is **marked**, per owner that
snapshots the root: ``NAVI`` when one of that owner's writing calls ran on the folder
(`CheckpointEngine.calling` drains the watch at each call's start and end) or its own
restore wrote, ``OTHER`` otherwise. A change made while a call runs counts as navi's.
What the watch cannot name (an overflow, a swapped root) marks every path (`Marks.all`).
A ``NAVI`` path keeps its stamp as the call left it: one that differs now was changed by
someone the watch did not see, and counts as ``OTHER`` too.

On a rewind, the marks made after the checkpoint decide per path (`Marks.flags`):
``NAVI`` alone is restored, ``OTHER`` alone (or no mark) is left, both is a conflict.

Storage: one append-only ``owners/KEY/marks.jsonl`` per owner, one line per drain::

    {"after": ID, "root": PATH, "paths": {rel: flags}, "stamps": {rel: [..] | null},
     "all": flags}

`after` is the owner's newest checkpoint when the line was written. The file is merged
past `FILE_MAX` (whole roots then stand for their paths) and when checkpoints are
pruned. A folder marks for the `OWNERS_MAX` owners that snapshotted it last; an older
one is marked again from its next snapshot on.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from navi_trio.core.checkpoints._fsops import Folders, join, parent_of, write_all
from navi_trio.core.checkpoints._ignore import NameList
from navi_trio.core.checkpoints._objects import write_atomic
from navi_trio.core.checkpoints._state import Batch, Item, RootState, Stamp, stamp_of
from navi_trio.core.checkpoints._watch import (
    IN_CREATE,
    IN_ISDIR,
    IN_MOVED_FROM,
    IN_MOVED_TO,
)

NAVI = 1
OTHER = 2
PATHS_MAX = 10_000  # paths one drain marks; past it, every path (`Batch.everything`)
WALK_MAX = 10_000  # entries of new folders walked by one drain to watch and mark them
FILE_MAX = 4 << 20  # a marks file past this is merged (to half of it, at most)
OWNERS_MAX = 32  # owners marked per folder: the ones that snapshotted it last
MARKS = "marks.jsonl"


def drain(
    state: RootState, root_fd: int | None, names: NameList, forced: str | None = None
) -> Batch:
    """Read what the root's watch queued, tell `state.notes`, and return it.

    The folders to rescan go to `state.pending` (the next scan looks at them). A folder
    that appeared (made, or moved in) is watched now and everything in it marked, so
    what is made in it later is seen on its own. `root_fd` is the root's open fd (None:
    new folders are not walked and the batch says everything when one came)."""
    batch = _read(state, root_fd, names, forced)
    if state.notes is not None and not batch.empty:
        state.notes.note(state.path, batch, forced)
    return batch


def _read(state: RootState, root_fd: int | None, names: NameList, forced: str | None) -> Batch:
    watcher = state.watcher
    if watcher is None:
        # Never watched (no scan yet) says nothing; watched once and no longer (or no
        # inotify here) cannot say what changed meanwhile.
        return Batch(everything=state.ident is not None or not state.watch)
    drained = watcher.drain()
    state.pending |= drained.folders
    state.everything = state.everything or drained.everything
    everything = drained.everything or drained.unnamed
    paths: set[str] = set()
    fds = Folders(root_fd) if root_fd is not None else None
    walked = [0]
    try:
        for folder, name, mask in drained.events:
            rel = join(folder, name) if name else folder  # no name: the folder itself
            if rel and _excluded(rel, state.excluded):
                continue
            paths.add(rel)
            if not mask & IN_ISDIR:
                continue
            if mask & (IN_CREATE | IN_MOVED_TO):
                if fds is None or not _walk(state, fds, rel, names, paths, walked):
                    everything = True
            elif mask & IN_MOVED_FROM:
                paths.update(_known_below(state, rel))
        if len(paths) > PATHS_MAX:
            return Batch(everything=True)
        navi = state.notes is not None and state.notes.navi(state.path, forced)
        stamps = _stamps(fds, paths) if navi and fds is not None else {}
    finally:
        if fds is not None:
            fds.close()
    return Batch(frozenset(paths), stamps, everything)


def _excluded(rel: str, excluded: frozenset[str]) -> bool:
    return any(rel == x or rel.startswith(x + "/") for x in excluded)


def _walk(
    state: RootState, fds: Folders, rel: str, names: NameList, out: set[str], walked: list[int]
) -> bool:
    """Watch the new folder `rel` and what is below it, marking every entry; False when
    it could not all be walked (`WALK_MAX`)."""
    watcher = state.watcher
    stack = [rel]
    while stack:
        here = stack.pop()
        try:
            fd = fds.get(here)
            if watcher is not None:
                watcher.watch(fd, here)  # before listing: nothing made after it is missed
            with os.scandir(fd) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        except OSError:
            continue  # gone again, or not a folder now: its parent's events said so
        for name, is_dir in entries:
            walked[0] += 1
            if walked[0] > WALK_MAX:
                return False
            child = join(here, name)
            out.add(child)
            if is_dir and not names(name) and not _excluded(child, state.excluded):
                stack.append(child)
    return True


def _known_below(state: RootState, rel: str) -> Iterator[str]:
    """What the last scan saw below the folder `rel` (it was moved away whole)."""
    prefix = rel + "/"
    for key, folder in state.folders.items():
        if key == rel or key.startswith(prefix):
            for name in folder.items:
                yield join(key, name)


def _stamps(fds: Folders, paths: Iterable[str]) -> dict[str, Stamp | None]:
    out: dict[str, Stamp | None] = {}
    for rel in paths:
        if not rel:
            continue
        up, name = parent_of(rel)
        try:
            st = os.stat(name, dir_fd=fds.get(up), follow_symlinks=False)
        except OSError:
            out[rel] = None
            continue
        if not stat.S_ISDIR(st.st_mode):
            out[rel] = stamp_of(st)
    return out


def stamps_of(root_fd: int, paths: Iterable[str]) -> dict[str, Stamp | None]:
    """The stamps of `paths` below the open root `root_fd` now (None: gone)."""
    fds = Folders(root_fd)
    try:
        return _stamps(fds, paths)
    finally:
        fds.close()


@attrs.define
class Marks:
    """The marks of one root since a checkpoint, merged."""

    paths: dict[str, int] = attrs.field(factory=dict)
    stamps: dict[str, Stamp | None] = attrs.field(factory=dict)
    all: int = 0

    def add(self, line: Mapping[str, Any]) -> None:
        for rel, flags in line.get("paths", {}).items():
            self.paths[rel] = self.paths.get(rel, 0) | int(flags)
        for rel, stamp in line.get("stamps", {}).items():
            self.stamps[rel] = None if stamp is None else tuple(stamp)
        self.all |= int(line.get("all", 0))

    def flags(self, rel: str, now: Item | None) -> int:
        """Who changed `rel` (NAVI, OTHER, both, or 0: nobody the watch saw), with `now`
        the item there now (None: nothing)."""
        flags = self.paths.get(rel, 0) | self.all
        if flags == NAVI and rel in self.stamps and (now is None or now.kind != "d"):
            if self.stamps[rel] != (None if now is None else now.stamp):
                flags |= OTHER  # changed since navi's call ended, unseen
        return flags

    def line(self, after: str, root: Path) -> dict[str, Any]:
        return {
            "after": after,
            "root": str(root),
            "paths": self.paths,
            "stamps": {k: None if v is None else list(v) for k, v in self.stamps.items()},
            "all": self.all,
        }


def batch_line(batch: Batch, flag: int, after: str, root: Path) -> dict[str, Any]:
    marks = Marks(
        {rel: flag for rel in batch.paths},
        dict(batch.stamps) if flag == NAVI else {},
        flag if batch.everything else 0,
    )
    return marks.line(after, root)


class Ledger:
    """Which owners watch which roots, which of them has a writing call running there,
    and their marks files (see the module docstring). Thread-safe: drains of different
    roots run in different worker threads."""

    def __init__(self, folder_of: Callable[[str], Path], latest_of: Callable[[str], str]) -> None:
        self._folder_of = folder_of  # owner -> its records' folder
        self._latest_of = latest_of  # owner -> its newest checkpoint id ("": none)
        self._lock = threading.Lock()
        self._owners: dict[Path, dict[str, None]] = {}  # oldest registered first
        self._active: dict[Path, dict[str, int]] = {}
        self._latest: dict[str, str] = {}

    def register(self, owner: str, roots: Sequence[Path]) -> None:
        """`owner` snapshots `roots`: from now on their drains mark for it."""
        with self._lock:
            if owner not in self._latest:
                self._latest[owner] = self._latest_of(owner)
            for root in roots:
                owners = self._owners.setdefault(root, {})
                owners.pop(owner, None)
                owners[owner] = None
                active = self._active.get(root, {})
                idle = [o for o in owners if o not in active and o != owner]  # oldest first
                while len(owners) > OWNERS_MAX and idle:
                    del owners[idle.pop(0)]

    def recorded(self, owner: str, checkpoint_id: str) -> None:
        """A checkpoint of `owner` was written: later marks come after it."""
        with self._lock:
            if checkpoint_id > self._latest.get(owner, ""):
                self._latest[owner] = checkpoint_id

    def forget(self, owner: str) -> None:
        """`owner` is gone (its checkpoints deleted): nothing more is marked for it."""
        with self._lock:
            self._latest.pop(owner, None)
            for owners in self._owners.values():
                owners.pop(owner, None)
            for active in self._active.values():
                active.pop(owner, None)

    def begin(self, owner: str, roots: Sequence[Path]) -> None:
        with self._lock:
            for root in roots:
                active = self._active.setdefault(root, {})
                active[owner] = active.get(owner, 0) + 1

    def end(self, owner: str, roots: Sequence[Path]) -> None:
        with self._lock:
            for root in roots:
                active = self._active.get(root, {})
                left = active.get(owner, 0) - 1
                if left > 0:
                    active[owner] = left
                else:
                    active.pop(owner, None)
                    if not active:
                        self._active.pop(root, None)

    def navi(self, root: Path, forced: str | None) -> bool:
        """Whether a drain of `root` now marks navi's changes for some owner."""
        with self._lock:
            return forced is not None or bool(self._active.get(root))

    def note(self, root: Path, batch: Batch, forced: str | None = None) -> None:
        """A drain of `root` read `batch`: mark it for every owner watching the root."""
        with self._lock:
            active = self._active.get(root, {})
            for owner in list(self._owners.get(root, ())):
                flag = NAVI if owner == forced or active.get(owner) else OTHER
                after = self._latest.get(owner, "")
                self._append(owner, [batch_line(batch, flag, after, root)])

    def mark(
        self,
        owner: str,
        root: Path,
        paths: Iterable[str],
        stamps: Mapping[str, Stamp | None],
        *,
        after: str | None = None,
    ) -> None:
        """Mark `paths` of `root` as `owner`'s navi's (what its restore wrote), after its
        newest checkpoint (or `after`)."""
        with self._lock:
            tag = after if after is not None else self._latest.get(owner, "")
            line = Marks(dict.fromkeys(paths, NAVI), dict(stamps)).line(tag, root)
            self._append(owner, [line])

    def since(self, owner: str, checkpoint_id: str) -> dict[Path, Marks]:
        """Per root, the marks made after the checkpoint `checkpoint_id` of `owner`."""
        out: dict[Path, Marks] = {}
        with self._lock:
            lines = self._read(owner)
        for line in lines:
            after = line.get("after", "")
            if after and after >= checkpoint_id:
                out.setdefault(Path(line["root"]), Marks()).add(line)
        return out

    def any_since(self, owner: str, checkpoint_id: str) -> bool:
        return any(m.paths or m.all for m in self.since(owner, checkpoint_id).values())

    def compact(self, owner: str, keep_from: str = "") -> None:
        """Merge the owner's marks file, dropping lines of checkpoints before `keep_from`
        (pruned)."""
        with self._lock:
            self._compact(owner, keep_from)

    def _path(self, owner: str) -> Path:
        return self._folder_of(owner) / MARKS

    def _append(self, owner: str, lines: list[dict[str, Any]]) -> None:
        path = self._path(owner)
        data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            write_all(fd, data.encode("utf-8", "surrogateescape"))
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size > FILE_MAX:
            self._compact(owner, "")

    def _read(self, owner: str) -> list[dict[str, Any]]:
        try:
            raw = self._path(owner).read_bytes()
        except FileNotFoundError:
            return []
        lines = []
        for text in raw.decode("utf-8", "surrogateescape").splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue  # a line cut by a crash
            if isinstance(line, dict) and isinstance(line.get("root"), str):
                lines.append(line)
        return lines

    def _compact(self, owner: str, keep_from: str) -> None:
        path = self._path(owner)
        if not path.exists():
            return
        groups: dict[tuple[str, str], Marks] = {}
        for line in self._read(owner):
            after = str(line.get("after", ""))
            if keep_from and after < keep_from:
                continue
            groups.setdefault((after, line["root"]), Marks()).add(line)
        lines = [m.line(after, Path(root)) for (after, root), m in groups.items()]
        size = sum(len(json.dumps(line)) for line in lines)
        if size > FILE_MAX // 2:  # still big: whole roots stand for their paths
            for m in groups.values():
                if m.paths:
                    for flags in m.paths.values():
                        m.all |= flags
                    m.paths, m.stamps = {}, {}
            lines = [m.line(after, Path(root)) for (after, root), m in groups.items()]
        data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        write_atomic(path, data.encode("utf-8", "surrogateescape"))
