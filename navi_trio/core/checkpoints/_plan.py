"""What a restore of one root does: the difference between now and a checkpoint.

`plan_root` compares the tree the preview's scan saw with the checkpoint's and returns
the operations that turn one into the other, in the order `_apply` runs them, with the
summary a preview shows. Left as they are: what a rule leaves out now or the checkpoint's
own `.gitignore` files ignored; a path no checkpoint holds a copy of (too large, a pipe,
unreadable), now or then; a folder with anything kept in it; and in a selective restore
(`Only`: a rewind), a path the owner's calls did not change since the checkpoint, or a
conflict unless asked to restore conflicts. What is not put back keeps everything below it.

Operations (JSON lists, written to the journal as they are): ``["unlock", rel, mode]``
(a folder the restore writes in made ``u+rwx``), ``["rm", rel]``, ``["rmdir", rel]``,
``["mkdir", rel]``, ``["put", rel, digest, mode]``, ``["link", rel, text]``,
``["chmod", rel, mode]``, ``["dirmode", rel, mode]`` (a folder's bits, last and deepest
first, so a read-only folder is made read-only after what goes in it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from navi_trio.core.checkpoints._fsops import depth, join, parent_of
from navi_trio.core.checkpoints._ignore import GITIGNORE_MAX_BYTES, Ignorer, Rules
from navi_trio.core.checkpoints._marks import NAVI, Marks
from navi_trio.core.checkpoints._model import PATHS_LISTED, Change, Kept, RootChanges
from navi_trio.core.checkpoints._objects import ObjectStore
from navi_trio.core.checkpoints._state import Folder, Item

Op = list[Any]


@attrs.frozen
class Only:
    """A selective restore of one root: who changed what since the checkpoint, and
    whether a conflict is restored (else kept as it is)."""

    marks: Marks
    restore_conflicts: bool = False


@attrs.frozen
class Entry:
    kind: str
    mode: int
    ref: str
    size: int


def changed_parts(
    objects: ObjectStore,
    digest: str,
    root_mode: int,
    current: Callable[[str], Folder | None],
) -> tuple[dict[str, Item], set[str], dict[str, Entry]]:
    """(current entries, current sealed folders, target entries), by relative path,
    of the folders whose listings differ: a folder whose digest is the checkpoint's
    holds the same entries all the way down, so nothing below it is read or compared
    (a restore of one file in 10,000 looks at the folders above that file only).
    ``current(rel)`` is the scan's folder, None where there is none."""
    target: dict[str, Entry] = {"": Entry("d", root_mode, digest, 0)}
    now: dict[str, Item] = {}
    sealed: set[str] = set()
    stack: list[tuple[str, str | None]] = [("", digest)]
    while stack:
        rel, tree = stack.pop()
        folder = current(rel)
        if folder is not None and tree is not None and folder.tree == tree:
            continue  # the same all the way down
        rows = objects.tree(tree) if tree else []
        for row in rows:
            target[join(rel, row.name)] = Entry(row.kind, row.mode, row.ref, row.size)
        below: dict[str, str | None] = {row.name: row.ref for row in rows if row.kind == "d"}
        if folder is not None:
            if folder.sealed:
                sealed.add(rel)
            for name, item in folder.items.items():
                now[join(rel, name)] = item
                if item.kind == "d":
                    below.setdefault(name, None)
        for name, ref in below.items():
            stack.append((join(rel, name), ref))
    return now, sealed, target


def _target_ignored(objects: ObjectStore, target: dict[str, Entry]) -> Callable[[str, bool], bool]:
    """Whether the checkpoint's `.gitignore` files ignored `rel` (or a folder above it)."""
    texts: dict[str, str] = {}
    for rel, entry in target.items():
        if entry.kind == "f" and (rel == ".gitignore" or rel.endswith("/.gitignore")):
            raw = objects.read(entry.ref)[:GITIGNORE_MAX_BYTES]
            texts[parent_of(rel)[0]] = raw.decode("utf-8", "surrogateescape")
    if not texts:
        return lambda rel, is_dir: False
    ignorers: dict[str, Ignorer] = {"": Ignorer().below(_rules("", texts))}
    decided: dict[str, bool] = {"": False}  # folder -> ignored (itself or above)

    def settle(folder: str) -> None:
        """Fill `ignorers` and `decided` for `folder` and the folders above it."""
        chain = []
        while folder not in decided:
            chain.append(folder)
            folder = parent_of(folder)[0]
        for rel in reversed(chain):
            up = parent_of(rel)[0]
            decided[rel] = decided[up] or ignorers[up].ignored(rel, True)
            ignorers[rel] = ignorers[up].below(_rules(rel, texts))

    def ignored(rel: str, is_dir: bool) -> bool:
        folder = parent_of(rel)[0]
        settle(folder)
        return decided[folder] or ignorers[folder].ignored(rel, is_dir)

    return ignored


def _rules(folder: str, texts: dict[str, str]) -> Rules | None:
    text = texts.get(folder)
    return Rules.parse(folder, text) if text is not None else None


class _Summary:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.counts = dict.fromkeys(
            ("restored", "created", "deleted", "modes", "dirs_created", "dirs_deleted", "bytes"), 0
        )
        self.changes: list[Change] = []
        self.kept: list[Kept] = []
        self.kept_count = 0
        self.conflicts: list[str] = []
        self.conflicts_count = 0
        self.others: list[str] = []
        self.others_count = 0

    def add(self, what: str, rel: str) -> None:
        key = {"mode": "modes", "dir_created": "dirs_created", "dir_deleted": "dirs_deleted"}
        self.counts[key.get(what, what)] += 1
        if len(self.changes) < PATHS_LISTED:
            self.changes.append(Change(rel, what))

    def keep(self, rel: str, why: str) -> None:
        self.kept_count += 1
        if len(self.kept) < PATHS_LISTED:
            self.kept.append(Kept(rel, why))

    def conflict(self, rel: str) -> None:
        self.conflicts_count += 1
        if len(self.conflicts) < PATHS_LISTED:
            self.conflicts.append(rel or ".")

    def other(self, rel: str) -> None:
        self.others_count += 1
        if len(self.others) < PATHS_LISTED:
            self.others.append(rel or ".")

    def done(self) -> RootChanges:
        return RootChanges(
            self.root,
            **self.counts,
            changes=tuple(self.changes),
            kept=tuple(self.kept),
            kept_count=self.kept_count,
            conflicts=tuple(self.conflicts),
            conflicts_count=self.conflicts_count,
            others=tuple(self.others),
            others_count=self.others_count,
        )


def plan_root(
    root: Path,
    current: dict[str, Item],
    current_mode: int,
    sealed: set[str],
    target: dict[str, Entry],
    objects: ObjectStore,
    unseen: Callable[[str], bool],
    only: Only | None = None,
    refused: Callable[[list[Op]], list[str]] | None = None,
) -> tuple[list[Op], RootChanges]:
    """The operations restoring `target` over `current` (see the module docstring).

    `unseen(rel)`: whether something the scan did not list (left out by a rule now)
    exists at `rel`; asked only in folders where the scan left something out. `only`:
    a selective restore (None: the whole tree). `refused(ops)`: the paths the tool user
    may not change, which the summary names as kept (the restore refuses them).
    """
    ignored = _target_ignored(objects, target)
    summary = _Summary(root)
    blocked: set[str] = set()
    pinned: set[str] = set()  # folders that must stay (something in them is kept)
    rm: list[Op] = []
    mkdir: list[Op] = []
    put: list[Op] = []
    chmod: list[Op] = []
    dirmode: dict[str, int] = {}
    candidates: dict[str, Entry | None] = {}  # folders to remove (and what replaces them)

    def under_blocked(rel: str) -> bool:
        while rel:
            rel = parent_of(rel)[0]
            if rel in blocked:
                return True
        return False

    def block(rel: str) -> None:
        blocked.add(rel)
        pinned.add(parent_of(rel)[0])

    def leave(rel: str, now: Item | None) -> bool:
        """Whether the change at `rel` stays (selective: not only navi's)."""
        if only is None:
            return False
        flags = only.marks.flags(rel, now)
        if flags == NAVI:
            return False
        if flags & NAVI:
            summary.conflict(rel)
            return not only.restore_conflicts
        summary.other(rel)
        return True

    def create(rel: str, t: Entry, what: str) -> None:
        if t.kind == "f":
            put.append(["put", rel, t.ref, t.mode])
            summary.counts["bytes"] += t.size
            summary.add(what, rel)
        elif t.kind == "l":
            put.append(["link", rel, t.ref])
            summary.add(what, rel)
        elif t.kind == "d":
            mkdir.append(["mkdir", rel])
            dirmode[rel] = t.mode
            summary.add("dir_created", rel)

    if current_mode != target[""].mode and not leave("", None):
        dirmode[""] = target[""].mode
        summary.add("mode", ".")
    for rel in sorted(set(current) | set(target) - {""}, key=lambda r: (depth(r), r)):
        if under_blocked(rel):
            continue
        c, t = current.get(rel), target.get(rel)
        if c is None:
            assert t is not None
            if t.kind == "x":
                continue
            if parent_of(rel)[0] in sealed and unseen(rel):
                summary.keep(rel, "left out by an ignore rule now, so it has no copy to undo")
                block(rel)
                continue
            if leave(rel, None):
                block(rel)
                continue
            create(rel, t, "created")
        elif t is None:
            if c.kind == "x":
                summary.keep(rel, f"no checkpoint holds a copy of it ({c.ref})")
                block(rel)
            elif ignored(rel, c.kind == "d"):
                block(rel)  # the checkpoint ignored it: it knows nothing of it
            elif leave(rel, c):
                if c.kind == "d":
                    pinned.add(rel)  # it stays; what is in it is judged on its own
                else:
                    block(rel)
            elif c.kind == "d":
                candidates[rel] = None
            else:
                rm.append(["rm", rel])
                summary.add("deleted", rel)
        elif t.kind == "x":
            block(rel)  # the checkpoint has no copy: leave it as it is
        elif c.kind == "x":
            summary.keep(rel, f"no checkpoint holds a copy of it ({c.ref})")
            block(rel)
        elif c.kind == "d" and t.kind == "d":
            if c.mode != t.mode and not leave(rel, c):
                dirmode[rel] = t.mode
                summary.add("mode", rel)
        elif c.kind == t.kind and c.ref == t.ref:
            if c.mode != t.mode and t.kind == "f" and not leave(rel, c):
                chmod.append(["chmod", rel, t.mode])
                summary.add("mode", rel)
        elif leave(rel, c):
            block(rel)
        elif c.kind == "d":
            candidates[rel] = t  # a folder where the checkpoint has a file or link
        elif t.kind == "d":
            rm.append(["rm", rel])
            summary.add("deleted", rel)
            create(rel, t, "restored")
        else:
            create(rel, t, "restored")
    for rel in list(pinned | sealed):
        while rel:
            rel = parent_of(rel)[0]
            if rel in pinned:
                break
            pinned.add(rel)
    rmdir: list[Op] = []
    for rel in sorted(candidates, key=lambda r: (-depth(r), r)):
        replacement = candidates[rel]
        if rel in pinned or rel in sealed:
            pinned.add(parent_of(rel)[0])
            why = "a folder holding files the restore keeps"
            if replacement is not None:
                why += ", where the checkpoint has a file"
            summary.keep(rel, why)
            continue
        rmdir.append(["rmdir", rel])
        summary.add("dir_deleted", rel)
        if replacement is not None:
            create(rel, replacement, "restored")
    touched = {parent_of(op[1])[0] for op in (*rm, *rmdir, *mkdir, *put)}
    removed = {op[1] for op in rmdir}
    unlock: list[Op] = []
    for rel in sorted(touched, key=depth):
        if rel == "":
            now = current_mode
        elif rel in current and current[rel].kind == "d":
            now = current[rel].mode
        else:
            continue  # made by this restore: 0o700 until its mode is set, last
        was = target.get(rel)
        then = was.mode if was is not None and was.kind == "d" else None
        if now & 0o700 != 0o700 or (then is not None and then & 0o700 != 0o700):
            unlock.append(["unlock", rel, now | 0o700])
            if then is not None:
                dirmode.setdefault(rel, then)
            elif rel not in removed:
                dirmode.setdefault(rel, now)  # a folder kept as it was
    ops: list[Op] = [*unlock, *rm, *rmdir]
    ops += sorted(mkdir, key=lambda op: depth(op[1]))
    ops += put + chmod
    ops += [
        ["dirmode", rel, mode]
        for rel, mode in sorted(dirmode.items(), key=lambda kv: -depth(kv[0]))
    ]
    for rel in dict.fromkeys(refused(ops) if refused is not None else []):
        summary.keep(rel or ".", "the tool user may not change it (permission denied)")
    return ops, summary.done()
