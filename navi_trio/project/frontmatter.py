"""The YAML front matter of a project's Markdown files: one reader for skills, agents and
commands.

A first line ``---``, then YAML (at most `FRONT_MATTER_MAX_BYTES`, safe loader, imported
on first use), then ``---``; the rest is the body. The YAML must be a mapping with text
keys, each given once; anything else is a `FrontMatterError` saying what and on which
line. The files are untrusted: `shown` keeps an error's view of a value short.
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from navi_trio.errors import ConfigError

FENCE = "---"
FRONT_MATTER_MAX_BYTES = 8 * 1024  # the YAML block at the top of one file

_SHOWN = reprlib.Repr()  # (keywords to Repr() came in Python 3.12)
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 2, 4, 4
_SHOWN.maxstring = _SHOWN.maxother = 80


class FrontMatterError(ValueError):
    """Front matter navi cannot read; the message says what is wrong, and where."""


def front_matter(text: str) -> tuple[dict[str, Any], str] | None:
    """(the front matter's keys, the body after it), or None when `text` does not start
    with a ``---`` line; `FrontMatterError` when the block cannot be read."""
    lines = text.removeprefix("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].rstrip() != FENCE:
        return None
    end = next((i for i, line in enumerate(lines[1:], 1) if line.rstrip() == FENCE), None)
    if end is None:
        raise FrontMatterError("the front matter has no closing --- line")
    block = "".join(lines[1:end])
    if len(block.encode()) > FRONT_MATTER_MAX_BYTES:
        raise FrontMatterError(f"the front matter is over {FRONT_MATTER_MAX_BYTES} bytes")
    data = _load(block)
    if data is None:
        data = {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise FrontMatterError("the front matter must be name: value lines (a mapping)")
    return data, "".join(lines[end + 1 :])


def _load(block: str) -> Any:
    import yaml  # type: ignore[import-untyped]  # first use only: out of start-up

    class Loader(yaml.SafeLoader):  # type: ignore[misc]
        """The safe loader, refusing a key given twice (YAML would keep the last)."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[str] = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        line = key.start_mark.line + 2  # the file's line (after ---)
                        raise FrontMatterError(f"line {line}: the key {key.value!r} is given twice")
                    seen.add(key.value)
            return super().construct_mapping(node, deep=deep)

    try:
        return yaml.load(block, Loader=Loader)  # noqa: S506 -- a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = "" if mark is None else f" at line {mark.line + 2}"
        raise FrontMatterError(f"the front matter is not valid YAML{where}") from None
    except RecursionError:  # PyYAML composes nested values recursively
        raise FrontMatterError("the front matter nests too deeply to read") from None


def split_front_matter(text: str, path: Path, *, required: bool) -> tuple[dict[str, Any], str]:
    """`front_matter` for a file at `path`: a `ConfigError` naming it. A file without a
    ``---`` block is ({}, text), or an error when `required`."""
    try:
        parts = front_matter(text)
    except FrontMatterError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if parts is None:
        if required:
            raise ConfigError(f"{path}: no front matter (a --- block of name: value lines)")
        return {}, text
    return parts


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
