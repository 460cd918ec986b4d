"""One root walked into folder listings, rescanning only what changed.

`RootState` is what the engine remembers of a root between snapshots: every folder's
entries with their stat stamps and content digests, each listing's digest, and the
inotify watches. A `Scan` is one snapshot's pass over it:

1. **stat**: the folders to look at (all the first time, after an overflow or without
   inotify; else those the kernel named, those of multi-link files, new ones) are listed
   by fd; an unchanged stamp keeps its digest. A stamp whose ctime is within `RACY_NS`
   of the scan is not trusted next time (git's "racily clean" case).
2. **bounds**: too many entries or bytes to read stop the scan before anything is read
   (`OverLimit`); the clock and the caller's cancel are checked between folders and files.
3. **read**: the listed files are read by fd (``O_NOFOLLOW``) and stored, then each
   changed folder's listing and those above it, deepest first.

A root daemon reads with the tool user's rights too (`who`): what they may not read or
pass is left out with its reason, and a root they may not list is refused. Nothing of
the state changes until `ScanResult.commit`: an abandoned scan leaves it as it was.
"""

from __future__ import annotations

import errno
import heapq
import os
import stat
import time
from collections.abc import Callable

import attrs

from navi_trio.core.checkpoints._fsops import (
    READ,
    Folders,
    RootUnusableError,
    depth,
    join,
    parent_of,
)
from navi_trio.core.checkpoints._ignore import GITIGNORE_MAX_BYTES, Ignorer, NameList, Rules
from navi_trio.core.checkpoints._marks import drain
from navi_trio.core.checkpoints._model import FileTooLargeError, LeftOut
from navi_trio.core.checkpoints._objects import ObjectStore, Row
from navi_trio.core.checkpoints._packs import PackWriter
from navi_trio.core.checkpoints._state import (
    RACY_NS,
    Batch,
    Folder,
    Item,
    Limits,
    OverLimit,
    RootState,
    Stamp,
    add_up,
    size_text,
    stamp_of,
)
from navi_trio.core.checkpoints._watch import Watcher
from navi_trio.tools.runas import RunAs, may

# A root daemon copies only what the tool user may read: its commands could not
# read the rest, and a fork's copy is theirs.
_NOT_THEIRS = "the tool user may not read it (permission denied)"


class Scan:
    """One pass over `state` from the open root `root_fd`; see the module docstring."""

    def __init__(
        self,
        state: RootState,
        root_fd: int,
        objects: ObjectStore,
        *,
        names: NameList,
        hidden: frozenset[tuple[int, int]],
        limits: Limits,
        check: Callable[[], None],
        store: bool,
        writer: PackWriter | None = None,
        who: RunAs | None = None,
    ) -> None:
        self.state = state
        # `who`: the tool user of a root daemon, whose rights count too (`Folders`, `_read_one`).
        self.fds = Folders(root_fd, who)
        self.objects = objects
        self.names = names
        self.hidden = hidden
        self.limits = limits
        self.check = check
        self.store = store
        self.writer = writer  # packs the small objects this scan stores
        self.start_ns = time.time_ns()
        root = os.fstat(root_fd)
        self.root_dev = root.st_dev
        self.root_mode = stat.S_IMODE(root.st_mode)
        self.root_ident = (root.st_dev, root.st_ino)
        self.overlay: dict[str, Folder] = {}
        self.dropped: set[str] = set()
        self.read: list[tuple[str, str]] = []  # (folder, name) of files to read
        self.read_bytes = 0
        self.new_bytes = 0
        self.changed = 0
        self.linked: dict[str, bool] = {}
        self._queue: dict[str, bool] = {}  # folder -> deep
        self._heap: list[tuple[int, str]] = []
        self._dirty: set[str] = set()
        self._full = False

    def run(self) -> str:
        """Scan; the root's listing digest (`_result.ScanResult` keeps or drops it)."""
        try:
            return self._run()
        finally:
            self.fds.close()

    def _run(self) -> str:
        state = self.state
        if state.ident != self.root_ident:
            if state.ident is not None and state.notes is not None:
                # Another folder at the root's path: who changed what cannot be told.
                state.notes.note(state.path, Batch(everything=True))
            state.reset()
            state.ident = self.root_ident
        if state.watch and state.watcher is None:
            try:
                state.watcher = Watcher()
            except OSError:
                state.watch = False  # no inotify here: a full walk every time
        self._need_root()
        drain(state, self.fds.get(""), self.names)  # marks who changed what, too
        self._full = state.everything or not state.folders or state.watcher is None
        if state.watcher is not None:
            self._dirty = set(state.pending) | state.linked
        try:
            if self._full:
                self._enqueue("", deep=True)
            else:
                for rel in self._dirty:
                    self._enqueue(rel, deep=False)
            while self._heap:
                _, rel = heapq.heappop(self._heap)
                deep = self._queue.pop(rel)
                self.check()
                if rel and not deep and (rel in self.dropped or self._folder(rel) is None):
                    continue  # gone, or never known: its parent's rescan finds it
                self._scan_folder(rel, deep)
            self._bounds()
            self._read_files()
            root_tree = self._trees()
        except BaseException:
            state.pending |= self._dirty
            state.everything = state.everything or self._full
            raise
        return root_tree

    def _enqueue(self, rel: str, *, deep: bool) -> None:
        if rel in self._queue:
            self._queue[rel] = self._queue[rel] or deep
            return
        self._queue[rel] = deep
        heapq.heappush(self._heap, (depth(rel), rel))

    def _folder(self, rel: str) -> Folder | None:
        found = self.overlay.get(rel)
        if found is not None:
            return found
        if rel in self.dropped:
            return None
        return self.state.folders.get(rel)

    def _drop(self, rel: str) -> None:
        """Forget the folder `rel` and everything below it (removed or replaced)."""
        prefix = rel + "/"
        for key in [k for k in self.state.folders if k == rel or k.startswith(prefix)]:
            if key not in self.dropped:
                self.dropped.add(key)
                self.changed += self.state.folders[key].files
        for key in [k for k in self.overlay if k == rel or k.startswith(prefix)]:
            del self.overlay[key]
        self.fds.forget(rel)

    def _gitignore(self, fd: int, old: Folder | None) -> tuple[Stamp | None, Rules | None, str]:
        try:
            st = os.stat(".gitignore", dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None, None, ""
        if not stat.S_ISREG(st.st_mode) or st.st_size > GITIGNORE_MAX_BYTES:
            return None, None, ""
        if self.fds.who is not None and not may(st, os.R_OK, self.fds.who):
            return None, None, ""  # not theirs to read: no rules of it either
        found = stamp_of(st)
        racy = st.st_ctime_ns >= self.start_ns - RACY_NS
        if old is not None and old.gitignore == found and not racy:
            return found, old.rules, ""
        try:
            gfd = os.open(".gitignore", READ, dir_fd=fd)
        except OSError:
            return None, None, ""
        try:
            text = os.read(gfd, GITIGNORE_MAX_BYTES).decode("utf-8", "surrogateescape")
        finally:
            os.close(gfd)
        # A racy stamp is kept as None so the next scan reads the file again.
        return (None if racy else found), None, text

    def _scan_folder(self, rel: str, deep: bool) -> None:
        try:
            fd = self.fds.get(rel)
            if rel:
                self.fds.need(fd, os.R_OK | os.X_OK)
        except OSError as exc:
            self._unreadable(rel, exc)
            return
        old = self._folder(rel)
        parent = self._folder(parent_of(rel)[0]) if rel else None
        above = parent.ignorer if parent is not None else Ignorer()
        gi_stamp, rules, text = self._gitignore(fd, old)
        if rules is None and text:
            rules = Rules.parse(rel, text)
        ignorer = above.below(rules)
        if old is not None and ignorer is not old.ignorer and ignorer != old.ignorer:
            deep = True  # the rules for everything below changed
        watcher = self.state.watcher
        if watcher is not None and (deep or not watcher.watched(rel)):
            watcher.watch(fd, rel)  # before listing: nothing made after it is missed
        items: dict[str, Item] = {}
        sealed = False
        linked = False
        try:
            with os.scandir(fd) as it:
                entries = list(it)
        except OSError as exc:
            self._unreadable(rel, exc)
            return
        excluded = self.state.excluded
        previous = old.items if old is not None else {}
        for entry in entries:
            name = entry.name
            child = join(rel, name)
            if self.names(name) or child in excluded:
                sealed = True
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            if (st.st_dev, st.st_ino) in self.hidden:
                sealed = True
                continue
            mode = st.st_mode
            is_dir = stat.S_ISDIR(mode)
            if ignorer.stack and ignorer.ignored(child, is_dir):
                sealed = True
                continue
            stamp = stamp_of(st)
            racy = st.st_ctime_ns >= self.start_ns - RACY_NS
            prev = previous.get(name)
            if is_dir:
                if st.st_dev != self.root_dev:
                    items[name] = Item("x", stat.S_IMODE(mode), "on another file system", 0, stamp)
                    continue
                items[name] = Item("d", stat.S_IMODE(mode), "", 0, stamp)
                known = self._folder(child) is not None
                replaced = prev is not None and (prev.kind != "d" or prev.stamp[3] != st.st_ino)
                if replaced and known:
                    self._drop(child)
                if deep or replaced or prev is None or not known:
                    self._enqueue(child, deep=True)
            elif stat.S_ISREG(mode):
                if st.st_nlink > 1:
                    linked = True
                if st.st_size > self.limits.max_file_bytes:
                    cap = size_text(self.limits.max_file_bytes)
                    why = f"larger than {cap} (NAVI_CHECKPOINT_MAX_FILE_BYTES)"
                    items[name] = Item("x", stat.S_IMODE(mode), why, st.st_size, stamp)
                elif (
                    prev is not None and prev.kind == "f" and prev.stamp == stamp and not prev.racy
                ):
                    items[name] = prev
                    continue
                else:
                    items[name] = Item("f", stat.S_IMODE(mode), "", st.st_size, stamp, racy)
                    self.read.append((rel, name))
                    if prev is None or prev.stamp != stamp:  # not a racy re-read
                        self.read_bytes += st.st_size
                    continue
            elif stat.S_ISLNK(mode):
                if prev is not None and prev.kind == "l" and prev.stamp == stamp and not prev.racy:
                    items[name] = prev
                    continue
                try:
                    target = os.readlink(name, dir_fd=fd)
                except OSError:
                    continue  # no longer a link: seen at the next scan
                items[name] = Item("l", 0, target, 0, stamp, racy)
            else:
                why = "a pipe, socket or device"
                items[name] = Item("x", stat.S_IMODE(mode), why, 0, stamp)
            if prev != items[name]:
                self.changed += 1
        for name, prev in previous.items():
            now = items.get(name)
            if prev.kind == "d" and (now is None or now.kind != "d"):
                self._drop(join(rel, name))
            elif now is None and prev.kind != "d":
                self.changed += 1
        folder = Folder(items, ignorer, rules, gi_stamp, sealed)
        folder.tally()
        if old is not None and old.tree is not None and old.items == items:
            folder.tree = old.tree
        self.overlay[rel] = folder
        self.linked[rel] = linked

    def _need_root(self) -> None:
        """The root itself must be listable by the tool user (RootUnusableError)."""
        try:
            self.fds.need(self.fds.get(""), os.R_OK | os.X_OK)
        except PermissionError:
            raise RootUnusableError(
                f"{self.state.path} cannot be read by the tool user (permission denied)"
            ) from None

    def _unreadable(self, rel: str, exc: OSError) -> None:
        """Folder `rel` cannot be opened or listed: left out of its parent."""
        if not rel:
            raise exc
        self._drop(rel)
        up, name = parent_of(rel)
        parent = self._folder(up)
        if parent is None or name not in parent.items:
            return
        item = parent.items[name]
        why = f"a folder that cannot be read ({exc.strerror or exc})"
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            why = "changed while the checkpoint was taken"
        items = dict(parent.items)
        items[name] = Item("x", item.mode, why, 0, item.stamp, racy=True)
        self._replace(up, parent, items)

    def _replace(self, rel: str, folder: Folder, items: dict[str, Item]) -> None:
        copy = attrs.evolve(folder, items=items, tree=None)
        copy.tally()
        self.overlay[rel] = copy

    def _bounds(self) -> None:
        entries = self.totals()[0]
        if entries > self.limits.max_files:
            raise OverLimit(
                "too_many_files",
                f"{entries} files and folders, over NAVI_CHECKPOINT_MAX_FILES="
                f"{self.limits.max_files}",
            )
        if self.store and self.read_bytes > self.limits.max_bytes:
            self._too_large(self.read_bytes)

    def _too_large(self, size: int) -> None:
        raise OverLimit(
            self.limits.bytes_code,
            f"{size_text(size)} of new or changed files to copy, over "
            f"{self.limits.bytes_name} ({size_text(self.limits.max_bytes)})",
        )

    def _read_files(self) -> None:
        for rel, name in self.read:
            self.check()
            folder = self.overlay.get(rel)
            if folder is None:
                continue  # dropped after it was listed
            item = folder.items[name]
            folder.items[name] = self._read_one(rel, name, item)
            prev = self.state.folders.get(rel)
            before = prev.items.get(name) if prev is not None else None
            if before != folder.items[name]:
                self.changed += 1
            if self.store and self.new_bytes > self.limits.max_bytes:
                self._too_large(self.new_bytes)  # files re-read as racy had changed
        for folder in self.overlay.values():
            folder.tally()

    def _read_one(self, rel: str, name: str, item: Item) -> Item:
        try:
            fd = os.open(name, READ, dir_fd=self.fds.get(rel))
        except OSError as exc:
            why = "changed while the checkpoint was taken"
            if exc.errno == errno.EACCES:
                why = "cannot be read (permission denied)"
            return attrs.evolve(item, kind="x", ref=why, racy=True)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return attrs.evolve(item, kind="x", ref="changed while the checkpoint was taken")
            if self.fds.who is not None and not may(st, os.R_OK, self.fds.who):
                return attrs.evolve(item, kind="x", ref=_NOT_THEIRS, racy=True)
            try:
                digest, new, size = self.objects.put_file(
                    fd, self.limits.max_file_bytes, self.check, store=self.store, writer=self.writer
                )
            except FileTooLargeError as big:
                cap = size_text(self.limits.max_file_bytes)
                why = f"larger than {cap} (NAVI_CHECKPOINT_MAX_FILE_BYTES)"
                return attrs.evolve(item, kind="x", ref=why, size=big.size, racy=True)
        finally:
            os.close(fd)
        self.new_bytes += new
        racy = st.st_ctime_ns >= self.start_ns - RACY_NS
        return Item("f", stat.S_IMODE(st.st_mode), digest, size, stamp_of(st), racy, st.st_nlink)

    def _trees(self) -> str:
        """Write the listing of every changed folder and of those above it."""
        for rel in [r for r, f in self.overlay.items() if f.tree is None]:
            while rel:
                rel = parent_of(rel)[0]
                folder = self._folder(rel)
                if folder is None or (rel in self.overlay and folder.tree is None):
                    break
                self.overlay[rel] = attrs.evolve(folder, tree=None)
        for rel in sorted(self.overlay, key=depth, reverse=True):
            folder = self.overlay[rel]
            if folder.tree is not None:
                continue
            rows = []
            for name, item in folder.items.items():
                ref = item.ref
                if item.kind == "d":
                    child = self._folder(join(rel, name))
                    ref = child.tree if child is not None and child.tree else ""
                rows.append(Row(name, item.kind, item.mode, ref, item.size))
            folder.tree, new = self.objects.put_tree(rows, store=self.store, writer=self.writer)
            self.new_bytes += new
        root = self._folder("")
        assert root is not None and root.tree is not None
        return root.tree

    def totals(self) -> tuple[int, int, int, int]:
        """(entries, files, folders, bytes) of the tree as this scan leaves it."""
        sums = [0, 0, 0, 0]
        for rel, folder in self.state.folders.items():
            if rel not in self.overlay and rel not in self.dropped:
                add_up(sums, folder)
        for folder in self.overlay.values():
            add_up(sums, folder)
        return sums[0], sums[1], sums[2] + 1, sums[3]

    def left_out(self, limit: int) -> list[LeftOut]:
        found: list[LeftOut] = []
        for rel, folder in [*self.state.folders.items(), *self.overlay.items()]:
            if not folder.left_out or self._folder(rel) is not folder:
                continue
            for name, item in folder.items.items():
                if item.kind == "x" and len(found) < limit:
                    found.append(LeftOut(self.state.path, join(rel, name), item.size, item.ref))
        return found
