"""Keeps the ``slow`` marks right: a test not marked slow may not start a process.

`python -m pytest -m "not slow"` is the quick run for everyday work, so every test that
starts a process (a daemon, bwrap, PostgreSQL, a browser, ssh, a shell) is marked
``slow``. `refusing_processes` is how tests/conftest.py holds that: around a test that
is not marked, every way this process starts another (subprocess and trio's processes,
multiprocessing, fork, pty, os.system) raises `UnmarkedSlowTest` and is remembered, so
the test fails even where the code under test catches the error and goes on.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class UnmarkedSlowTest(RuntimeError):
    """A test not marked slow started a process."""


# (holder, attribute name): every door to a new process. subprocess's Popen (and so
# trio.run_process, asyncio, pexpect's popen_spawn) all pass through _execute_child;
# multiprocessing calls _posixsubprocess.fork_exec itself; pty and pexpect fork.
_DOORS: list[tuple[Any, str]] = [
    (subprocess.Popen, "_execute_child"),
    (_posixsubprocess, "fork_exec"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "system"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
]


@contextmanager
def refusing_processes(test: str, seen: list[str]) -> Iterator[None]:
    """Inside the block, starting a process raises and is added to `seen`."""
    saved = [(holder, name, getattr(holder, name)) for holder, name in _DOORS]

    def door(name: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            what = _what(name, args)
            seen.append(what)
            raise UnmarkedSlowTest(
                f"{test} starts a process ({what}) but is not marked slow: mark it "
                "@pytest.mark.slow (or the module: pytestmark = pytest.mark.slow)"
            )

        return refuse

    for holder, name, _ in saved:
        setattr(holder, name, door(name))
    try:
        yield
    finally:
        for holder, name, original in saved:
            setattr(holder, name, original)


def _what(name: str, args: tuple[Any, ...]) -> str:
    """The program a refused call would have run, as far as its arguments tell."""
    if name == "_execute_child" and len(args) > 1:
        argv = args[1]
        return " ".join(argv[:3]) if isinstance(argv, list | tuple) else str(argv)[:80]
    if name in ("posix_spawn", "posix_spawnp", "system") and args:
        return str(args[0])[:80]
    return name
