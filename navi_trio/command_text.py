"""What a client does with the commands kept as files that the daemon lists.

The daemon reads the files (navi_trio/project/commands.py) and answers a ``commands``
request with each one's name, description, argument hint and body. The client expands
one: ``/review src/app.py`` sends the body with ``$ARGUMENTS`` replaced by
``src/app.py`` as an ordinary message, so the history holds what the model was asked.
The page (web/slash.js) applies the same rule; the tests hold both to the same cases.

- ``$ARGUMENTS``: the rest of the line, as typed;
- ``$1`` … ``$9``: its words (split on white space), empty where there are fewer;
- a body naming neither gets the rest of the line after it (``ARGUMENTS: …``), so
  nothing typed is lost.

A command whose name is one of the client's own is not offered (`usable`): the client's
own wins, and a notice says which file was left out.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

_PLACEHOLDER = re.compile(r"\$ARGUMENTS|\$([1-9])(?![0-9])")


# An expanded prompt is a message: under the daemon's 1 MiB frame. A body repeating
# $ARGUMENTS must not turn a long line into gigabytes before anything checks it.
EXPANDED_MAX_CHARS = 900_000


class CommandTooLongError(ValueError):
    """The expanded prompt would be longer than `EXPANDED_MAX_CHARS`."""


def expand_command(body: str, arguments: str) -> str:
    """`body` with its placeholders replaced by `arguments` (see the module);
    `CommandTooLongError` when that would pass `EXPANDED_MAX_CHARS`."""
    arguments = arguments.strip()
    words = arguments.split()
    used = False
    size = len(body)

    def replace(match: re.Match[str]) -> str:
        nonlocal used, size
        used = True
        if match.group(1) is None:
            value = arguments
        else:
            index = int(match.group(1)) - 1
            value = words[index] if index < len(words) else ""
        size += len(value)
        _bounded(size)
        return value

    text = _PLACEHOLDER.sub(replace, body)
    if arguments and not used:
        text = f"{text}\n\nARGUMENTS: {arguments}"
        _bounded(len(text))
    return text


def _bounded(size: int) -> None:
    if size > EXPANDED_MAX_CHARS:
        raise CommandTooLongError(
            f"the command's prompt with its arguments would be over {EXPANDED_MAX_CHARS} characters"
        )


def usable(
    listed: Iterable[Mapping[str, Any]], builtins: Collection[str]
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """(name -> command) of the listed commands a client may offer beside its own
    `builtins`, and a notice for each one left out for its name."""
    kept: dict[str, dict[str, str]] = {}
    notices: list[str] = []
    for item in listed:
        name = str(item.get("name") or "")
        if not name:
            continue
        if name in builtins:
            notices.append(
                f"/{name} of {item.get('path')} is not offered: /{name} is a built-in command"
            )
            continue
        kept[name] = {k: str(v) for k, v in item.items() if isinstance(v, str)}
    return kept, notices
