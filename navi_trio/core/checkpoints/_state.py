"""What the engine remembers of a root between snapshots, and the values a scan builds.

`RootState` holds every folder's entries (`Item`: kind, permission bits, digest or link
text, size, and the stat stamp by which a change is noticed), each folder's `.gitignore`
rules and listing digest (`Folder`), and the root's inotify watches. It is used by one
thread at a time, under the engine's lock of that root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import attrs

from navi_trio.core.checkpoints._ignore import Ignorer, Rules
from navi_trio.core.checkpoints._watch import Watcher

RACY_NS = 2_000_000_000
Stamp = tuple[int, int, int, int, int]  # size, mtime_ns, ctime_ns, inode, device


class OverLimit(Exception):
    """A bound stopped the scan: `code` (Skipped.code) and `reason` (in words)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@attrs.frozen
class Item:
    """One entry of a folder (`Row` without its name), and how it was last seen.

    Two items are equal when their rows are: the stamp is how a change is noticed,
    not part of what is stored."""

    kind: str
    mode: int
    ref: str
    size: int
    stamp: Stamp = attrs.field(eq=False)
    racy: bool = attrs.field(default=False, eq=False)
    links: int = attrs.field(default=1, eq=False)


@attrs.define
class Folder:
    """A folder's entries (`sealed`: some were left out by a rule, so a restore must not
    remove it), its `.gitignore` (stamp and rules), and its listing's digest."""

    items: dict[str, Item]
    ignorer: Ignorer  # for its entries: the parents' rules and its own
    rules: Rules | None
    gitignore: Stamp | None
    sealed: bool
    tree: str | None = None
    entries: int = 0
    files: int = 0
    folders: int = 0
    bytes: int = 0
    left_out: int = 0

    def tally(self) -> None:
        kinds = [i.kind for i in self.items.values()]
        self.entries = len(kinds)
        self.files = sum(k in ("f", "l") for k in kinds)
        self.folders = kinds.count("d")
        self.left_out = kinds.count("x")
        self.bytes = sum(i.size for i in self.items.values() if i.kind == "f")


@attrs.frozen
class Limits:
    max_bytes: int
    max_file_bytes: int
    max_files: int
    # Which bound `max_bytes` is (Skipped.code) and how it is named in its reason.
    bytes_code: str = "too_large"
    bytes_name: str = "NAVI_CHECKPOINT_MAX_BYTES"


@attrs.frozen
class Room:
    """What a snapshot may add to the store under a total (a user's checkpoints, all
    of them), when that is less than NAVI_CHECKPOINT_MAX_BYTES: `bytes` of new content,
    `code` for `Skipped`, and `name`, the bound in words."""

    bytes: int
    code: str
    name: str


@attrs.frozen
class Batch:
    """What one drain of a root's watch says changed: relative paths, with their stamps
    after the change when they were asked for (None: gone; folders have none), or
    `everything` (the watch cannot tell which)."""

    paths: frozenset[str] = frozenset()
    stamps: dict[str, Stamp | None] = attrs.field(factory=dict)
    everything: bool = False

    @property
    def empty(self) -> bool:
        return not self.paths and not self.everything


class Notes(Protocol):
    """Where a root's drains go (`_marks.Ledger`): who changed what."""

    def navi(self, root: Path, forced: str | None) -> bool: ...
    def note(self, root: Path, batch: Batch, forced: str | None = None) -> None: ...


class RootState:
    """What is known of one root between snapshots (used under the engine's lock of
    that root, by one thread at a time). `notes` hears every drain of its watch."""

    def __init__(
        self, path: Path, excluded: frozenset[str], *, watch: bool, notes: Notes | None = None
    ) -> None:
        self.path = path
        self.notes = notes
        self.excluded = excluded  # relative paths left out (navi's data, nested roots)
        self.folders: dict[str, Folder] = {}
        self.ident: tuple[int, int] | None = None
        self.watch = watch
        self.watcher: Watcher | None = None
        self.pending: set[str] = set()
        self.everything = True
        self.linked: set[str] = set()  # folders holding a file with several links

    def reset(self, *, keep_watch: bool = False) -> None:
        """Forget what was seen (the next scan walks everything); `keep_watch`: the
        watches stay (the same folder: what they queue is still its changes)."""
        if not keep_watch:
            self.close()
        self.folders = {}
        self.pending = set()
        self.everything = True
        self.linked = set()

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None


def stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def size_text(n: int) -> str:
    """A size in words: 512 bytes, 1.5 KiB, 16.0 MiB, 2.1 GiB."""
    if n < 1024:
        return f"{n} bytes"
    for unit, shift in (("KiB", 10), ("MiB", 20), ("GiB", 30)):
        if n < 1 << (shift + 10) or unit == "GiB":
            return f"{n / (1 << shift):.1f} {unit}"
    raise AssertionError("unreachable")


def add_up(sums: list[int], folder: Folder) -> None:
    sums[0] += folder.entries
    sums[1] += folder.files
    sums[2] += folder.folders
    sums[3] += folder.bytes
