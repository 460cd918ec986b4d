"""What a session's own tool calls changed in its folders since one of its messages, as
unified diffs (the browser's "changed files" panel).

The files are those a files rewind to that message would put back, conflicts included,
in the folders the asker may use now. Each diff is made by difflib from the checkpoint's
copy and the file as it is now. Everything is bounded: the files listed, the bytes read
of each side, the bytes of one diff and of all; a binary file is named, not shown.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from navi_trio.core.checkpoints import ChangedFile, Scope
from navi_trio.core.history.rewind import NO_FILES, Asker, Rewinder, engine_errors
from navi_trio.core.history.rewind_points import files_checkpoint, find_point, points

FILES_MAX = 50  # files listed
READ_MAX_BYTES = 256 * 1024  # of each side of one file
DIFF_MAX_BYTES = 64 * 1024  # of one diff's text
TOTAL_MAX_BYTES = 512 * 1024  # of all the diffs of one answer
CONTEXT_LINES = 3


@attrs.frozen
class Changes:
    """The changed files since message `since` (its id; None: the session has no
    message yet), each a dict as a frame carries it; `note` says why there are none."""

    since: str | None
    checkpoint: str | None
    files: list[dict[str, Any]]
    more_files: int
    note: str = ""
    left_out: tuple[tuple[str, str], ...] = ()


async def session_changes(
    rewinder: Rewinder, session_id: str, since: str | None, asker: Asker | None
) -> Changes:
    """The files the session's calls changed since user message `since` (None: since
    its first), with their diffs."""
    messages, _ = await rewinder.history(session_id)
    listed = points(messages)
    if since is None:
        if not listed:
            return Changes(None, None, [], 0, "the session has no message yet")
        since = listed[0].message_id
    at = find_point(messages, since, session_id)
    created = float(messages[at].get("created_at") or 0.0)
    with engine_errors():
        infos = await rewinder.engine.checkpoints(session_id)
    info = await files_checkpoint(rewinder.store, infos, session_id, created)
    if info is None:
        return Changes(since, None, [], 0, NO_FILES)
    roots, left_out = await rewinder.usable(session_id, info.paths, asker)
    if not roots:
        return Changes(since, info.id, [], 0, "you may not use its folders now", left_out)
    with engine_errors():
        found, more = await rewinder.engine.changes(
            session_id,
            info.id,
            private=rewinder.private(session_id),
            scope=Scope(conflicts="restore", roots=roots),
            max_files=FILES_MAX,
            max_file_bytes=READ_MAX_BYTES,
        )
    files = await trio.to_thread.run_sync(diffs, found)
    note = "" if files else "nothing changed by navi's tools since that message"
    return Changes(since, info.id, files, more, note, left_out)


def diffs(found: list[ChangedFile]) -> list[dict[str, Any]]:
    """Each changed file as a frame carries it, its diff cut at `DIFF_MAX_BYTES`, and
    none past `TOTAL_MAX_BYTES` in all (`omitted` says why). Blocking (difflib)."""
    total = 0
    out = []
    for changed in found:
        entry: dict[str, Any] = {
            "root": str(changed.root),
            "path": changed.path,
            "what": changed.what,
            "binary": False,
            "diff": "",
            "cut": False,
            "omitted": "",
        }
        before, after = _text(changed.before), _text(changed.after)
        if changed.unreadable:
            entry["omitted"] = f"cannot be read now: {changed.unreadable}"
        elif changed.too_large:
            entry["omitted"] = f"larger than {READ_MAX_BYTES // 1024} KiB: not shown"
        elif before is None or after is None:
            entry["binary"] = True
            entry["omitted"] = "a binary file: not shown"
        elif total >= TOTAL_MAX_BYTES:
            entry["omitted"] = "not shown: the diffs above fill the answer"
        else:
            room = min(DIFF_MAX_BYTES, TOTAL_MAX_BYTES - total)
            text, cut = _unified(changed.path, before, after, room)
            entry["diff"], entry["cut"] = text, cut
            total += len(text.encode("utf-8"))
            if cut and room < DIFF_MAX_BYTES:
                total = TOTAL_MAX_BYTES  # the answer is full: the next files are named only
        out.append(entry)
    return out


def _text(data: bytes | None) -> str | None:
    """`data` as text ("" for no file); None when it is binary."""
    if data is None:
        return ""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _unified(path: str, before: str, after: str, limit: int) -> tuple[str, bool]:
    import difflib  # on use: no run needs it before its first request (~1 ms to import)

    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
        n=CONTEXT_LINES,
    )
    parts: list[str] = []
    size = 0
    for line in lines:
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        size += len(line.encode("utf-8"))
        if size > limit:
            return "".join(parts), True
        parts.append(line)
    return "".join(parts), False
