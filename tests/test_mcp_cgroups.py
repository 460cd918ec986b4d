"""Stdio MCP servers in cgroups (tools/cgroups.py, tools/mcp/connection.py): the server
runs in ``mcp-<name>`` under the daemon's tree with the limits of its entry, a fork
bomb in it is held by its pids limit and the failed result says so, and what it
started out of its process group without its tag dies at shutdown, and, when the
daemon died, at its successor's clean-up.

Rules as tests/test_mcp_client.py: the demo server over stdio, real runs against the
fake LLM server, an absolute timeout on each test, no sleep. Skipped, with the reason,
where cgroups (or a pids controller) cannot be written.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from agent_tools import of_type
from test_cgroups import need_cgroups
from test_mcp_client import TIMEOUT, _alive, call, mcp_config, results, stdio_entry

from navi_trio.profiles import McpServerConfig
from navi_trio.testing import open_harness
from navi_trio.tools import cgroups
from navi_trio.tools.mcp.connection import McpConnection
from navi_trio.tools.procs import tag_owner
from navi_trio.tools.proctree import start_time

pytestmark = pytest.mark.slow  # real servers in real cgroups

LIMITS = {"pids": 32, "memory_mb": 512}


@pytest.fixture
def escaped(tmp_path: Path) -> Iterator[Path]:
    """Where the demo server writes its pid and its stray's (DEMO_ESCAPE); whichever
    is still alive at the end is killed, so a failing test leaves nothing running."""
    where = tmp_path / "escaped"
    yield where
    if where.exists():
        for pid in map(int, where.read_text().split()):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _written(escaped: Path) -> tuple[int, int]:
    """The server's pid and its stray's, as the demo server wrote them."""
    server, stray = map(int, escaped.read_text().split())
    return server, stray


def _held(pid: int, tree: str) -> list[str]:
    """The lines of /proc/PID/cgroup that put it below `tree`'s ``mcp-demo`` folder."""
    text = Path(f"/proc/{pid}/cgroup").read_text()
    return [line for line in text.splitlines() if f"/{tree}/mcp-demo/cmd-" in line]


async def test_a_stdio_server_runs_in_its_cgroup_and_all_it_started_dies_at_shutdown(
    tmp_path: Path, escaped: Path
) -> None:
    need_cgroups("pids")
    entry = stdio_entry(env={"DEMO_ESCAPE": escaped}, limits=LIMITS)
    owner = tag_owner(tmp_path / "data")
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[call("mcp__demo__echo", text="hi"), {"text": "done"}],
            config=mcp_config({"demo": entry}),
        ) as h:
            assert results(await h.turn("s1", "echo")) == [(True, "echo: hi")]
            server, stray = _written(escaped)
            name = cgroups.tree_name(owner)
            # In every hierarchy the tree has (v2 kills, v1 limits here), both of them.
            tree = cgroups.tree_for(owner)
            assert tree is not None
            assert len(_held(server, name)) == len(tree.top.folders()), _held(server, name)
            assert _held(stray, name) == _held(server, name)
            pids = tree.top.v1.get("pids") or tree.top.v2
            assert pids is not None
            assert (pids / "mcp-demo" / "pids.max").read_text().strip() == "32"
            assert _alive(server) and _alive(stray)
    # The stray left the process group and has no tag: only the server's cgroup held it.
    assert not _alive(server) and not _alive(stray)
    assert not any((f / "mcp-demo").exists() for f in tree.top.folders())


async def test_a_fork_bomb_in_a_server_is_held_by_its_pids_limit_and_said(
    tmp_path: Path,
) -> None:
    need_cgroups("pids")
    entry = stdio_entry(limits=LIMITS)
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path,
            replies=[call("mcp__demo__bomb"), {"text": "done"}],
            config=mcp_config({"demo": entry}),
        ) as h:
            [result] = of_type(await h.turn("s1", "bomb"), "tool_result")
    assert not result["ok"]
    assert "process limit 32 reached (a fork or thread was refused)" in result["error"]
    forked = int(re.findall(r"forked (\d+) times", result["output"])[0])
    assert 0 < forked < LIMITS["pids"], result


async def test_a_dead_daemons_server_and_its_strays_die_at_the_clean_up(
    tmp_path: Path, escaped: Path
) -> None:
    need_cgroups()
    me = os.getpid()
    digest = tag_owner(tmp_path / "data").split(".")[0]
    dead = f"{digest}.{me}.{(start_time(me) or 0) + 1}"  # our pid, as if reused
    entry = stdio_entry(env={"DEMO_ESCAPE": escaped})
    config = McpServerConfig(command=entry["command"], args=tuple(entry["args"]), env=entry["env"])
    actor = McpConnection("demo", config, cgroup_owner=dead)
    try:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                await nursery.start(actor.run)
                await actor.until("ready")
                server, stray = _written(escaped)
                # As a successor would at its start: the dead daemon's tree is emptied.
                await cgroups.clear_stale(digest)  # returns once what it killed died
                assert not _alive(server) and not _alive(stray)
                nursery.cancel_scope.cancel()
    finally:
        tree = cgroups._TREES.pop(dead, None)
        if tree is not None:
            with trio.CancelScope(shield=True):
                await tree.close()
