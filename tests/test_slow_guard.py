"""The guard that keeps the ``slow`` marks right (tests/slow_guard.py): inside it, every
way to start a process raises `UnmarkedSlowTest` and is remembered, also when the code
catches the error; after it, every door is as it was.

Rules: nothing here starts a process (each start is refused before the fork).
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess

import pytest
import trio
from slow_guard import _DOORS, UnmarkedSlowTest, refusing_processes


def test_every_door_is_refused_and_remembered_and_restored_after() -> None:
    before = [getattr(holder, name) for holder, name in _DOORS]
    seen: list[str] = []
    with refusing_processes("t::x", seen):
        with pytest.raises(UnmarkedSlowTest, match=r"t::x starts a process \(echo hi\)"):
            subprocess.run(["echo", "hi"], check=False)
        try:
            os.system("true")
        except UnmarkedSlowTest:
            pass  # caught by the code under test: still remembered
        with pytest.raises(UnmarkedSlowTest):
            os.fork()
    assert seen == ["echo hi", "true", "fork"]
    assert [getattr(holder, name) for holder, name in _DOORS] == before
    assert subprocess.Popen._execute_child is before[0]  # type: ignore[attr-defined]
    assert _posixsubprocess.fork_exec is before[1]


async def test_trios_processes_go_through_the_same_door() -> None:
    seen: list[str] = []
    with refusing_processes("t::y", seen), pytest.raises(UnmarkedSlowTest):
        await trio.run_process(["echo", "hi"])
    assert seen == ["echo hi"]
