"""Folders opened by fd, one component at a time, never through a symlink.

A snapshot may run while a background job writes in the roots, and a tool could swap a
folder for a symlink to ``/`` between two system calls (issue 17). So nothing here is
reached by a whole path: a root is opened as `tools._beneath.Beneath` opens it (from
``/``, each component with ``O_NOFOLLOW``), and everything below from its parent's fd
with ``O_NOFOLLOW``. A symlink where a folder was is an error for that path, never a
way out of the root.
"""

from __future__ import annotations

import os
import stat
from contextlib import ExitStack
from pathlib import Path

from navi_trio.tools._beneath import Beneath, OutsideError, PrivateError
from navi_trio.tools.private import PrivatePaths

DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in for a file must not hang the worker thread.
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_O_PATH: int | None = getattr(os, "O_PATH", None)


class RootUnusableError(Exception):
    """A root cannot be opened: missing, a symlink now, navi's own data, unreadable."""


def open_root(root: Path, private: PrivatePaths, *, create: bool = False) -> int:
    """A listable fd of the folder `root` (a real path), opened without following any
    symlink; `create` makes it (and its parents) when missing."""
    base = root
    while create and base.parent != base and not os.path.lexists(base):
        base = base.parent  # Beneath makes folders below a root, not the root itself
    try:
        with ExitStack() as stack:
            spot = Beneath([base], private, stack).folder(root, create=create)
            return os.open(".", DIR, dir_fd=spot.fd)
    except (OutsideError, PrivateError) as exc:
        raise RootUnusableError(f"{root} is not a folder a checkpoint may use") from exc
    except OSError as exc:
        raise RootUnusableError(f"{root} cannot be opened: {exc.strerror}") from exc


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def parent_of(rel: str) -> tuple[str, str]:
    """(folder, name) of the relative path `rel`."""
    folder, _, name = rel.rpartition("/")
    return folder, name


def depth(rel: str) -> int:
    return rel.count("/") + 1 if rel else 0


class Folders:
    """Fds of the folders below one root fd, opened on demand and kept until `close`."""

    def __init__(self, root_fd: int) -> None:
        self._fds: dict[str, int] = {"": root_fd}

    def get(self, rel: str) -> int:
        """The fd of folder `rel` (OSError: gone, not a folder, a symlink now)."""
        fd = self._fds.get(rel)
        if fd is not None:
            return fd
        parent, name = parent_of(rel)
        fd = os.open(name, DIR, dir_fd=self.get(parent))
        self._fds[rel] = fd
        return fd

    def forget(self, rel: str) -> None:
        """Close `rel` and every folder below it (it was removed or replaced)."""
        prefix = rel + "/"
        for key in [k for k in self._fds if k == rel or k.startswith(prefix)]:
            if key:
                os.close(self._fds.pop(key))

    def close(self) -> None:
        for key, fd in self._fds.items():
            if key:
                os.close(fd)
        self._fds = {"": self._fds[""]}


def chmod_at(dir_fd: int, name: str, mode: int) -> None:
    """Set the permission bits of the file or folder `name` (never through a symlink:
    Linux has no lchmod, so the entry is opened with O_PATH|O_NOFOLLOW and changed
    through its /proc/self/fd link, which names what was opened)."""
    if _O_PATH is None:
        os.chmod(name, mode, dir_fd=dir_fd, follow_symlinks=False)
        return
    fd = os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            return  # a link has no permission bits of its own
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
