"""A stop is fast inside a tool: the stopped group is frozen, looked at once and killed
at once (no SIGTERM grace, no second look unless a stray left the group), and the
stopped turn is committed without waiting for an fsync.

Rules: real processes (Linux /proc), deaths checked through pidfds; the agent test talks
real HTTP to the fake LLM on 127.0.0.1 and a real SQLite file; no sleeps; every test has
an absolute `fail_after`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import BlockTool, seed, toolset, with_tools

from navi_trio.testing import open_harness
from navi_trio.tools import procs, proctree
from navi_trio.tools.procs import _spawn

pytestmark = [
    pytest.mark.slow,  # its tests start processes
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or not Path("/proc/self/stat").exists(),
        reason="needs Linux /proc",
    ),
]
TIMEOUT = 30


def _state(pid: int) -> str | None:
    stat = proctree._stat(pid)
    return None if stat is None else stat[0]


def _frozen(pid: int) -> bool | None:
    """Stopped, or with SIGSTOP pending: it runs no more code of its own either way.
    None when it is gone. Read twice: the state line is read before the pending
    signals, so a stop taken between the two shows in the second read."""
    for _ in range(2):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return None
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        pending = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
        if fields["State"].strip().startswith("T") or pending & (1 << (19 - 1)):
            return True
    return False


def _alive(pid: int) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    os.close(fd)
    return _state(pid) not in (None, "Z", "X")


async def _stop_command(
    tmp_path: Path, command: str, count: int, monkeypatch: pytest.MonkeyPatch, **kw: Any
) -> tuple[list[int], list[dict[int, bool | None]]]:
    """Run `command` (it prints `count` pids), stop it once they are out; returns the
    pids and, per look for strays, the state of each pid at that moment."""
    pids: list[int] = []
    looks: list[dict[int, bool | None]] = []
    real = proctree.find_strays_many

    def looking(queries: list[proctree.Query], tag_var: str) -> list[proctree.Strays]:
        looks.append({p: _frozen(p) for p in pids})
        return real(queries, tag_var)

    monkeypatch.setattr(_spawn, "find_strays_many", looking)
    out = trio.Event()

    def on_line(line: str) -> None:
        pids.extend(int(p) for p in line.split())
        if len(pids) >= count:
            out.set()

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: procs.run_command(
                    command, cwd=tmp_path, time_limit=3600, on_line=on_line, **kw
                )
            )
            await out.wait()
            assert all(_alive(p) for p in pids)
            nursery.cancel_scope.cancel()  # the stop
    assert not [p for p in pids if _alive(p)], pids
    return pids, looks


async def test_a_stop_does_not_wait_the_sigterm_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command ignores SIGTERM: a graceful kill would wait the whole hour of grace
    # (and the test's fail_after would fire); a stop kills at once.
    await _stop_command(
        tmp_path, "trap '' TERM; sleep 60 & echo $$ $!; wait", 2, monkeypatch, grace=3600
    )


async def test_the_group_is_frozen_while_strays_are_looked_for_and_looked_for_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids, looks = await _stop_command(tmp_path, "sleep 60 & echo $$ $!; wait", 2, monkeypatch)
    # Stopped (SIGSTOP) while looked at: nothing in the group can fork or setsid then.
    assert looks[0] == {p: True for p in pids}
    # Everything below the leader stayed in its group: nothing to look for again.
    assert len(looks) == 1


async def test_a_stray_that_left_the_group_costs_a_second_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The setsid'd sleep ran on (outside the frozen group) during the first look: it
    # may have started another, so the stop looks again once it is dead.
    command = "echo $$; setsid sh -c 'echo $$; exec sleep 60' & wait"
    pids, looks = await _stop_command(tmp_path, command, 2, monkeypatch)
    assert looks[0] == {pids[0]: True, pids[1]: False}  # the stray ran on
    assert len(looks) == 2


async def test_a_stopped_turn_is_committed_without_waiting_for_an_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(TIMEOUT):
        block = BlockTool()
        reply = {"text": "Working.", "tool_calls": [{"name": "block", "arguments": {}}]}
        async with open_harness(
            tmp_path, replies=[reply], tools=toolset(block),
            profiles={"general": with_tools(["block"])},
        ) as h:  # fmt: skip
            await seed(h)
            store = h.runtime.store
            durable: list[bool] = []
            append = store.append

            async def recording_append(session_id: str, **kw: Any) -> None:
                durable.append(kw.get("durable", True))
                await append(session_id, **kw)

            monkeypatch.setattr(store, "append", recording_append)
            s = await h.session("s1")
            s.send("go")
            await block.started.wait()
            s.stop()
            frames = await s.until_end()
            assert frames[-1]["reason"] == "stopped"
            saved = await store.load_messages("s1")
            assert (saved[-1]["role"], saved[-1]["ok"]) == ("tool", False)
        # The user message (flushed before the run goes on), the call (committed), the
        # stopped result (committed: it survives a killed daemon; the next durable
        # commit flushes it).
        assert durable == [True, False, False]


async def test_a_timeout_still_ends_the_command_gracefully(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # Not a stop: the command gets SIGTERM and its trap runs before anything is killed.
    marker = tmp_path / "term"
    command = f"trap 'echo term > {marker}; exit 0' TERM; echo ready; sleep 60 & wait"
    ready = trio.Event()
    results: list[procs.CommandResult] = []

    def on_line(line: str) -> None:
        if line == "ready":
            ready.set()

    async def run() -> None:
        results.append(
            await procs.run_command(command, cwd=tmp_path, time_limit=5.0, on_line=on_line)
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await ready.wait()
        mock_clock.jump(5.0)  # the command is running: now the time limit passes
    assert results[0].timed_out
    assert marker.read_text() == "term\n"
