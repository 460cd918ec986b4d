"""What a rewind's list, preview and result say, as text, for every client of them: pure
functions of the daemon's reply fields, written to any text stream.
"""

from __future__ import annotations

import time
from typing import Any, TextIO

from navi_trio.text import terminal_safe

Fields = dict[str, Any]
SHOWN_CHANGES = 10


def _when(seconds: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(seconds or 0)))


CLI_BRANCH = "bring one back with --branch ID: it undoes that rewind"
CLI_UNDO = "undo it with: navi rewind --session {session} --branch {branch}"
CLI_FORCE = "--force restores them too"
SHOWN_PATHS = 10


def print_overview(listed: Fields, out: TextIO, *, branch_hint: str = CLI_BRANCH) -> None:
    messages = list(listed.get("messages") or [])
    more = int(listed.get("more_messages") or 0)
    if not messages:
        _print("no user messages yet: nothing to rewind to", file=out)
    for n, m in enumerate(messages, start=more + 1):
        files = (
            "files"
            if m.get("checkpoint") not in (None, "pruned")
            else ("files pruned" if m.get("checkpoint") == "pruned" else "no file change since")
        )
        _print(
            f"{n:>4}  {m['message_id']}  {_when(m.get('created_at'))}  [{files}]  "
            f"{_one_line(m.get('text'))}",
            file=out,
        )
    branches = list(listed.get("branches") or [])
    if branches:
        _print(f"branches ({branch_hint}):", file=out)
    for b in branches:
        _print(
            f"      {b['branch_id']}  {_when(b.get('created_at'))}  {b.get('restore')}  "
            f"{b.get('messages')} message(s)  {_one_line(b.get('text'))}",
            file=out,
        )


def print_preview(preview: Fields, out: TextIO, *, force_hint: str = CLI_FORCE) -> None:
    where = (
        f"before {_quote(preview.get('text'))}"
        if preview.get("to")
        else f"branch {preview.get('branch')}"
    )
    _print(f"rewind {preview.get('restore')} to {where}:", file=out)
    if preview.get("restore") in ("chat", "both"):
        removed, restored = preview.get("messages_removed"), preview.get("messages_restored")
        line = f"  chat: {removed} message(s) removed"
        _print(line + (f", {restored} brought back" if restored else ""), file=out)
    files = preview.get("files")
    if files is None:
        if preview.get("files_note"):
            _print(f"  files: {preview['files_note']}", file=out)
        return
    for root in files.get("roots") or []:
        counts = ", ".join(
            f"{root[k]} {k.replace('_', ' ')}"
            for k in ("restored", "created", "deleted", "modes", "dirs_created", "dirs_deleted")
            if root.get(k)
        )
        _print(
            f"  files in {root['root']}: {counts or 'no change'} "
            f"({root.get('bytes', 0)} bytes written)",
            file=out,
        )
        for change in (root.get("changes") or [])[:SHOWN_CHANGES]:
            _print(f"      {change['what']:<11} {change['path']}", file=out)
        hidden = len(root.get("changes") or []) - SHOWN_CHANGES + int(root.get("more_changes", 0))
        if hidden > 0:
            _print(f"      … and {hidden} more", file=out)
        _conflicts(root, preview.get("conflicts") == "restore", force_hint, out)
    for left in preview.get("roots_left_out") or []:
        _print(f"  left out: {left.get('root')}: {left.get('why')}", file=out)
    if files.get("undo_skipped"):
        _print(f"  this cannot be undone: {files['undo_skipped']}", file=out)
    _print(f"  {files.get('not_covered')}", file=out)


def _conflicts(root: Fields, restored: bool, force_hint: str, out: TextIO) -> None:
    """The files both navi and someone else changed, and those only someone else did."""
    conflicts = list(root.get("conflicts") or [])
    if conflicts:
        count = int(root.get("conflicts_count") or len(conflicts))
        what = "restored too, as asked" if restored else f"kept as they are now; {force_hint}"
        _print(
            f"    {count} conflict(s), changed by navi and by someone else since ({what}):",
            file=out,
        )
        _print(f"      {_paths(conflicts, count)}", file=out)
    others = list(root.get("others") or [])
    if others:
        count = int(root.get("others_count") or len(others))
        _print(
            f"    left as they are ({count}: changed since, not by navi): {_paths(others, count)}",
            file=out,
        )


def _paths(paths: list[Any], count: int) -> str:
    shown = ", ".join(str(p) for p in paths[:SHOWN_PATHS])
    return shown + (f" … and {count - SHOWN_PATHS} more" if count > SHOWN_PATHS else "")


def print_done(done: Fields, session_id: str, out: TextIO, *, undo_hint: str = CLI_UNDO) -> None:
    parts = []
    if done.get("messages_removed") or done.get("messages_restored"):
        parts.append(
            f"{done.get('messages_removed')} message(s) removed, "
            f"{done.get('messages_restored')} brought back"
        )
    files = done.get("files") or {}
    if files:
        parts.append(
            ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in files.items() if v)
            or "no file changed"
        )
    _print("rewound: " + ("; ".join(parts) or "nothing to change"), file=out)
    for failed in done.get("failed") or []:
        _print(f"  not restored: {failed}", file=out)
    if done.get("undo"):
        _print(undo_hint.format(session=session_id, branch=done["undo"]), file=out)


def print_forked(made: Fields, out: TextIO) -> None:
    new = made.get("new_session_id")
    _print(
        f"forked {made.get('session_id')} into {new} ({made.get('messages')} message(s))", file=out
    )
    folder = made.get("folder")
    for left in made.get("left_out") or []:
        _print(f"not copied: {left}", file=out)
    if folder:
        _print(f"its files: {folder}", file=out)
        _print(
            f"go on with: navi chat --session {new}  (in {folder}: navi run --cwd {folder} "
            f"--session {new} ...)",
            file=out,
        )
    else:
        _print(f"go on with: navi chat --session {new}", file=out)


def _print(line: str, *, file: TextIO) -> None:
    """One line of the text: paths and message texts are a tool's and a model's words."""
    print(terminal_safe(line), file=file)


def _one_line(text: Any) -> str:
    return " ".join(str(text or "").split())


def _quote(text: Any) -> str:
    line = _one_line(text)
    return repr(line if len(line) <= 60 else line[:59] + "…")
