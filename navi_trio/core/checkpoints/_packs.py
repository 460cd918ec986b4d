"""Small objects packed together: one file per snapshot, not one per object.

Why: a first snapshot of 10,000 small files wrote 10,000 object files at ~100-300 µs a
create-and-rename on the 2-core box (3-8 s in all), each taking a 4 KiB block. Every
object up to `PACKED_MAX` bytes a snapshot stores goes into one pack written in sequence
(``packs/NAME.pack``) with an index (``packs/NAME.idx``); larger ones stay loose.

A pack is renamed into place before its index, so it is used only when complete (one
without an index is garbage). Each read checks the object's digest. The indexes are kept
in memory; `ObjectStore.sync` reloads them when another process collected garbage.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import struct
import threading
from collections import defaultdict
from pathlib import Path

from navi_trio.core.checkpoints._fsops import write_all
from navi_trio.core.checkpoints._model import CheckpointDamagedError

PACKED_MAX = 64 << 10
_ENTRY = struct.Struct(">32sQI")  # digest, offset, length
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
Where = tuple[str, int, int]  # pack name, offset, length


class Packs:
    """The packs under `folder` (``DATA/checkpoints/packs``) and their index."""

    def __init__(self, folder: Path, tmp: Path) -> None:
        self.folder = folder
        self.tmp = tmp
        self._index: dict[str, Where] = {}
        self._loaded: set[str] = set()
        self._lock = threading.Lock()

    def prepare(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def reload(self) -> None:
        with self._lock:
            self._index = {}
            self._loaded = set()
        self.refresh()

    def refresh(self) -> None:
        """Load the index of every pack this process has not seen yet."""
        with self._lock:
            try:
                names = os.listdir(self.folder)
            except FileNotFoundError:
                return
            for name in names:
                stem = name[:-4]
                if name.endswith(".idx") and stem not in self._loaded:
                    try:
                        raw = (self.folder / name).read_bytes()
                    except FileNotFoundError:
                        continue
                    for k in range(0, len(raw) - len(raw) % _ENTRY.size, _ENTRY.size):
                        digest, offset, length = _ENTRY.unpack_from(raw, k)
                        self._index[digest.hex()] = (stem, offset, length)
                    self._loaded.add(stem)

    def count(self) -> int:
        self.reload()
        return len(self._index)

    def find(self, digest: str, *, refresh: bool) -> Where | None:
        """Where `digest` is packed; `refresh`: look for new packs on a miss."""
        found = self._index.get(digest)
        if found is None and refresh:
            self.refresh()
            found = self._index.get(digest)
        return found

    def read(self, digest: str, prefix: bytes = b"") -> bytes | None:
        """The packed object `digest`, or None when no pack holds it; `prefix` is what its
        namespace hashes before the content (`_objects.prefix_of`)."""
        for attempt in range(2):
            found = self.find(digest, refresh=True)
            if found is None:
                return None
            stem, offset, length = found
            try:
                fd = os.open(self.folder / f"{stem}.pack", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                if attempt:
                    return None
                self.reload()  # rewritten by another process's collection
                continue
            try:
                data = os.pread(fd, length, offset)
            finally:
                os.close(fd)
            if hashlib.sha256(prefix + data).hexdigest() != digest:
                raise CheckpointDamagedError(f"the stored copy {digest[:12]} is damaged")
            return data
        return None

    def add_index(self, stem: str, entries: dict[str, tuple[int, int]]) -> None:
        with self._lock:
            for digest, (offset, length) in entries.items():
                self._index[digest] = (stem, offset, length)
            self._loaded.add(stem)

    def collect(self, marked: set[str]) -> int:
        """Remove the packed objects not in `marked` (under the store's exclusive lock):
        a pack with none of them is deleted, one with some is rewritten without the
        others. Packs without an index are deleted. How many objects were removed."""
        self.reload()
        by_pack: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
        for digest, (stem, offset, length) in self._index.items():
            by_pack[stem].append((digest, offset, length))
        removed = 0
        for name in os.listdir(self.folder):
            stem, _, ext = name.rpartition(".")
            if ext in ("pack", "idx") and stem not in by_pack:
                # No index, or every object of it found in another pack (a collection
                # killed between writing a pack's replacement and removing it).
                (self.folder / f"{stem}.idx").unlink(missing_ok=True)
                (self.folder / f"{stem}.pack").unlink(missing_ok=True)
        for stem, entries in by_pack.items():
            live = [e for e in entries if e[0] in marked]
            if len(live) == len(entries):
                continue
            removed += len(entries) - len(live)
            if live:
                writer = PackWriter(self)
                with open(self.folder / f"{stem}.pack", "rb") as src:
                    for digest, offset, length in live:
                        src.seek(offset)
                        writer.add(digest, src.read(length), force=True)
                writer.finish()
            (self.folder / f"{stem}.idx").unlink(missing_ok=True)
            (self.folder / f"{stem}.pack").unlink(missing_ok=True)
        self.reload()
        return removed


class PackWriter:
    """The pack one snapshot writes; `finish` makes it visible, `abort` drops it."""

    def __init__(self, packs: Packs) -> None:
        self.packs = packs
        self.stem = secrets.token_hex(8)
        self._fd: int | None = None
        self._entries: dict[str, tuple[int, int]] = {}
        self._size = 0

    def has(self, digest: str) -> bool:
        return digest in self._entries or self.packs.find(digest, refresh=False) is not None

    def add(self, digest: str, data: bytes, *, force: bool = False) -> int:
        """Pack `data` (its digest given); the bytes newly written."""
        if not force and self.has(digest):
            return 0
        if digest in self._entries:
            return 0
        if self._fd is None:
            self._fd = os.open(self.packs.tmp / f"{self.stem}.pack", _FLAGS, 0o600)
        write_all(self._fd, data)
        self._entries[digest] = (self._size, len(data))
        self._size += len(data)
        return len(data)

    def finish(self) -> None:
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        index = b"".join(
            _ENTRY.pack(bytes.fromhex(d), off, n) for d, (off, n) in self._entries.items()
        )
        tmp_idx = self.packs.tmp / f"{self.stem}.idx"
        fd = os.open(tmp_idx, _FLAGS, 0o600)
        try:
            write_all(fd, index)
        finally:
            os.close(fd)
        os.rename(self.packs.tmp / f"{self.stem}.pack", self.packs.folder / f"{self.stem}.pack")
        os.rename(tmp_idx, self.packs.folder / f"{self.stem}.idx")
        self.packs.add_index(self.stem, self._entries)
        self._entries = {}

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for ext in (".pack", ".idx"):
            (self.packs.tmp / f"{self.stem}{ext}").unlink(missing_ok=True)
        self._entries = {}
