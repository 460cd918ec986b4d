"""Folders checked once, then held open: the roots a run works from.

Resolving a folder by its path at every use races with anyone who can rename inside it
(a run's cwd swapped for a link to ``/root`` after its check). So a run's session
folder and cwd are opened once, from ``/``, one component at a time with ``O_PATH |
O_DIRECTORY | O_NOFOLLOW``, and used only through the fd from then on. `Root.verify`
runs before each use: a folder moved, replaced or deleted since is a
`RootChangedError` for that use only. Whoever opens roots closes them; a tool call or a
background job works on copies (`RunRoots.dup`).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from types import TracebackType

import attrs

from navi_trio.errors import RootChangedError

# O_PATH: enough to walk from, to bind and to fstat; it reads nothing of the folder.
_WALK = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FOLDER_MODE = 0o777  # a folder made on the way: the umask applies (`session_folder` closes)
CLOSED = 0o700

SESSION = "the session folder"
CWD = "the working folder (cwd)"


def fd_path(fd: int) -> str:
    """Where the kernel says the open `fd` is now (with `` (deleted)`` when it is gone)."""
    return os.readlink(f"/proc/self/fd/{fd}")


def _refusal(label: str, path: Path, why: str) -> RootChangedError:
    return RootChangedError(f"{label} {path} cannot be used: {why}; nothing was done there")


def _step(fd: int, name: str, here: Path, label: str, path: Path, create: bool) -> int:
    """The folder `name` in `fd` (made when missing and `create`), opened O_NOFOLLOW."""
    try:
        return os.open(name, _WALK, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise _refusal(label, path, f"{here} does not exist (deleted or moved?)") from None
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise _refusal(label, path, f"{here}: {exc.strerror}") from None
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        why = "is a symlink now (never followed)" if link else "is not a folder"
        raise _refusal(label, path, f"{here} {why}") from None
    try:
        os.mkdir(name, _FOLDER_MODE, dir_fd=fd)
    except FileExistsError:
        pass  # made meanwhile: open what is there now (a symlink is refused above)
    except OSError as exc:
        raise _refusal(label, path, f"{here} cannot be made: {exc.strerror}") from None
    return _step(fd, name, here, label, path, create=False)


class Root:
    """One folder held open: its fd (O_PATH), the real path it was checked at, its
    identity. `label` names it in errors ("the working folder (cwd)"); `given` is the
    path the caller knows it by, when that differs from the real one."""

    def __init__(self, fd: int, path: Path, label: str, given: Path | None = None) -> None:
        self._fd: int | None = fd
        self.path = path
        self.label = label
        self.given = given if given is not None else path
        st = os.fstat(fd)
        self.ident = (st.st_dev, st.st_ino)
        self.owner = (st.st_uid, st.st_gid)

    @classmethod
    def open(
        cls, path: Path, label: str, *, create: bool = False, given: Path | None = None
    ) -> Root:
        """The folder at `path` (absolute, normalised, symlink-free: a real path),
        walked from ``/`` without following any symlink, then verified; `create` makes
        what is missing. Blocking. `RootChangedError` when it cannot be held."""
        if not path.is_absolute() or os.path.normpath(path) != str(path):
            raise _refusal(label, path, "not an absolute, normalised path")
        fd = os.open("/", _WALK)
        here = Path("/")
        try:
            for name in path.parts[1:]:
                here = here / name
                step = _step(fd, name, here, label, path, create)
                os.close(fd)
                fd = step
            root = cls(fd, path, label, given)
        except BaseException:
            os.close(fd)
            raise
        try:
            return root.verify()
        except BaseException:
            root.close()
            raise

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.label} {self.path} is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd is None

    def verify(self) -> Root:
        """This root, when it is still the folder at the path it was checked at; else
        `RootChangedError` naming it. Blocking (two system calls)."""
        try:
            now = fd_path(self.fd)
        except OSError as exc:  # no /proc: nothing can say where the folder is
            raise _refusal(self.label, self.path, f"/proc/self/fd: {exc.strerror}") from None
        if os.fstat(self.fd).st_nlink == 0:  # (the path then ends in " (deleted)")
            raise RootChangedError(
                f"{self.label} {self.path} was deleted after it was checked; nothing was done there"
            )
        if now != str(self.path):
            raise RootChangedError(
                f"{self.label} {self.path} is not the folder that was checked any more: that "
                f"folder is now {now} (moved or replaced since); nothing was done there"
            )
        return self

    def give(self, owner: tuple[int, int] | None) -> Root:
        """This folder given to `owner` (uid, gid) when it is not theirs yet; None:
        left as it is."""
        if owner is not None and self.owner != owner:
            os.chown(f"/proc/self/fd/{self.fd}", *owner)
            self.owner = owner
        return self

    def dup(self) -> Root:
        """A copy with its own fd (closed on its own)."""
        return Root(os.dup(self.fd), self.path, self.label, self.given)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> Root:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Root({self.path}, fd={self._fd})"


@attrs.frozen
class RunRoots:
    """One run's roots: its session folder and its cwd (None: the run has none), or
    why they could not be held (`error`: every use fails with it, naming the folder)."""

    session: Root | None
    cwd: Root | None = None
    error: str | None = None

    @classmethod
    def open(
        cls, session_dir: Path, cwd: Path | None, owner: tuple[int, int] | None = None
    ) -> RunRoots:
        """The roots at these paths, opened now, for a tool driven without a run (a run holds
        its roots from its start); the session folder made if need be and given to `owner`.
        """
        try:
            session = session_folder(_real(session_dir), owner, given=session_dir)
        except RootChangedError as exc:
            return cls(None, None, str(exc))
        try:
            held = None if cwd is None else Root.open(_real(cwd), CWD, given=cwd)
        except RootChangedError as exc:
            session.close()
            return cls(None, None, str(exc))
        except BaseException:
            session.close()
            raise
        return cls(session, held)

    def all(self) -> tuple[Root, ...]:
        """Every root, verified (`RootChangedError`: one is not usable now)."""
        if self.error is not None or self.session is None:
            raise RootChangedError(self.error or f"{SESSION} is not held")
        roots = (self.session,) if self.cwd is None else (self.session, self.cwd)
        for root in roots:
            root.verify()
        return roots

    def start(self) -> Root:
        """Where commands start and relative paths resolve: the cwd, else the session
        folder (verified)."""
        return self.all()[-1]

    def dup(self) -> RunRoots:
        if self.session is None:
            return RunRoots(None, None, self.error)
        session = self.session.dup()
        try:
            cwd = None if self.cwd is None else self.cwd.dup()
        except BaseException:
            session.close()
            raise
        return RunRoots(session, cwd, self.error)

    def close(self) -> None:
        for root in (self.session, self.cwd):
            if root is not None:
                root.close()


def session_folder(path: Path, owner: tuple[int, int] | None, *, given: Path | None = None) -> Root:
    """A run's session folder at the real `path`, made if need be, held, and given to
    `owner` (whom the run's commands run as when the daemon is root). It and its parent
    are 0700 whatever the umask, so no process of one user may reach another's by its
    path. `RootChangedError` when it cannot be held."""
    with Root.open(path.parent, "the folder of the session folders", create=True) as top:
        _close(top)
    root = Root.open(path, SESSION, create=True, given=given)
    try:
        _close(root)
        return root.give(owner)
    except OSError as exc:
        root.close()
        why = f"it cannot be made its user's alone: {exc.strerror}"
        raise _refusal(SESSION, path, why) from None
    except BaseException:
        root.close()
        raise


def _close(root: Root) -> None:
    """`root` made 0700 when it is not (its owner's alone)."""
    if stat.S_IMODE(os.fstat(root.fd).st_mode) != CLOSED:
        os.chmod(f"/proc/self/fd/{root.fd}", CLOSED)


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path.expanduser()))
