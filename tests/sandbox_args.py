"""Reading a bwrap command line in tests: `by_path` writes each fd bind as the path bind
it stands for, so a test can say where a folder is bound and in which order."""

from __future__ import annotations

from collections.abc import Sequence

FD_BINDS = {"--bind-fd": "--bind", "--ro-bind-fd": "--ro-bind"}


def by_path(argv: Sequence[str]) -> list[str]:
    """`argv` with ``--bind-fd N DEST`` as ``--bind DEST DEST`` (``--ro-bind-fd`` too)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in FD_BINDS and i + 2 < len(argv):
            out += [FD_BINDS[argv[i]], argv[i + 2], argv[i + 2]]
            i += 3
        else:
            out.append(argv[i])
            i += 1
    return out
