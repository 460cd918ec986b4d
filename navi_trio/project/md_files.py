"""Markdown files with YAML front matter, read from folders beneath a run's held roots.

Agents and commands kept as files (``.claude/agents/*.md``, ``.navi/commands/*.md`` …)
are a repository's words: untrusted input. So they are read as the filesystem tool
reads (tools/_beneath.py): walked from the held root's fd, one component at a time,
never following a symlink out of the roots, never into navi's own data, with the rights
of the run's tool user. Each folder yields at most `MAX_FILES` files of at most
`MAX_FILE_BYTES` each; what is skipped is a problem in words, never an exception.

`split_front_matter` parses the ``---`` block at the top with YAML's safe loader
(imported on first use: it stays out of start-up).
"""

from __future__ import annotations

import errno
import os
import reprlib
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from navi_trio.errors import ConfigError
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

MAX_FILES = 64  # *.md files read from one folder; the rest are named as skipped
MAX_FILE_BYTES = 64 * 1024  # one file; a bigger one is skipped, saying so
FRONT_MATTER_MAX_BYTES = 8 * 1024  # the YAML block at the top of one file

_SHOWN = reprlib.Repr()  # (keywords to Repr() came in Python 3.12)
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 2, 4, 4
_SHOWN.maxstring = _SHOWN.maxother = 80


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
    with ExitStack() as stack:
        fs = Beneath(roots, private, stack, who)
        for folder in folders:
            _read_folder(fs, folder, found)
    return found


def _read_folder(fs: Beneath, folder: Path, found: Found) -> None:
    try:
        spot = fs.folder(folder)
        walk = fs.walk(spot, recursive=False)
        try:
            _, _, _, entries = next(walk)
        finally:
            walk.close()
    except (FileNotFoundError, NotADirectoryError):
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
        text = _read_file(fs, path, found)
        if text is not None:
            found.files.append(MdFile(path, text))


def _read_file(fs: Beneath, path: Path, found: Found) -> str | None:
    try:
        opened, st = fs.open_file(path, os.O_RDONLY)
        with opened as fh:
            if st.st_size > MAX_FILE_BYTES:
                raise OSError(errno.EFBIG, f"larger than {MAX_FILE_BYTES} bytes")
            data = fh.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise OSError(errno.EFBIG, f"larger than {MAX_FILE_BYTES} bytes")
        return data.decode("utf-8")
    except (OutsideError, TooManyLinksError):
        why = "a symlink out of the folders this run may read"
    except PrivateError:
        why = "it lies in navi's own data"
    except SpecialFileError:
        why = "not a regular file"
    except UnicodeDecodeError:
        why = "not UTF-8 text"
    except OSError as exc:
        why = exc.strerror or str(exc)
    found.problems.append(f"{path}: {why}; skipped")
    return None


def split_front_matter(text: str, path: Path, *, required: bool) -> tuple[dict[str, Any], str]:
    """(the front matter's keys, the body) of a file's `text`. A file without a ``---``
    block is ({}, text), or a `ConfigError` when `required`; a block that is not a YAML
    mapping, or too big, is a `ConfigError` naming the file."""
    lines = text.removeprefix("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].rstrip() != "---":
        if required:
            raise ConfigError(f"{path}: no front matter (a --- block of name: value lines)")
        return {}, text
    end = next((i for i, line in enumerate(lines[1:], 1) if line.rstrip() == "---"), None)
    if end is None:
        raise ConfigError(f"{path}: the front matter has no closing --- line")
    block = "".join(lines[1:end])
    if len(block.encode()) > FRONT_MATTER_MAX_BYTES:
        raise ConfigError(f"{path}: the front matter is over {FRONT_MATTER_MAX_BYTES} bytes")
    import yaml  # type: ignore[import-untyped]  # first use only: out of start-up

    try:
        data = yaml.safe_load(block)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = "" if mark is None else f" at line {mark.line + 2}"
        raise ConfigError(f"{path}: the front matter is not valid YAML{where}") from None
    except RecursionError:  # PyYAML composes nested values recursively
        raise ConfigError(f"{path}: the front matter nests too deeply to read") from None
    if data is None:
        data = {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigError(f"{path}: the front matter must be name: value lines (a mapping)")
    return data, "".join(lines[end + 1 :])


def check_keys(data: dict[str, Any], path: Path, allowed: Sequence[str]) -> None:
    """An unknown key is an error naming it and the keys a file may hold."""
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{path}: $.{unknown[0]}: unknown key (a file may hold {', '.join(allowed)})"
        )


def shown(value: Any) -> str:
    """`value` as an error shows it: short, whatever YAML made of it (aliases can nest a
    few lines into billions of items; a plain repr would walk them all)."""
    return _SHOWN.repr(value)


def text_value(data: dict[str, Any], key: str, path: Path, *, max_chars: int) -> str | None:
    """The string under `key` (None when absent), at most `max_chars` long."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{path}: $.{key}: expected a string, got {shown(value)}")
    if len(value) > max_chars:
        raise ConfigError(f"{path}: $.{key}: at most {max_chars} characters, got {len(value)}")
    return value
