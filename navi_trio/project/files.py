"""Reading the files a project keeps for agents: where they are looked for, and how.

`folder_chain` says which folders count for a cwd: the cwd and each folder above it up
to the repository root (the nearest folder holding a ``.git`` folder or file), or up to
the home folder when there is no repository; with neither above it, the cwd alone.

`Reader` opens them only through held roots (tools/_beneath.py: component by component,
``O_NOFOLLOW``, a symlink followed only to a target inside a root, navi's own data
refused), and keeps what it read by real path with the file's stamp (device, inode,
size, mtime): an unchanged file is opened and looked at, never read again.
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path

import attrs

from navi_trio.errors import RootChangedError
from navi_trio.tools._beneath import (
    Beneath,
    OutsideError,
    PrivateError,
    SpecialFileError,
    TooManyLinksError,
)

CHAIN_MAX = 64  # folders between a cwd and its repository root that are looked at
CACHE_MAX = 256  # files whose text is kept between turns (each at most 64 KiB + 1)

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
    """The folders from the repository root (or `home`) down to the real `cwd`.

    Only which folders count is decided here, by path; nothing is read through it.
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
    """Reads small text files beneath held roots, keeping what it read by stamp.

    `reads` counts the files actually read (not served from what was kept).
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
        if len(self._kept) >= CACHE_MAX:
            self._kept.clear()
        self._kept[path] = (stamp, data)
        return data, st.st_size


def holds(fs: Beneath, path: Path) -> bool:
    """Whether one of the walk's roots holds `path`."""
    return fs.locate(path) is not None


def utf8_prefix(data: bytes, size: int) -> str:
    """The text of the first `size` bytes of `data`; a character the cut splits is
    left out, a byte that is not UTF-8 becomes U+FFFD."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data[:size])
