"""Folders opened by fd, one component at a time, never through a symlink.

A snapshot may run while a background job writes in the roots, and a tool could swap a
folder for a symlink to ``/`` between two system calls. So nothing here is reached by a
whole path: a root is a folder held open (tools/roots.py: the run's own, held since its
start, or one opened here from ``/``, each component with ``O_NOFOLLOW``), and
everything below it is opened from its parent's fd with ``O_NOFOLLOW``. A symlink where
a folder was is an error for that path, never a way out of the root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from navi_trio.errors import RootChangedError
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs, denied, inherit, may

DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in for a file must not hang the worker thread.
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_O_PATH: int | None = getattr(os, "O_PATH", None)
LABEL = "the folder"
MADE = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RootUnusableError(Exception):
    """A root cannot be opened: missing, a symlink now, navi's own data, unreadable."""


def hold_root(root: Path) -> Root:
    """The folder at the real path `root`, held open (walked without following any
    symlink; `make_root` makes it when missing)."""
    try:
        return Root.open(root, LABEL)
    except RootChangedError as exc:
        raise RootUnusableError(str(exc)) from None


def open_root(root: Path | Root, private: PrivatePaths) -> int:
    """A listable fd of the folder `root`: a held root (verified first), else the folder
    at the real path `root` (`hold_root`). Never navi's own data."""
    held = root if isinstance(root, Root) else hold_root(root)
    try:
        held.verify()
        if private.blocks(held.path) is not None or held.ident in identities(private.hidden):
            raise RootUnusableError(f"{held.path} is not a folder a checkpoint may use")
        return os.open(".", DIR, dir_fd=held.fd)
    except RootChangedError as exc:
        raise RootUnusableError(str(exc)) from None
    except OSError as exc:
        raise RootUnusableError(f"{held.path} cannot be opened: {exc.strerror}") from exc
    finally:
        if held is not root:
            held.close()


def make_root(root: Path, who: RunAs | None) -> None:
    """Make the folder at the real path `root` and the folders above it when missing,
    each walked without following a symlink, only where `who` may make it (when given),
    and with the owner of the folder it is made in (a root daemon: `inherit`)."""
    try:
        hold_root(root).close()
        return
    except RootUnusableError:
        if root.parent == root:
            raise
    make_root(root.parent, who)
    with hold_root(root.parent) as up:
        if who is not None and not may(os.fstat(up.fd), os.W_OK | os.X_OK, who):
            raise denied()
        try:
            make_folder(up.fd, root.name, f".{root.name}.navi-restore-root", 0o777)
        except FileExistsError:
            return  # something else there: open_root says what


def make_folder(folder: int, name: str, tmp: str, mode: int = 0o700) -> None:
    """The folder `name` of the open folder `folder` made whole: under `tmp`, given to
    the owner of `folder` (`inherit`), then renamed to `name`. Killed in between, `name`
    is missing or already theirs: a folder left as the daemon's would shut the tool user
    out of what a replay of the restore puts in it."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISDIR(st.st_mode):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), name)
        return  # there already
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(tmp, dir_fd=folder)  # what a killed attempt left (empty)
    os.mkdir(tmp, mode, dir_fd=folder)
    made = os.open(tmp, MADE, dir_fd=folder)
    try:
        inherit(made, folder)
    finally:
        os.close(made)
    try:
        os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError as exc:
        os.rmdir(tmp, dir_fd=folder)
        # made meanwhile: a folder there is what was asked for
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        if not stat.S_ISDIR(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            raise


def identities(paths: Iterable[Path]) -> frozenset[tuple[int, int]]:
    """(device, inode) of each of `paths` that exists: navi's own data, which a bind
    mount, a hard link or a rename cannot hide."""
    out = set()
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.add((st.st_dev, st.st_ino))
    return frozenset(out)


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def parent_of(rel: str) -> tuple[str, str]:
    """(folder, name) of the relative path `rel`."""
    folder, _, name = rel.rpartition("/")
    return folder, name


def depth(rel: str) -> int:
    return rel.count("/") + 1 if rel else 0


class Folders:
    """Fds of the folders below one root fd, opened on demand and kept until `close`;
    with `who` (the tool user of a root daemon), only through folders that user may
    pass, as their own processes would (PermissionError)."""

    def __init__(self, root_fd: int, who: RunAs | None = None) -> None:
        self._fds: dict[str, int] = {"": root_fd}
        self.who = who
        # Folders `who` may change whole: made by the caller where `who` could make
        # them (they take the owner of their parent: `inherit`), or theirs.
        self.free: set[str] = set()

    def checked(self, rel: str) -> bool:
        """Whether what is done in the folder `rel` is checked against `who`'s rights."""
        return self.who is not None and rel not in self.free

    def get(self, rel: str) -> int:
        """The fd of folder `rel` (OSError: gone, not a folder, a symlink now, or one
        `who` may not pass)."""
        fd = self._fds.get(rel)
        if fd is not None:
            return fd
        parent, name = parent_of(rel)
        up = self.get(parent)
        if self.checked(parent):
            self.need(up, os.X_OK)
        fd = os.open(name, DIR, dir_fd=up)
        self._fds[rel] = fd
        return fd

    def need(self, fd: int, want: int) -> None:
        """PermissionError unless `who` has the `want` bits on what `fd` is open on."""
        if self.who is not None and not may(os.fstat(fd), want, self.who):
            raise denied()

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
