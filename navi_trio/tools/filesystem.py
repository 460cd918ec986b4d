"""The filesystem tool, and the path rules every file-touching tool shares.

A tool may touch only `ctx.roots()`: the session folder and the run's cwd. Relative
paths resolve against the cwd when set, else the session folder. A path that climbs
out with ``..``, an absolute path elsewhere, or a symlink whose target lies outside the
roots is refused with an error naming the path. ``manual:NAME`` reads the agent's
manual ``settings.manuals_dir / NAME.md`` (read-only).

File work runs in a worker thread (`trio.to_thread`) so a slow disk never blocks the
event loop.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, BinaryIO

import trio

from navi_trio.errors import ToolInputError
from navi_trio.tools.base import (
    ToolContext,
    ToolResult,
    cap_text,
    optional_number,
    optional_str,
    require_choice,
    require_str,
)

ACTIONS = ("read", "write", "append", "list", "edit", "mkdir", "delete")
MANUAL_PREFIX = "manual:"
LIST_MAX_ENTRIES = 500
BLOCK_BYTES = 1 << 20  # reading past what is shown: lines are counted, not kept
_MANUAL_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def base_dir(ctx: ToolContext) -> Path:
    """Where relative paths start: the run's cwd, else the (created) session folder."""
    ctx.session_dir.mkdir(parents=True, exist_ok=True)
    return ctx.cwd if ctx.cwd is not None else ctx.session_dir


def resolve_path(ctx: ToolContext, raw: str) -> Path:
    """The real path for `raw`, or ToolInputError when it leaves the allowed folders."""
    if "\x00" in raw:
        raise ToolInputError(f"path {raw!r} contains a NUL character")
    given = Path(raw).expanduser()
    candidate = given if given.is_absolute() else base_dir(ctx) / given
    lexical = Path(os.path.normpath(candidate))
    roots = ctx.roots()
    real_roots = [Path(os.path.realpath(r)) for r in roots]
    plain_roots = [Path(os.path.normpath(r.absolute())) for r in roots]
    allowed = ", ".join(str(r) for r in roots)
    if not any(_within(lexical, r) for r in plain_roots + real_roots):
        if given.is_absolute():
            raise ToolInputError(
                f"path '{raw}' is outside the folders this tool may use ({allowed})"
            )
        raise ToolInputError(
            f"path '{raw}' climbs out of the working folder with '..'; stay inside {allowed}"
        )
    real = Path(os.path.realpath(candidate))
    if not any(_within(real, r) for r in real_roots):
        raise ToolInputError(
            f"path '{raw}' leads through a symlink to {real}, outside the folders this "
            f"tool may use ({allowed})"
        )
    return real


def resolve_dir(ctx: ToolContext, raw: str | None) -> Path:
    """A working folder for a command: `raw` inside the roots, else the default base."""
    if raw is None:
        return base_dir(ctx)
    path = resolve_path(ctx, raw)
    if not path.is_dir():
        raise ToolInputError(f"cwd '{raw}' is not an existing folder")
    return path


def _optional_int(args: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = optional_number(args, key, default)
    if value != int(value) or value < minimum:
        raise ToolInputError(f"argument '{key}' must be a whole number of {minimum} or more")
    return int(value)


def _require_text(args: dict[str, Any], key: str) -> str:
    """A string argument that may be empty (file content, replacement text)."""
    value = args.get(key)
    if not isinstance(value, str):
        raise ToolInputError(f"argument '{key}' is required and must be a string")
    return value


class FilesystemTool:
    name = "filesystem"
    description = (
        "Read, write, append, list, edit, mkdir and delete files in the session folder "
        "and the working directory (nothing outside them). `read` of `manual:NAME` "
        "returns a manual. Manual: read `manual:filesystem` with the filesystem tool."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(ACTIONS)},
            "path": {"type": "string", "description": "relative to the working folder"},
            "content": {"type": "string", "description": "write / append: the text"},
            "old": {"type": "string", "description": "edit: exact text to replace (once)"},
            "new": {"type": "string", "description": "edit: the replacement"},
            "offset": {"type": "integer", "description": "read: first line (1-based)"},
            "limit": {"type": "integer", "description": "read: number of lines"},
            "recursive": {"type": "boolean", "description": "list: include subfolders"},
        },
        "required": ["action"],
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            action = require_choice(args, "action", ACTIONS)
            return await trio.to_thread.run_sync(self._dispatch, action, args, ctx)
        except ToolInputError as exc:
            return ToolResult.fail(str(exc))

    def _dispatch(self, action: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raw = optional_str(args, "path", "." if action == "list" else None)
        if raw is None or not raw:
            raise ToolInputError(f"argument 'path' is required for action '{action}'")
        if raw.startswith(MANUAL_PREFIX):
            if action != "read":
                raise ToolInputError(f"manuals are read-only: '{raw}' can only be read")
            return self._manual(raw[len(MANUAL_PREFIX) :], ctx)
        path = resolve_path(ctx, raw)
        try:
            handler = getattr(self, f"_{action}")
            result: ToolResult = handler(path, raw, args, ctx)
            return result
        except FileNotFoundError:
            return ToolResult.fail(f"'{raw}' does not exist")
        except IsADirectoryError:
            return ToolResult.fail(f"'{raw}' is a folder, not a file")
        except NotADirectoryError:
            return ToolResult.fail(f"a part of '{raw}' is a file, not a folder")
        except UnicodeDecodeError:
            return ToolResult.fail(f"'{raw}' is not UTF-8 text; {action} works on text files")
        except PermissionError:
            return ToolResult.fail(f"permission denied for '{raw}'")
        except OSError as exc:
            return ToolResult.fail(f"cannot {action} '{raw}': {exc.strerror or exc}")

    def _manual(self, name: str, ctx: ToolContext) -> ToolResult:
        folder = ctx.settings.manuals_dir
        available = sorted(p.stem for p in folder.glob("*.md")) if folder.is_dir() else []
        if not _MANUAL_NAME.match(name) or name not in available:
            return ToolResult.fail(
                f"no manual named '{name}'; available: {', '.join(available) or 'none'}"
            )
        text = (folder / f"{name}.md").read_text(encoding="utf-8")
        return ToolResult.success(cap_text(text, ctx.settings.tool_output_max_chars))

    def _read(self, path: Path, raw: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        offset = _optional_int(args, "offset", 1, 1)
        limit = _optional_int(args, "limit", 0, 0)  # 0: as many as fit
        cap = ctx.settings.tool_output_max_chars
        with path.open("rb") as fh:
            sample = fh.read(8192)
            if b"\x00" in sample:
                size = path.stat().st_size
                return ToolResult.fail(
                    f"'{raw}' looks like a binary file ({size} bytes); not shown"
                )
            fh.seek(0)
            lines, last, total = _read_lines(fh, offset, limit, cap)
        if total and offset > total:
            return ToolResult.fail(f"'{raw}' has {total} lines; offset {offset} is past the end")
        text = "".join(lines)
        if total == 0:
            return ToolResult.success(f"('{raw}' is empty)", lines=0)
        if offset > 1 or last < total:
            more = f"; continue with offset={last + 1}" if last < total else ""
            text += f"\n[lines {offset}-{last} of {total}{more}]"
        return ToolResult.success(text, lines=total)

    def _write(self, path: Path, raw: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        content = _require_text(args, "content")
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_text(path, content, "w")
        return ToolResult.success(f"wrote {len(content)} characters to '{raw}'")

    def _append(self, path: Path, raw: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        content = _require_text(args, "content")
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_text(path, content, "a")
        return ToolResult.success(f"appended {len(content)} characters to '{raw}'")

    def _edit(self, path: Path, raw: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        old = require_str(args, "old")
        new = _require_text(args, "new")
        with path.open(encoding="utf-8", newline="") as fh:
            text = fh.read()
        count = text.count(old)
        if count == 0 and "\r\n" in text and "\n" in old and "\r\n" not in old:
            # A CRLF file: the model saw (and copied) plain newlines.
            old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
            count = text.count(old)
        if count == 0:
            return ToolResult.fail(
                f"the 'old' text was not found in '{raw}'; read the file and copy the exact "
                "text, including whitespace and indentation"
            )
        if count > 1:
            return ToolResult.fail(
                f"the 'old' text matches {count} times in '{raw}'; include more surrounding "
                "lines so it matches exactly once"
            )
        _write_text(path, text.replace(old, new, 1), "w")
        line = text[: text.index(old)].count("\n") + 1
        return ToolResult.success(f"edited '{raw}' at line {line}")

    def _mkdir(self, path: Path, raw: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path.mkdir(parents=True, exist_ok=True)
        return ToolResult.success(f"folder '{raw}' is ready")

    def _delete(self, path: Path, raw: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if path.is_dir():
            return ToolResult.fail(f"'{raw}' is a folder; delete removes files only")
        path.unlink()
        return ToolResult.success(f"deleted '{raw}'")

    def _list(self, path: Path, raw: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        recursive = args.get("recursive", False)
        if not isinstance(recursive, bool):
            raise ToolInputError("argument 'recursive' must be true or false")
        if not path.is_dir():
            if path.exists():
                return ToolResult.fail(f"'{raw}' is a file, not a folder")
            raise FileNotFoundError(raw)
        entries: list[str] = []
        truncated = False
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            rel = Path(dirpath).relative_to(path)
            for name in dirnames:
                entries.append(f"{rel / name}/")
            for name in sorted(filenames):
                entries.append(_describe(Path(dirpath) / name, rel / name))
            if len(entries) > LIST_MAX_ENTRIES:
                truncated = True
                break
            if not recursive:
                break
        entries = entries[:LIST_MAX_ENTRIES]
        if not entries:
            return ToolResult.success(f"('{raw}' is empty)")
        text = "\n".join(entries)
        if truncated:
            text += f"\n[only the first {LIST_MAX_ENTRIES} entries are shown]"
        return ToolResult.success(cap_text(text, ctx.settings.tool_output_max_chars))


def _read_lines(fh: BinaryIO, offset: int, limit: int, cap: int) -> tuple[list[str], int, int]:
    """(the lines shown, the number of the last one shown, the file's line count).

    Memory stays within about `cap` characters whatever the file holds: a line is read
    in pieces of at most `cap` characters (a longer one is shown cut, with "…"), and
    once the shown lines are complete the rest of the file is only counted, in blocks.
    """
    piece = cap * 4 + 4  # bytes enough for more than `cap` characters of UTF-8
    lines: list[str] = []
    used = 0
    number = 0
    last = offset - 1
    while chunk := fh.readline(piece):
        number += 1
        cut = len(chunk) == piece and not chunk.endswith(b"\n")
        if number >= offset:
            line = chunk.decode("utf-8", errors="replace")
            if cut:
                line = line[:cap] + "…\n"
            if used + len(line) > cap and lines:
                number -= 1  # not shown: counted with the rest below
                fh.seek(-len(chunk), os.SEEK_CUR)
                break
            lines.append(line)
            used += len(line)
            last = number
        if cut:
            _skip_rest_of_line(fh)
        if limit and number >= offset + limit - 1:
            break
    return lines, last, number + _count_lines(fh)


def _skip_rest_of_line(fh: BinaryIO) -> None:
    while block := fh.readline(BLOCK_BYTES):
        if block.endswith(b"\n"):
            return


def _count_lines(fh: BinaryIO) -> int:
    """Lines from the current position to the end, reading in fixed-size blocks."""
    count = 0
    tail = b"\n"
    while block := fh.read(BLOCK_BYTES):
        count += block.count(b"\n")
        tail = block[-1:]
    return count + (tail != b"\n")


def _write_text(path: Path, text: str, mode: str) -> None:
    # newline="": write exactly what was given (no platform newline translation).
    with path.open(mode, encoding="utf-8", newline="") as fh:
        fh.write(text)


def _describe(full: Path, shown: Path) -> str:
    if full.is_symlink():
        return f"{shown} -> {os.readlink(full)}"
    try:
        return f"{shown}  ({full.stat().st_size} bytes)"
    except OSError:
        return str(shown)
