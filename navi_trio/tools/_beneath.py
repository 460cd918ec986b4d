"""Files beneath the roots, opened by directory fd one component at a time.

Why: checking a path's realpath and then opening it by name again races with anyone who
can rename inside the roots (a folder swapped for a symlink to /outside by
``renameat2(RENAME_EXCHANGE)`` between the check and the open). Here nothing is opened
by a whole name: the roots are folders held open since they were checked, each
component is opened relative to its parent's fd with ``O_NOFOLLOW``, and every check is
made on what was opened, so what was checked is what is used.

- **Symlinks** are never followed by the kernel: a symlink's target is read, joined to
  the real path of its folder, and walked again from the root it falls in, at most
  `MAX_HOPS` times per call. A target outside every root: `OutsideError`.
- **navi's own data**: everything reached is checked by identity (``st_dev, st_ino``: a
  rename or a hard link cannot hide it), by (parent's identity, name) and by real path
  (for a hidden path that does not exist yet, such as a database journal). The caller's
  own session folder stays usable. Opening, creating, listing or deleting anything
  private is `PrivateError`.
- **Whose rights**: the daemon's, and when it runs as root, also those of the user its
  tool processes run as: checked on what was opened (mode and owner, sticky bit) before
  anything is made, cut or written (``EACCES``). So a root daemon's tool reads and
  writes what a command of the same run could, no more.
- **Why not openat2(RESOLVE_BENEATH)**: it resolves the middle components out of sight,
  and the identity check of navi's data needs each of them.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Generator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO, cast

import attrs

from navi_trio.tools.private import PrivatePaths, within
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs, inherit, may_remove
from navi_trio.tools.runas import denied as _denied
from navi_trio.tools.runas import may as _may

MAX_HOPS = 40  # symlinks followed in one call (Linux's own limit is 40)

_O_PATH: int | None = getattr(os, "O_PATH", None)  # Linux: enough to walk through, stat
_R, _W, _X = os.R_OK, os.W_OK, os.X_OK  # permission bits, as access(2) names them
# One component, whatever it is (a folder, a symlink itself, a file), where O_PATH exists.
_ENTRY = None if _O_PATH is None else _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = (_O_PATH or os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LISTABLE = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO must not hang the worker thread (cleared on regular files).
_FILE = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
_NEW_FOLDER_MODE = 0o777  # the kernel applies the umask
_NEW_FILE_MODE = 0o666
# An entry that turned from a symlink into something else between two system calls (a
# swap) is looked at again this many times before its error stands.
_RETRIES = 3

Ident = tuple[int, int]
# What `Beneath.walk` yields for each folder: its path relative to the top, its fd, its
# sub-folders, its other entries.
Listed = tuple[Path, int, list[os.DirEntry[str]], list[os.DirEntry[str]]]


class OutsideError(Exception):
    """A symlink leads outside every root; `target` is where it points."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


class PrivateError(Exception):
    """The path is navi's own data."""


class TooManyLinksError(Exception):
    """More than `MAX_HOPS` symlinks in one call."""


class SpecialFileError(Exception):
    """Not a regular file: a pipe, a socket or a device."""


class NotAFolderError(NotADirectoryError):
    """The last component is a file where a folder was asked for."""


def _ident(st: os.stat_result) -> Ident:
    return (st.st_dev, st.st_ino)


def _ident_of(path: Path) -> Ident | None:
    try:
        return _ident(os.stat(path))
    except OSError:
        return None


def _is_folder(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_entry(dir_fd: int, name: str, flags: int) -> tuple[int, bool]:
    """The file `name` in `dir_fd` opened with `flags`, and whether this call made it
    (``O_CREAT`` tries ``O_EXCL`` first: what existed keeps its owner)."""
    if flags & os.O_CREAT:
        try:
            return os.open(name, flags | os.O_EXCL | _FILE, _NEW_FILE_MODE, dir_fd=dir_fd), True
        except FileExistsError:
            pass  # a file, or a symlink (O_EXCL never follows one): opened as it is
    return os.open(name, (flags & ~os.O_CREAT) | _FILE, dir_fd=dir_fd), False


def _readlink(dir_fd: int, name: str) -> str | None:
    """The text of the symlink `name` in `dir_fd`, or None when it is not one."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return None


@attrs.frozen
class Spot:
    """A folder the walk stands in: its fd, the real path it was reached by, its
    identity, and whether it is navi's own data."""

    fd: int
    path: Path
    ident: Ident
    private: bool


@attrs.frozen
class _Marks:
    """navi's own data, as identities (race-proof) and as real paths (for what does not
    exist yet)."""

    paths: PrivatePaths
    hidden: frozenset[Ident]
    hidden_names: frozenset[tuple[Ident, str]]
    allowed: frozenset[Ident]

    @classmethod
    def of(cls, paths: PrivatePaths) -> _Marks:
        hidden: set[Ident] = set()
        names: set[tuple[Ident, str]] = set()
        for path in paths.hidden:
            if (ident := _ident_of(path)) is not None:
                hidden.add(ident)
            if (parent := _ident_of(path.parent)) is not None:
                names.add((parent, path.name))
        allowed = {i for a in paths.allowed if (i := _ident_of(a)) is not None}
        return cls(paths, frozenset(hidden), frozenset(names), frozenset(allowed))

    def private(self, parent: Spot | None, name: str, ident: Ident | None, path: Path) -> bool:
        """Whether the entry `name` of `parent` (identity `ident` when it exists, real
        path `path`) is navi's own data. The nearest marked folder wins: the own
        session folder inside the data folder is not private."""
        if ident is not None and ident in self.allowed:
            return False
        if ident is not None and ident in self.hidden:
            return True
        if parent is not None and (parent.ident, name) in self.hidden_names:
            return True
        if self.paths.blocks(path) is not None:
            return True
        return parent.private if parent is not None else False


class Beneath:
    """One call's view of the held roots; the fds it opens for walking live until `stack`
    closes. Paths given to it are absolute and normalised; the caller checks the path it
    was given, this class every symlink's target and everything it opens.
    """

    def __init__(
        self,
        roots: Sequence[Root],
        private: PrivatePaths,
        stack: ExitStack,
        who: RunAs | None = None,
    ) -> None:
        self._held = list(roots)
        self._who = who  # whose rights count besides the daemon's (None: the daemon's)
        self._roots = [(Path(os.path.normpath(r.given.absolute())), r.path) for r in roots]
        self._marks = _Marks.of(private)
        self._stack = stack
        self._opened: dict[int, Spot] = {}
        self._hops = 0

    def locate(self, path: Path) -> tuple[int, tuple[str, ...]] | None:
        """(root index, components below it) for the innermost root holding `path`."""
        best: tuple[int, tuple[str, ...]] | None = None
        for index, bases in enumerate(self._roots):
            for base in bases:
                if within(path, base):
                    parts = path.relative_to(base).parts
                    if best is None or len(parts) < len(best[1]):
                        best = (index, parts)
        return best

    def folder(self, path: Path, *, create: bool = False) -> Spot:
        """The folder at `path` (created with its parents when `create`)."""
        while True:
            spot, name = self._walk(path, create=create)
            if name is None:
                final = spot
            else:
                if self._marks.private(spot, name, None, spot.path / name):
                    raise PrivateError()  # before anything is made, or said about it
                try:
                    step = self._step(spot, name, create=create)
                except NotADirectoryError as exc:  # a file where the folder should be
                    raise NotAFolderError(exc.errno, exc.strerror) from None
                if isinstance(step, str):
                    path = self._follow(spot, step, ())
                    continue
                final = step
            if final.private:
                raise PrivateError()
            return final

    def open_file(
        self, path: Path, flags: int, *, create_parents: bool = False, truncate: bool = False
    ) -> tuple[BinaryIO, os.stat_result]:
        """The regular file at `path` opened with `flags`, as a binary file object, and its
        stat. `truncate` empties it after the checks (``O_TRUNC`` would cut a file before
        anyone could see what it is).
        """
        swapped = 0
        while True:
            spot, name = self._walk(path, create=create_parents)
            if name is None:
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
            real = spot.path / name
            if self._marks.private(spot, name, None, real):  # before anything is made
                raise PrivateError()
            if not spot.private:  # as in `_step`
                self._need(spot.fd, _X)
            may_make = not flags & os.O_CREAT or self._may(spot.fd, _W | _X)
            try:
                fd, made = _open_entry(spot.fd, name, flags if may_make else flags & ~os.O_CREAT)
            except FileNotFoundError:
                if not may_make:
                    raise _denied() from None
                swapped += 1
                if flags & os.O_CREAT and swapped < _RETRIES:
                    continue  # there a moment ago, gone now: make it
                raise
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # O_NONBLOCK write to a pipe nobody reads
                    raise SpecialFileError() from None
                if exc.errno != errno.ELOOP:
                    raise
                link = _readlink(spot.fd, name)
                if link is None:
                    swapped += 1
                    if swapped < _RETRIES:
                        continue  # no symlink any more: swapped meanwhile, open it again
                    raise
                path = self._follow(spot, link, ())
                continue
            try:
                st = os.fstat(fd)
                if self._marks.private(spot, name, _ident(st), real):
                    raise PrivateError()
                if stat.S_ISDIR(st.st_mode):
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
                if not stat.S_ISREG(st.st_mode):
                    raise SpecialFileError()
                access = flags & os.O_ACCMODE
                want = _R if access == os.O_RDONLY else _W if access == os.O_WRONLY else _R | _W
                if not made and self._who is not None and not _may(st, want, self._who):
                    raise _denied()  # before it is cut or written
                os.set_blocking(fd, True)
                if made:
                    inherit(fd, spot.fd)
                if truncate:
                    os.ftruncate(fd, 0)
                mode = "r+b" if flags & os.O_ACCMODE == os.O_RDWR else "rb"
                if flags & os.O_ACCMODE == os.O_WRONLY:
                    mode = "ab" if flags & os.O_APPEND else "wb"
                return cast(BinaryIO, os.fdopen(fd, mode)), st
            except BaseException:
                os.close(fd)
                raise

    def unlink(self, path: Path) -> None:
        """Delete the file at `path` (through an in-root symlink: its target)."""
        while True:
            spot, name = self._walk(path, create=False)
            if name is None:
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
            if self._marks.private(spot, name, None, spot.path / name):
                raise PrivateError()
            st = os.stat(name, dir_fd=spot.fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                link = _readlink(spot.fd, name)
                if link is not None:
                    path = self._follow(spot, link, ())
                    continue
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
            if self._marks.private(spot, name, _ident(st), spot.path / name):
                raise PrivateError()
            self._need_to_remove(spot.fd, st)
            # By name in a folder we hold: a swap now can only put another entry of
            # this (non-private) folder there, and unlinking a name never touches
            # another link of the same file.
            os.unlink(name, dir_fd=spot.fd)
            return

    def walk(self, top: Spot, *, recursive: bool) -> Generator[Listed, None, None]:
        """(folder relative to `top`, its fd, its sub-folders, its other entries), sorted,
        top-down and depth first as `os.walk`; symlinks are listed but never entered,
        navi's own data is left out. Close the iterator (`contextlib.closing`) when
        stopping early: it closes the fds it opened."""
        self._need(top.fd, _R | _X)
        fd = os.open(".", _LISTABLE, dir_fd=top.fd)
        try:
            yield from self._walk_from(attrs.evolve(top, fd=fd), Path(), recursive)
        finally:
            os.close(fd)

    def _walk(self, path: Path, *, create: bool) -> tuple[Spot, str | None]:
        """The folder holding `path`'s last component and that name (None: `path` is
        a root), following in-root symlinks; missing folders are made when `create`."""
        while True:
            where = self.locate(path)
            if where is None:
                raise OutsideError(str(path))
            index, parts = where
            spot = self._root(index)
            for k, name in enumerate(parts[:-1]):
                step = self._step(spot, name, create=create)
                if isinstance(step, str):
                    path = self._follow(spot, step, parts[k + 1 :])
                    break
                spot = step
            else:
                return spot, (parts[-1] if parts else None)

    def _root(self, index: int) -> Spot:
        """Root `index`: its held fd, verified once per call (`RootChangedError` when
        it is no longer the folder that was checked)."""
        if index in self._opened:
            return self._opened[index]
        root = self._held[index].verify()
        spot = Spot(
            root.fd, root.path, root.ident, self._marks.private(None, "", root.ident, root.path)
        )
        self._opened[index] = spot
        return spot

    def _step(self, spot: Spot, name: str, *, create: bool) -> Spot | str:
        """The sub-folder `name` of `spot` (made when missing and `create`), or the
        text of the symlink found there."""
        if not spot.private:  # navi's own data is refused as such, never as a right
            self._need(spot.fd, _X)
        try:
            opened = self._open_folder(spot, name)
        except FileNotFoundError:
            if not create:
                raise
            if self._marks.private(spot, name, None, spot.path / name):
                raise PrivateError() from None
            self._need(spot.fd, _W | _X)
            made = True
            try:
                os.mkdir(name, _NEW_FOLDER_MODE, dir_fd=spot.fd)
            except FileExistsError:
                made = False  # made meanwhile: open what is there now
            opened = self._open_folder(spot, name)
            if made and isinstance(opened, int):
                inherit(opened, spot.fd)
        if isinstance(opened, str):
            return opened
        self._stack.callback(os.close, opened)
        return self._spot(spot, name, opened)

    @staticmethod
    def _open_folder(spot: Spot, name: str) -> int | str:
        """An fd of the folder `name` in `spot`, or the text of the symlink there."""
        if _ENTRY is not None:
            # The entry itself, whatever it is, in one call; then everything is asked
            # of that fd, so a swap after the open changes nothing.
            fd = os.open(name, _ENTRY, dir_fd=spot.fd)
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                return fd
            try:
                if stat.S_ISLNK(mode):
                    return os.readlink("", dir_fd=fd)  # readlinkat(fd, ""): this link
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
            finally:
                os.close(fd)
        for attempt in range(_RETRIES):  # without O_PATH: open, then look again
            try:
                return os.open(name, _DIR, dir_fd=spot.fd)
            except OSError as exc:
                # O_NOFOLLOW on a symlink: ELOOP, or ENOTDIR together with O_DIRECTORY.
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                if (link := _readlink(spot.fd, name)) is not None:
                    return link
                if attempt + 1 == _RETRIES or not _is_folder(spot.fd, name):
                    raise
                # A folder again: it was swapped between the open and the readlink.
        raise AssertionError("unreachable")

    def _spot(self, parent: Spot, name: str, fd: int) -> Spot:
        ident = _ident(os.fstat(fd))
        path = parent.path / name
        return Spot(fd, path, ident, self._marks.private(parent, name, ident, path))

    def _follow(self, spot: Spot, link: str, rest: Sequence[str]) -> Path:
        """The path to walk next for the symlink `link` found in `spot`, then `rest`."""
        self._hops += 1
        if self._hops > MAX_HOPS:
            raise TooManyLinksError()
        target = Path(os.path.normpath(os.path.join(spot.path, link)))
        if self.locate(target) is None:
            raise OutsideError(str(target))
        return target.joinpath(*rest)

    def _walk_from(self, spot: Spot, rel: Path, recursive: bool) -> Generator[Listed, None, None]:
        with os.scandir(spot.fd) as it:
            entries = sorted((e for e in it if not self._hides(spot, e)), key=lambda e: e.name)
        folders = [e for e in entries if e.is_dir(follow_symlinks=False)]
        others = [e for e in entries if not e.is_dir(follow_symlinks=False)]
        yield rel, spot.fd, folders, others
        if not recursive:
            return
        for entry in folders:
            try:
                fd = os.open(entry.name, _LISTABLE, dir_fd=spot.fd)
            except OSError:
                continue  # gone, swapped for a symlink, or unreadable: skipped, as os.walk
            try:
                child = self._spot(spot, entry.name, fd)
                if not child.private and self._may(fd, _R | _X):
                    yield from self._walk_from(child, rel / entry.name, recursive)
            finally:
                os.close(fd)

    def _may(self, fd: int, want: int) -> bool:
        """Whether the tool user (if any) has the `want` bits on what `fd` is."""
        return self._who is None or _may(os.fstat(fd), want, self._who)

    def _need(self, fd: int, want: int) -> None:
        if not self._may(fd, want):
            raise _denied()

    def _need_to_remove(self, folder_fd: int, st: os.stat_result) -> None:
        """The tool user may remove the entry `st` from the folder `folder_fd`: write and
        search there, and with the sticky bit own the entry or the folder."""
        if self._who is not None and not may_remove(os.fstat(folder_fd), st, self._who):
            raise _denied()

    def _hides(self, spot: Spot, entry: os.DirEntry[str]) -> bool:
        try:
            ident = _ident(entry.stat(follow_symlinks=False))
        except OSError:
            return True  # gone meanwhile
        return self._marks.private(spot, entry.name, ident, spot.path / entry.name)
