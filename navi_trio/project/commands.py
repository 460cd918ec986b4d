"""Prompts kept as files, the slash commands of every client: ``.navi/commands/*.md``,
``.claude/commands/*.md`` (the run's cwd) and the user's ``~/.config/navi/commands``.

``review.md`` is ``/review``; its body is the prompt, ``$ARGUMENTS`` (and ``$1`` …
``$9``) replaced when a client expands it. Claude Code's ``allowed-tools``, ``model``
and ``disable-model-invocation`` are accepted and have no effect (a file never grants a
tool or picks a model); any unknown key is an error naming the file and key. The first
of a name wins (``.navi``, ``.claude``, the user's); the list is bounded in count and
bytes (`MAX_COMMANDS`, `MAX_TOTAL_BYTES`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import attrs

from navi_trio.errors import ConfigError, RootChangedError
from navi_trio.project.files import Found, read_md_folders
from navi_trio.project.frontmatter import check_keys, shown, split_front_matter, text_value
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs

COMMAND_FOLDERS = (".navi/commands", ".claude/commands")
KEYS = ("description", "argument-hint", "allowed-tools", "model", "disable-model-invocation")
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
DESCRIPTION_MAX = 1024
MAX_COMMANDS = 100
# The bodies of one list: it travels in one frame, under the 1 MiB a client takes
# (JSON escaping can double a text).
MAX_TOTAL_BYTES = 256 * 1024


@attrs.frozen(kw_only=True)
class FileCommand:
    name: str
    description: str
    argument_hint: str
    body: str
    source: str  # "project" or "user"
    path: Path

    def frame(self) -> dict[str, str]:
        """As the ``commands`` reply lists it."""
        return {
            "name": self.name,
            "description": self.description,
            "argument_hint": self.argument_hint,
            "body": self.body,
            "source": self.source,
            "path": str(self.path),
        }


@attrs.frozen
class FileCommands:
    commands: list[FileCommand] = attrs.Factory(list)
    problems: list[str] = attrs.Factory(list)


def parse_command(text: str, path: Path, source: str) -> FileCommand:
    """One command file, checked; a `ConfigError` naming the file and key."""
    name = path.stem
    if not NAME.fullmatch(name):
        raise ConfigError(
            f"{path}: the file name makes the command's name: lowercase letters, digits, "
            f"- and _ (1-64), got {name!r}"
        )
    data, body = split_front_matter(text, path, required=False)
    check_keys(data, path, KEYS)
    description = text_value(data, "description", path, max_chars=DESCRIPTION_MAX) or ""
    hint = data.get("argument-hint")
    if isinstance(hint, list) and all(isinstance(h, str) for h in hint):
        hint = " ".join(f"[{h}]" for h in hint)  # YAML reads "[file]" as a list
    if hint is not None and not isinstance(hint, str):
        raise ConfigError(f"{path}: $.argument-hint: expected a string, got {shown(hint)}")
    body = body.strip()
    if not body:
        raise ConfigError(f"{path}: the body (the prompt) is empty")
    if not description:  # Claude Code shows the first line then
        description = body.splitlines()[0][:200]
    return FileCommand(
        name=name,
        description=description,
        argument_hint=(hint or "")[:200],
        body=body,
        source=source,
        path=path,
    )


def collect_commands(found: Sequence[tuple[Found, str]]) -> FileCommands:
    """The commands of the files found, in order of the searches (the first of a name
    wins); a bad file, a name taken, or one past the bounds is a problem and skipped."""
    result = FileCommands()
    total = 0
    for search, source in found:
        result.problems.extend(search.problems)
        for md in search.files:
            try:
                command = parse_command(md.text, md.path, source)
            except ConfigError as exc:
                result.problems.append(f"{exc}; skipped")
                continue
            first = next((c for c in result.commands if c.name == command.name), None)
            if first is not None:
                result.problems.append(
                    f"{md.path}: /{command.name} is taken by {first.path}; skipped"
                )
                continue
            size = len(command.body.encode())
            if len(result.commands) >= MAX_COMMANDS or total + size > MAX_TOTAL_BYTES:
                result.problems.append(
                    f"{md.path}: past the {MAX_COMMANDS} commands or {MAX_TOTAL_BYTES} "
                    "bytes one list holds; skipped"
                )
                continue
            total += size
            result.commands.append(command)
    return result


def user_commands_folder() -> Path:
    """The user's own commands: ``$XDG_CONFIG_HOME/navi/commands`` (~/.config/…)."""
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "navi" / "commands"


def find_commands(
    cwd: Root | None,
    private: PrivatePaths,
    who: RunAs | None,
    user_folder: Path | None,
) -> FileCommands:
    """The commands of a run in the held `cwd` (None: the user's only), then those of
    `user_folder` (None: none). Blocking: run it in a worker thread."""
    searches: list[tuple[Found, str]] = []
    if cwd is not None:
        folders = [cwd.path / sub for sub in COMMAND_FOLDERS]
        searches.append((read_md_folders([cwd], folders, private, who), "project"))
    if user_folder is not None:
        searches.append((_read_user_folder(user_folder), "user"))
    return collect_commands(searches)


def _read_user_folder(folder: Path) -> Found:
    """The daemon account's own folder (navi's config: hidden from runs, read here as
    the account's own, still without following a symlink out of it)."""
    real = Path(os.path.realpath(folder))
    if not real.is_dir():
        return Found()
    try:
        root = Root.open(real, "the user's commands folder", given=folder)
    except RootChangedError as exc:
        return Found(problems=[str(exc)])
    with root:
        return read_md_folders([root], [folder], PrivatePaths(hidden=(), allowed=()), None)
