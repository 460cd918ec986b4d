"""Hook files a repository holds (Claude Code's and Codex's), read when the admin enables them.

A file is read from the run's held folder, bounded in bytes, and its hooks run only when
the admin trusts it by path and SHA-256: a repository is someone else's code, and a hook
is a command. An untrusted file is named in a warning and nothing of it runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Any

import attrs

from navi_trio.profiles import CallPattern, HookFilesConfig
from navi_trio.tools.roots import Root

FILE_MAX_BYTES = 256 * 1024
FILES = {"claude": (".claude", "settings.json"), "codex": (".codex", "hooks.json")}
# Their event -> ours.
EVENTS = {
    "SessionStart": "session_start",
    "UserPromptSubmit": "user_message",
    "PreToolUse": "pre_tool",
    "PermissionRequest": "permission_request",
    "PostToolUse": "post_tool",
    "PreCompact": "pre_compact",
    "PostCompact": "post_compact",
    "SubagentStop": "subagent_end",
    "Stop": "turn_end",
}
# Their tool name -> the calls of ours it means (tool, action).
TOOLS = {
    "Bash": ("terminal", "*"),
    "shell": ("terminal", "*"),
    "Read": ("filesystem", "read"),
    "Write": ("filesystem", "write"),
    "Edit": ("filesystem", "edit"),
    "MultiEdit": ("filesystem", "edit"),
}
ANY = ("", "*", ".*")


@attrs.frozen
class Hook:
    """One hook to run: from config.json (`dialect` "navi") or a trusted hook file."""

    event: str
    command: str
    matcher: CallPattern
    timeout_sec: float
    source: str  # "config.json", or the hook file's path
    dialect: str = "navi"  # navi | claude (Codex's files speak Claude's dialect)
    their_event: str = ""


@attrs.frozen
class FileHooks:
    hooks: tuple[Hook, ...] = ()
    warnings: tuple[str, ...] = ()


def read_hook_files(cwd: Root | None, files: HookFilesConfig) -> FileHooks:
    """The hooks of the trusted hook files in `cwd`, and a warning for each file found
    untrusted or unreadable. Blocking: run it in a worker thread."""
    if cwd is None:
        return FileHooks()
    hooks: list[Hook] = []
    warnings: list[str] = []
    for fmt in files.read:
        folder, name = FILES[fmt]
        path = cwd.path / folder / name
        try:
            data = _read(cwd, folder, name)
        except OSError as exc:
            warnings.append(f"the hook file {path} cannot be read: {exc.strerror or exc}")
            continue
        if data is None:
            continue
        digest = hashlib.sha256(data).hexdigest()
        if not files.trusts(path, digest):
            warnings.append(
                f"the hook file {path} is not trusted: its hooks do not run. An admin who "
                f'has read it trusts it with {{"path": "{path}", "sha256": "{digest}"}} in '
                "hook_files.trusted (config.json)"
            )
            continue
        try:
            hooks += parse_claude(json.loads(data), str(path))
        except (ValueError, TypeError) as exc:
            warnings.append(f"the hook file {path} is not one navi can read: {exc}")
    return FileHooks(tuple(hooks), tuple(warnings))


def _read(cwd: Root, folder: str, name: str) -> bytes | None:
    """The file's bytes, opened from the held folder without following a symlink;
    None when there is none."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(folder, flags | os.O_DIRECTORY, dir_fd=cwd.fd)
    except FileNotFoundError:
        return None
    try:
        try:
            fd = os.open(name, flags | os.O_NONBLOCK, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{name} is not a regular file")
        data = f.read(FILE_MAX_BYTES + 1)
    if len(data) > FILE_MAX_BYTES:
        raise OSError(f"larger than {FILE_MAX_BYTES} bytes")
    return data


def parse_claude(data: Any, source: str) -> list[Hook]:
    """The hooks of a Claude Code settings file or a Codex hooks file (one shape):
    ``{"hooks": {Event: [{"matcher": "Bash|Write", "hooks": [{"type": "command",
    "command": ..., "timeout": s}]}]}}``. Events we do not have are left out."""
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    table = data.get("hooks", {})
    if not isinstance(table, dict):
        raise ValueError('"hooks" is not an object')
    hooks: list[Hook] = []
    for their_event, groups in table.items():
        event = EVENTS.get(their_event)
        if event is None:
            continue
        if not isinstance(groups, list):
            raise ValueError(f"hooks.{their_event} is not a list")
        for group in groups:
            if not isinstance(group, dict) or not isinstance(group.get("hooks", []), list):
                raise ValueError(f"hooks.{their_event}: expected objects with a hooks list")
            matcher = group.get("matcher", "")
            if not isinstance(matcher, str):
                raise ValueError(f"hooks.{their_event}: matcher is not a string")
            for handler in group.get("hooks", []):
                if not isinstance(handler, dict) or handler.get("type", "command") != "command":
                    continue
                command, timeout = handler.get("command"), handler.get("timeout", 60)
                if not isinstance(command, str) or not command.strip():
                    raise ValueError(f"hooks.{their_event}: a hook without a command")
                if not isinstance(timeout, int | float) or not 0 < timeout <= 600:
                    raise ValueError(f"hooks.{their_event}: timeout must be 1-600 seconds")
                for pattern in _patterns(matcher):
                    hooks.append(
                        Hook(event, command, pattern, float(timeout), source, "claude", their_event)
                    )
    return hooks


def _patterns(matcher: str) -> list[CallPattern]:
    """Their matcher (a tool name, or names joined by ``|``) as our call patterns."""
    if matcher.strip() in ANY:
        return [CallPattern(tool="*")]
    found = []
    for name in matcher.split("|"):
        tool, action = TOOLS.get(name.strip(), (name.strip(), "*"))
        found.append(CallPattern(tool=tool or "*", action=action))
    return found


def their_tool(tool: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A call as Claude Code names it on a hook's stdin: ``Bash`` with its command,
    ``Read`` / ``Write`` / ``Edit`` with ``file_path``; other tools keep our name."""
    action = args.get("action")
    if tool == "terminal" and action in ("run", "open"):
        return "Bash", {**args, "command": args.get("command", "")}
    names = {"read": "Read", "write": "Write", "edit": "Edit"}
    if tool == "filesystem" and action in names:
        return names[str(action)], {**args, "file_path": args.get("path", "")}
    return tool, args


def our_arguments(tool: str, args: dict[str, Any], updated: dict[str, Any]) -> dict[str, Any]:
    """Their ``updatedInput`` as our arguments: ``file_path`` is our ``path``."""
    merged = {**args, **updated}
    if tool == "filesystem" and "file_path" in updated:
        merged["path"] = merged.pop("file_path")
    merged.pop("file_path", None)
    return merged
