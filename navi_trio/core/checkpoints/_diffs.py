"""What a rewind would put back, file by file, with the content then and now.

A restore's plan (`_plan`) says, per path, what the checkpoint held there: a file's
stored content (``put``), a link (``link``), nothing (``rm`` alone: made since), or
only other permission bits (``chmod``). `changed_paths` reads that off the operations;
`file_then_and_now` reads both sides, bounded: the checkpoint's copy from the store, the
file as it is now through the held root, opened without following a symlink (a link is
shown as its text, never read through).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import attrs

from navi_trio.core.checkpoints._fsops import READ, Folders, RootUnusableError, open_root, parent_of
from navi_trio.core.checkpoints._model import CheckpointDamagedError
from navi_trio.core.checkpoints._objects import ObjectStore
from navi_trio.core.checkpoints._plan import Op
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.roots import Root

ABSENT = ("absent",)


@attrs.frozen
class ChangedFile:
    """One path changed since a checkpoint: `what` is ``modified``, ``created``,
    ``deleted``, ``link`` or ``mode``; `before` / `after` its content then and now
    (None: no file there, or not read: `too_large`, `unreadable` says why)."""

    root: Path
    path: str
    what: str
    before: bytes | None
    after: bytes | None
    too_large: bool = False
    unreadable: str = ""


# What the checkpoint held at a path: ("put", ref) a file's content, ("link", text),
# ("mode",) the same file with other bits, ABSENT nothing.
Then = tuple[str, ...]


def changed_paths(ops: list[Op]) -> dict[str, Then]:
    """Each file or link path a restore's operations touch, with what it puts back."""
    found: dict[str, Then] = {}
    for op in ops:
        kind, rel = op[0], str(op[1])
        if kind == "put":
            found[rel] = ("put", str(op[2]))
        elif kind == "link":
            found[rel] = ("link", str(op[2]))
        elif kind == "rm":
            found.setdefault(rel, ABSENT)
        elif kind == "chmod":
            found.setdefault(rel, ("mode",))
    return dict(sorted(found.items()))


def file_then_and_now(
    objects: ObjectStore,
    root: Path,
    rel: str,
    then: Then,
    held: Root | None,
    private: PrivatePaths,
    limit: int,
) -> ChangedFile:
    """Both sides of one changed path, each read up to `limit` bytes. Blocking."""
    too_large = False
    why = ""
    before: bytes | None = None
    if then[0] == "put":
        before = _stored(objects, then[1], limit)
        too_large = before is None
    elif then[0] == "link":
        before = then[1].encode("utf-8", "surrogateescape")
    try:
        after, kind = _now(root, rel, held, private, limit)
    except OSError as exc:
        after, kind = None, "unreadable"
        why = exc.strerror or str(exc)
    if kind == "large":
        too_large, after = True, None
    if then == ABSENT:
        what = "created"
    elif kind == "absent":
        what = "deleted"
    elif then[0] == "mode":
        what = "mode"
        before = after
    elif then[0] == "link" or kind == "link":
        what = "link"
    else:
        what = "modified"
    return ChangedFile(root, rel, what, before, after, too_large, why)


def _stored(objects: ObjectStore, ref: str, limit: int) -> bytes | None:
    """The stored content `ref` when it is at most `limit` bytes (else None)."""
    try:
        data = objects.read_at_most(ref, limit)
    except CheckpointDamagedError:
        return None
    return data


def _now(
    root: Path, rel: str, held: Root | None, private: PrivatePaths, limit: int
) -> tuple[bytes | None, str]:
    """The path as it is now: (content, "file"), (link text, "link"), (None, "absent"),
    (None, "large")."""
    if held is None:
        return None, "absent"
    try:
        fd = open_root(held, private)
    except RootUnusableError:
        return None, "absent"
    folders = Folders(fd)
    try:
        up, name = parent_of(rel)
        try:
            dir_fd = folders.get(up)
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None, "absent"
        except NotADirectoryError:
            return None, "absent"
        if stat.S_ISLNK(st.st_mode):
            return os.readlink(name, dir_fd=dir_fd).encode("utf-8", "surrogateescape"), "link"
        if not stat.S_ISREG(st.st_mode):
            return None, "absent"
        try:
            file_fd = os.open(name, READ, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a link swapped in since the stat
                return None, "absent"
            raise
        try:
            if os.fstat(file_fd).st_size > limit:
                return None, "large"
            data = os.read(file_fd, limit + 1)
        finally:
            os.close(file_fd)
        return (None, "large") if len(data) > limit else (data, "file")
    finally:
        folders.close()
        os.close(fd)
