"""The filesystem tool, and the path rules every file-touching tool shares.

A tool may touch only `ctx.roots()`: the session folder and the run's cwd (relative
paths resolve against the cwd, else the session folder). A path that climbs out, an
absolute path elsewhere, or a symlink whose target lies outside the roots is refused
with an error naming the path; so is navi's own data, even inside a root, but for the
caller's own session folder. ``manual:NAME`` reads the agent's manual (read-only).

Every action opens what it touches from a directory fd of its root, one component at a
time with ``O_NOFOLLOW``, so a rename or symlink swap between a check and the open
cannot lead it elsewhere. File work runs in a worker thread so a slow disk never blocks
the event loop.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import trio

from navi_trio.errors import ToolInputError
from navi_trio.tools._beneath import (
    MAX_HOPS,
    Beneath,
    NotAFolderError,
    OutsideError,
    PrivateError,
    SpecialFileError,
    TooManyLinksError,
)
from navi_trio.tools.args import action_schema, arg, parse_action
from navi_trio.tools.base import ToolContext, ToolResult, cap_text, input_errors_fail
from navi_trio.tools.private import private_paths, within
from navi_trio.tools.roots import Root, RunRoots
from navi_trio.tools.runas import run_as

MANUAL_PREFIX = "manual:"
LIST_MAX_ENTRIES = 500
BLOCK_BYTES = 1 << 20  # reading past what is shown: lines are counted, not kept
_MANUAL_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def _start_dir(ctx: ToolContext) -> Path:
    return ctx.cwd if ctx.cwd is not None else ctx.session_dir


def _private_message(shown: str) -> str:
    return f"'{shown}' is navi's own data; tools may not use it"


def _lexical(ctx: ToolContext, raw: str, held: Sequence[Root]) -> Path:
    """The absolute, normalised path for `raw`, or ToolInputError when it names a place
    outside the roots (before anything on disk is looked at)."""
    if "\x00" in raw:
        raise ToolInputError(f"path {raw!r} contains a NUL character")
    given = Path(raw).expanduser()
    candidate = given if given.is_absolute() else _start_dir(ctx) / given
    lexical = Path(os.path.normpath(candidate))
    bases = [Path(os.path.normpath(r.given.absolute())) for r in held] + [r.path for r in held]
    if not within(lexical, *bases):
        if given.is_absolute():
            raise ToolInputError(
                f"path '{raw}' is outside the folders this tool may use ({_allowed(ctx)})"
            )
        climbs = f"path '{raw}' climbs out of the working folder with '..'"
        raise ToolInputError(f"{climbs}; stay inside {_allowed(ctx)}")
    return lexical


def _allowed(ctx: ToolContext) -> str:
    return ", ".join(str(r) for r in ctx.roots())


def _refusal(ctx: ToolContext, raw: str, exc: Exception) -> ToolInputError:
    """The user's words for a walk's refusal."""
    if isinstance(exc, OutsideError):
        return ToolInputError(
            f"path '{raw}' leads through a symlink to {exc.target}, outside the folders "
            f"this tool may use ({_allowed(ctx)})"
        )
    if isinstance(exc, PrivateError):
        return ToolInputError(_private_message(raw))
    return ToolInputError(f"path '{raw}' goes through more than {MAX_HOPS} symlinks")


def resolve_dir(ctx: ToolContext, raw: str | None, roots: RunRoots) -> Root:
    """The folder a command runs in, held open: `raw` inside the roots, else where the run
    starts. The caller closes it.

    Checked as the filesystem tool checks a folder; the process is started in it through
    its fd, so a swap after this check cannot move the command elsewhere.
    """
    held = roots.all()
    private = private_paths(ctx.settings, ctx.session_dir)
    if raw is None:
        start = roots.start()
        if private.blocks(start.path) is not None:
            raise ToolInputError(_private_message(str(start.given)))
        return start.dup()
    path = _lexical(ctx, raw, held)
    with ExitStack() as stack:
        fs = Beneath(held, private, stack)
        try:
            spot = fs.folder(path)
        except (OutsideError, PrivateError, TooManyLinksError) as exc:
            raise _refusal(ctx, raw, exc) from None
        except (OSError, SpecialFileError):
            raise ToolInputError(f"cwd '{raw}' is not an existing folder") from None
        return Root(os.dup(spot.fd), spot.path, f"the folder '{raw}'")


_PATH = "relative to the working folder"


@attrs.frozen
class PathArgs:
    """mkdir, delete; the path every action takes."""

    path: str = arg(_PATH)


@attrs.frozen(kw_only=True)
class ReadArgs(PathArgs):
    offset: int = arg("read: first line (1-based)", default=1, minimum=1)
    limit: int = arg("read: number of lines", default=0, minimum=0)  # 0: as many as fit


@attrs.frozen(kw_only=True)
class ContentArgs(PathArgs):
    """write, append: the text may be empty."""

    content: str = arg("write / append: the text", nonempty=False)


@attrs.frozen(kw_only=True)
class EditArgs(PathArgs):
    old: str = arg("edit: exact text to replace (once)")
    new: str = arg("edit: the replacement", nonempty=False)


@attrs.frozen(kw_only=True)
class ListArgs:
    path: str = arg(_PATH, default=".", nonempty=True)
    recursive: bool = arg("list: include subfolders", default=False)


ACTIONS: dict[str, type] = {
    "read": ReadArgs,
    "write": ContentArgs,
    "append": ContentArgs,
    "list": ListArgs,
    "edit": EditArgs,
    "mkdir": PathArgs,
    "delete": PathArgs,
}


class FilesystemTool:
    name = "filesystem"
    description = (
        "Read, write, append, list, edit, mkdir and delete files in the session folder "
        "and the working directory (nothing outside them). `read` of `manual:NAME` "
        "returns a manual. Manual: read `manual:filesystem` with the filesystem tool."
    )
    parameters = action_schema(ACTIONS)

    @input_errors_fail
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        action, parsed = parse_action(ACTIONS, args)
        return await trio.to_thread.run_sync(self._dispatch, action, parsed, ctx)

    def _dispatch(self, action: str, args: Any, ctx: ToolContext) -> ToolResult:
        raw: str = args.path
        if raw.startswith(MANUAL_PREFIX):
            if action != "read":
                raise ToolInputError(f"manuals are read-only: '{raw}' can only be read")
            return self._manual(raw[len(MANUAL_PREFIX) :], ctx)
        roots = ctx.call_roots()
        with ExitStack() as stack:
            stack.callback(roots.close)
            held = roots.all()
            path = _lexical(ctx, raw, held)
            handler = getattr(self, f"_{action}")
            # As the tool user's rights too, when the daemon is root: no more than a
            # command of this run could read or change.
            who = run_as(ctx.settings.tool_user)
            fs = Beneath(held, private_paths(ctx.settings, ctx.session_dir), stack, who)
            try:
                result: ToolResult = handler(fs, path, raw, args, ctx)
                return result
            except (OutsideError, PrivateError, TooManyLinksError) as exc:
                raise _refusal(ctx, raw, exc) from None
            except SpecialFileError:
                return ToolResult.fail(
                    f"'{raw}' is not a regular file (a pipe, socket or device); "
                    f"{action} works on files"
                )
            except FileNotFoundError:
                return ToolResult.fail(f"'{raw}' does not exist")
            except IsADirectoryError:
                return ToolResult.fail(f"'{raw}' is a folder, not a file")
            except NotAFolderError:
                return ToolResult.fail(f"'{raw}' is a file, not a folder")
            except NotADirectoryError:
                return ToolResult.fail(f"a part of '{raw}' is a file, not a folder")
            except UnicodeDecodeError:
                text_only = f"{action} works on text files"
                return ToolResult.fail(f"'{raw}' is not UTF-8 text; {text_only}")
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

    def _read(
        self, fs: Beneath, path: Path, raw: str, args: ReadArgs, ctx: ToolContext
    ) -> ToolResult:
        offset, limit = args.offset, args.limit
        cap = ctx.settings.tool_output_max_chars
        opened, st = fs.open_file(path, os.O_RDONLY)
        with opened as fh:
            sample = fh.read(8192)
            if b"\x00" in sample:
                return ToolResult.fail(
                    f"'{raw}' looks like a binary file ({st.st_size} bytes); not shown"
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

    def _write(
        self,
        fs: Beneath,
        path: Path,
        raw: str,
        args: ContentArgs,
        ctx: ToolContext,
        append: bool = False,
    ) -> ToolResult:
        data = _utf8(args.content, "content")
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0)
        opened, _ = fs.open_file(path, flags, create_parents=True, truncate=not append)
        with opened as fh:
            fh.write(data)
        done = "appended" if append else "wrote"
        return ToolResult.success(f"{done} {len(args.content)} characters to '{raw}'")

    def _append(
        self, fs: Beneath, path: Path, raw: str, args: ContentArgs, ctx: ToolContext
    ) -> ToolResult:
        return self._write(fs, path, raw, args, ctx, append=True)

    def _edit(
        self, fs: Beneath, path: Path, raw: str, args: EditArgs, ctx: ToolContext
    ) -> ToolResult:
        old, new = args.old, args.new
        cap = ctx.settings.file_edit_max_bytes
        # One open for the read and the write: nothing can be swapped in between.
        opened, st = fs.open_file(path, os.O_RDWR)
        with opened as fh:
            # Never more than the cap in memory: a file that grew past it after the
            # stat is caught by the one byte read beyond it.
            data = fh.read(cap + 1) if st.st_size <= cap else b""
            if st.st_size > cap or len(data) > cap:
                size = max(st.st_size, len(data))
                return ToolResult.fail(
                    f"'{raw}' is {size} bytes, over the {cap} bytes that edit reads "
                    "(NAVI_FILE_EDIT_MAX_BYTES); change it with terminal (sed -i, a "
                    "script) or write it whole"
                )
            # Bytes decoded as they are: "\r\n" stays (newline="" semantics).
            text = data.decode("utf-8")
            count = text.count(old)
            if count == 0 and "\r\n" in text and "\n" in old and "\r\n" not in old:
                # A CRLF file: the model saw (and copied) plain newlines.
                old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
                count = text.count(old)
            if count == 0:
                return ToolResult.fail(
                    f"the 'old' text was not found in '{raw}'; read the file and copy the "
                    "exact text, including whitespace and indentation"
                )
            if count > 1:
                return ToolResult.fail(
                    f"the 'old' text matches {count} times in '{raw}'; include more "
                    "surrounding lines so it matches exactly once"
                )
            data = _utf8(text.replace(old, new, 1), "new")
            fh.seek(0)
            fh.truncate()
            fh.write(data)
        line = text[: text.index(old)].count("\n") + 1
        return ToolResult.success(f"edited '{raw}' at line {line}")

    def _mkdir(
        self, fs: Beneath, path: Path, raw: str, args: PathArgs, ctx: ToolContext
    ) -> ToolResult:
        fs.folder(path, create=True)
        return ToolResult.success(f"folder '{raw}' is ready")

    def _delete(
        self, fs: Beneath, path: Path, raw: str, args: PathArgs, ctx: ToolContext
    ) -> ToolResult:
        try:
            fs.unlink(path)
        except IsADirectoryError:
            return ToolResult.fail(f"'{raw}' is a folder; delete removes files only")
        return ToolResult.success(f"deleted '{raw}'")

    def _list(
        self, fs: Beneath, path: Path, raw: str, args: ListArgs, ctx: ToolContext
    ) -> ToolResult:
        recursive = args.recursive
        top = fs.folder(path)
        entries: list[str] = []
        truncated = False
        with closing(fs.walk(top, recursive=recursive)) as walk:
            for rel, fd, folders, others in walk:
                entries.extend(f"{rel / e.name}/" for e in folders)
                entries.extend(_describe(fd, e, rel / e.name) for e in others)
                if len(entries) > LIST_MAX_ENTRIES:
                    truncated = True
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

    Memory stays within about `cap` characters: a longer line is shown cut, with "…", and
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


def _utf8(text: str, key: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolInputError(
            f"argument '{key}' holds characters that cannot be written as UTF-8 "
            "(an unpaired surrogate)"
        ) from None


def _describe(dir_fd: int, entry: os.DirEntry[str], shown: Path) -> str:
    try:
        if entry.is_symlink():
            return f"{shown} -> {os.readlink(entry.name, dir_fd=dir_fd)}"
        return f"{shown}  ({entry.stat(follow_symlinks=False).st_size} bytes)"
    except OSError:
        return str(shown)
