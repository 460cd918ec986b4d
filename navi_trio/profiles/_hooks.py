"""The hooks part of config.json: commands run at points of a turn.

``hooks`` maps an event to a list of `HookConfig` (a command, its timeout, and for tool
events the same matcher policy rules use). ``hook_files`` says whether a run's folder's
hook files (``.claude/settings.json``, ``.codex/hooks.json``) are read at all, and
which the admin trusts, by absolute path and SHA-256 of their content.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import attrs

from navi_trio.errors import ConfigError
from navi_trio.profiles._policy import CallPattern

HOOK_EVENTS = (
    "session_start",
    "user_message",
    "pre_tool",
    "permission_request",
    "post_tool",
    "pre_compact",
    "post_compact",
    "subagent_end",
    "task_done",
    "stop",
    "turn_end",
)
# The events of one tool call: only their hooks have a matcher.
TOOL_EVENTS = ("pre_tool", "permission_request", "post_tool")
HookFormat = Literal["claude", "codex"]
HOOK_FORMATS: tuple[HookFormat, ...] = ("claude", "codex")
HOOK_TIMEOUT_MAX = 600.0
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
ANY_CALL = CallPattern(tool="*")


def _command(_inst: Any, attr: attrs.Attribute[Any], value: str) -> None:
    if not value.strip():
        raise ValueError(f"{attr.name}: expected a command line, got an empty string")


def _timeout(_inst: Any, attr: attrs.Attribute[Any], value: float) -> None:
    if not 0 < value <= HOOK_TIMEOUT_MAX:
        raise ValueError(
            f"{attr.name}: expected seconds above 0 and at most {HOOK_TIMEOUT_MAX:g}, got {value!r}"
        )


@attrs.frozen(kw_only=True)
class HookConfig:
    """One hook: a shell command line, run with the event's JSON on stdin."""

    command: str = attrs.field(validator=_command)
    # Which calls (tool events only): as a policy rule's tool, action and match.
    matcher: CallPattern = ANY_CALL
    timeout_sec: float = attrs.field(default=30.0, validator=_timeout)


def _sha256(_inst: Any, attr: attrs.Attribute[Any], value: str) -> None:
    if not _SHA256.match(value):
        raise ValueError(f"{attr.name}: expected 64 lower-case hex digits, got {value!r}")


def _absolute(_inst: Any, attr: attrs.Attribute[Any], value: str) -> None:
    if not Path(value).is_absolute():
        raise ValueError(f"{attr.name}: expected an absolute path, got {value!r}")


@attrs.frozen(kw_only=True)
class TrustedHookFile:
    """A repository's hook file the admin read and trusts, as it is now."""

    path: str = attrs.field(validator=_absolute)
    sha256: str = attrs.field(validator=_sha256)


@attrs.frozen(kw_only=True)
class HookFilesConfig:
    # Which formats of hook files a run's folder may hold; empty: none is read.
    read: tuple[HookFormat, ...] = ()
    trusted: tuple[TrustedHookFile, ...] = ()

    def trusts(self, path: Path, sha256: str) -> bool:
        return any(Path(t.path) == path and t.sha256 == sha256 for t in self.trusted)


def _check_hooks_shape(data: dict[str, Any], path: Path) -> None:
    """cattrs reads a string as a list of characters: say where a list or object belongs."""
    hooks = data.get("hooks", {})
    if not isinstance(hooks, dict):
        raise ConfigError(f"{path}: $.hooks: expected an object of event -> list, got {hooks!r}")
    for event, items in hooks.items():
        where = f"{path}: $.hooks[{event!r}]"
        if event not in HOOK_EVENTS:
            raise ConfigError(f"{where}: unknown event (events: {', '.join(HOOK_EVENTS)})")
        if not isinstance(items, list):
            raise ConfigError(f"{where}: expected a list of objects, got {items!r}")
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ConfigError(f"{where}[{i}]: expected an object, got {item!r}")
            if "matcher" in item and event not in TOOL_EVENTS:
                raise ConfigError(
                    f"{where}[{i}].matcher: only the tool events ({', '.join(TOOL_EVENTS)}) "
                    "have a matcher"
                )
            if "matcher" in item and not isinstance(item["matcher"], dict):
                raise ConfigError(
                    f'{where}[{i}].matcher: expected an object like {{"tool": "terminal", '
                    f'"match": "git *"}}, got {item["matcher"]!r}'
                )
    files = data.get("hook_files", {})
    if not isinstance(files, dict):
        raise ConfigError(f"{path}: $.hook_files: expected an object, got {files!r}")
    for key in ("read", "trusted"):
        if not isinstance(files.get(key, []), list):
            raise ConfigError(f"{path}: $.hook_files.{key}: expected a list, got {files[key]!r}")
