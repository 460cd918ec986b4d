"""A real `navi serve` SIGKILLed while a session's command runs: at the restart, what
its cgroups hold dies, also a double-forked setsid daemon without its tag (which the
/proc scan of `procs.kill_orphans` cannot find), and the old cgroups are gone. The same
for what a stdio MCP server of the daemon started out of its process group.

Rules as tests/test_orphans.py: a real daemon with the fake LLM in its own process; a
process is known to be up by a FIFO it writes to, its death awaited through a pidfd;
an absolute deadline; whatever is still alive at the end is killed. Skipped, with the
reason, where cgroups cannot be written.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import trio
from kvfake import PidWatch, is_gone
from test_api_daemon import client, serve
from test_cgroups import need_cgroups
from test_cli import fake_llm
from test_mcp_client import _alive, _config_dir, call, stdio_entry, with_servers
from test_orphans import approved_run
from test_sandbox import named_sleeper, tagged_pids, tags  # noqa: F401  (tags is a fixture)

from navi_trio.tools.cgroups import tree_name
from navi_trio.tools.procs import data_digest

pytestmark = pytest.mark.slow
DEADLINE = 60


async def test_no_process_of_a_sigkilled_daemons_session_survives_the_restart(
    env: dict[str, str],
    tmp_path: Path,
    tags: list[str],  # noqa: F811
) -> None:
    need_cgroups()
    data = Path(env["NAVI_DATA_DIR"])
    marker, fifo, named = named_sleeper(tmp_path, tags, "cg-daemon-stray")
    # Leaves the session, drops its tag, loses its parent: only its cgroup holds it.
    command = f"(setsid env -i bash -c '{named}' >/dev/null 2>&1 &); exec sleep 300"
    with trio.fail_after(DEADLINE):
        async with approved_run(env, tmp_path, command, fifo) as (proc, llm):
            [stray] = tagged_pids(marker)
            watch = PidWatch([stray])
            old = tree_name(f"{data_digest(data)}.{proc.pid}")
            proc.kill()  # SIGKILL: no clean-up of any kind
            await proc.wait()
            try:
                assert not is_gone(stray)
                held = await trio.Path(f"/proc/{stray}/cgroup").read_text()
                assert old in held, held  # in the dead daemon's tree
                async with serve(env, llm) as again:
                    await watch.wait_exited()  # killed before the daemon listens
                    assert not _trees(old)
                    again.send_signal(signal.SIGTERM)  # its own tree removed as it stops
                    await again.wait()
            finally:
                watch.close()


def _trees(prefix: str) -> list[Path]:
    """The cgroup folders whose name starts with `prefix`, in every hierarchy."""
    found = []
    for top in Path("/sys/fs/cgroup").rglob("navi-*"):
        if top.name.startswith(prefix):
            found.append(top)
    return found


async def test_what_a_sigkilled_daemons_mcp_server_started_dies_at_the_restart(
    env: dict[str, str], tmp_path: Path
) -> None:
    need_cgroups()
    data = Path(env["NAVI_DATA_DIR"])
    escaped = tmp_path / "escaped"
    path = _config_dir(tmp_path, {})
    config = with_servers(json.loads(path.read_text()), {"demo": stdio_entry(
        env={"DEMO_ESCAPE": escaped})})  # fmt: skip
    path.write_text(json.dumps(config))
    env = {**env, "NAVI_CONFIG": str(path)}
    replies = [call("mcp__demo__echo", text="hi"), {"text": "done"}]
    stray = 0
    try:
        with trio.fail_after(DEADLINE):
            async with fake_llm(tmp_path, replies) as llm:
                async with serve(env, llm) as proc:
                    async with client(proc.url, data) as c:
                        created = await c.request({"type": "message", "content": "echo"})
                        await c.until_end(created["session_id"])
                    server, stray = map(int, escaped.read_text().split())
                    watch = PidWatch([stray])
                    old = tree_name(f"{data_digest(data)}.{proc.pid}")
                    proc.kill()  # SIGKILL: no clean-up of any kind
                    await proc.wait()
                try:
                    # The server may end with its stdin; its stray, out of its process
                    # group and without its tag, would live on but for the cgroup.
                    assert _alive(stray)
                    held = await trio.Path(f"/proc/{stray}/cgroup").read_text()
                    assert any(old in ln and "/mcp-demo/cmd-" in ln for ln in held.splitlines())
                    async with serve(env, llm) as again:
                        await watch.wait_exited()  # killed before the daemon listens
                        assert not _trees(old)
                        again.send_signal(signal.SIGTERM)
                        await again.wait()
                finally:
                    watch.close()
    finally:
        if stray and _alive(stray):
            os.kill(stray, signal.SIGKILL)
