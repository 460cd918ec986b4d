"""Reading the files a project keeps for agents: where they are looked for, and how.

`folder_chain`: the cwd and each folder above it up to the repository root (the nearest
holding ``.git``), else up to the home folder, else the cwd alone. `Reader` opens them
only through held roots, at most a cap of bytes each, and keeps what it read by real
path and stamp (device, inode, size, mtime): an unchanged file is never read again.
What is skipped is a problem in words, never an exception.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Sequence
from contextlib import ExitStack, closing
from pathlib import Path

import attrs

from navi_trio.caches import remember
from navi_trio.errors import RootChangedError
from navi_trio.tools._beneath import (
    Beneath,
    OutsideError,
    PrivateError,
    SpecialFileError,
    TooManyLinksError,
)
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs

CHAIN_MAX = 64  # folders between a cwd and its repository root that are looked at
CACHE_MAX = 256  # files whose text is kept between turns (each at most 64 KiB + 1)
MAX_FILES = 64  # *.md files read from one agents' or commands' folder; the rest skipped
MAX_FILE_BYTES = 64 * 1024  # one of them; a bigger one is skipped, saying so

Stamp = tuple[int, int, int, int]  # device, inode, size, mtime_ns


@attrs.frozen
class Skipped:
    """A file that exists but was not used, and why (for the run's notices and doctor)."""

    path: Path
    why: str

    def line(self) -> str:
        return f"{self.path}: {self.why}"


@attrs.frozen
class Chain:
    """The folders that count for one cwd, outermost first; `repo` is the repository
    root among them (None: no repository, the chain ends at the home folder)."""

    folders: tuple[Path, ...]
    repo: Path | None


def folder_chain(cwd: Path, home: Path) -> Chain:
    """The folders from the repository root (or `home`) down to the real `cwd`, by path;
    nothing is read through it.
    """
    seen: list[Path] = []
    here = cwd
    for _ in range(CHAIN_MAX):
        seen.append(here)
        if os.path.lexists(here / ".git"):
            return Chain(tuple(reversed(seen)), here)
        if here == home or here.parent == here:
            break
        here = here.parent
    if here == home:
        return Chain(tuple(reversed(seen)), None)
    return Chain((cwd,), None)


class NotReadable(Exception):
    """A file that is there but may not be read; the message says why."""


class Reader:
    """Reads small text files beneath held roots, keeping what it read by stamp. `reads`
    counts the files actually read (not served from what was kept).
    """

    def __init__(self) -> None:
        self._kept: dict[Path, tuple[Stamp, bytes]] = {}
        self.reads = 0

    def read(self, fs: Beneath, path: Path, cap: int) -> tuple[bytes, int] | None:
        """At most `cap` + 1 bytes of the file at `path` and its size; None when there
        is no such file. `NotReadable` naming the reason when it may not be read."""
        try:
            opened, st = fs.open_file(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except RootChangedError as exc:
            raise NotReadable(f"{exc}; not read") from None
        except OutsideError as exc:
            raise NotReadable(
                f"a symlink to {exc.target}, outside the folders this run may read; not read"
            ) from None
        except PrivateError:
            raise NotReadable("navi's own data; not read") from None
        except TooManyLinksError:
            raise NotReadable("goes through too many symlinks; not read") from None
        except SpecialFileError:
            raise NotReadable("not a regular file; not read") from None
        except IsADirectoryError:
            raise NotReadable("a folder, not a file; not read") from None
        except NotADirectoryError:
            return None
        except PermissionError:
            raise NotReadable("permission denied; not read") from None
        except OSError as exc:
            raise NotReadable(f"{exc.strerror or exc}; not read") from None
        with opened as fh:
            stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            kept = self._kept.get(path)
            if kept is not None and kept[0] == stamp and len(kept[1]) >= min(cap + 1, st.st_size):
                return kept[1][: cap + 1], st.st_size
            data = fh.read(cap + 1)
            self.reads += 1
        remember(self._kept, path, (stamp, data), CACHE_MAX)
        return data, st.st_size


def holds(fs: Beneath, path: Path) -> bool:
    """Whether one of the walk's roots holds `path`."""
    return fs.locate(path) is not None


def utf8_prefix(data: bytes, size: int) -> str:
    """The text of the first `size` bytes of `data`; a character the cut splits is
    left out, a byte that is not UTF-8 becomes U+FFFD."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data[:size])


@attrs.frozen
class MdFile:
    """One file read: where it is (the path its folder was reached by) and its text."""

    path: Path
    text: str


@attrs.frozen
class Found:
    """What a search read: the files, and why others were not read."""

    files: list[MdFile] = attrs.Factory(list)
    problems: list[str] = attrs.Factory(list)


def read_md_folders(
    roots: Sequence[Root],
    folders: Sequence[Path],
    private: PrivatePaths,
    who: RunAs | None = None,
) -> Found:
    """The ``*.md`` files directly in each of `folders` (absolute, beneath `roots`), in
    order, each folder's sorted by name. Blocking: run it in a worker thread."""
    found = Found()
    reader = Reader()
    with ExitStack() as stack:
        fs = Beneath(roots, private, stack, who)
        for folder in folders:
            _read_folder(fs, reader, folder, found)
    return found


def _read_folder(fs: Beneath, reader: Reader, folder: Path, found: Found) -> None:
    try:
        with closing(fs.walk(fs.folder(folder), recursive=False)) as walk:
            _, _, _, entries = next(walk)
    except (FileNotFoundError, NotADirectoryError, StopIteration):
        return  # no such folder: nothing to read, nothing to say
    except (OutsideError, TooManyLinksError):
        found.problems.append(f"{folder}: leads out of the folders this run may read; not read")
        return
    except PrivateError:
        found.problems.append(f"{folder}: lies in navi's own data; not read")
        return
    except OSError as exc:
        found.problems.append(f"{folder}: cannot be read: {exc.strerror or exc}")
        return
    names = sorted(e.name for e in entries if e.name.endswith(".md"))
    if len(names) > MAX_FILES:
        skipped = len(names) - MAX_FILES
        found.problems.append(
            f"{folder}: holds {len(names)} .md files; only the first {MAX_FILES} by name "
            f"are read ({skipped} skipped)"
        )
        names = names[:MAX_FILES]
    for name in names:
        path = folder / name
        try:
            got = reader.read(fs, path, MAX_FILE_BYTES)
        except NotReadable as exc:
            found.problems.append(f"{path}: {exc}")
            continue
        if got is None:
            continue  # gone since the listing
        data, size = got
        if size > MAX_FILE_BYTES or len(data) > MAX_FILE_BYTES:
            found.problems.append(f"{path}: larger than {MAX_FILE_BYTES} bytes; not read")
            continue
        try:
            found.files.append(MdFile(path, data.decode("utf-8")))
        except UnicodeDecodeError:
            found.problems.append(f"{path}: not UTF-8 text; not read")
