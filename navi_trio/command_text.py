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


def expand_command(body: str, arguments: str) -> str:
    """`body` with its placeholders replaced by `arguments` (see the module)."""
    arguments = arguments.strip()
    words = arguments.split()
    used = False

    def replace(match: re.Match[str]) -> str:
        nonlocal used
        used = True
        if match.group(1) is None:
            return arguments
        index = int(match.group(1)) - 1
        return words[index] if index < len(words) else ""

    text = _PLACEHOLDER.sub(replace, body)
    if arguments and not used:
        text = f"{text}\n\nARGUMENTS: {arguments}"
    return text


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
