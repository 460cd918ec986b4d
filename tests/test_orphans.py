"""What a dead daemon left running is killed when a daemon starts on its data folder
(issue 17: a ``full``-mode command outlived a SIGKILL of the daemon).

Rules: real processes; the daemon test runs a real `navi serve` (tests/test_api_daemon.py
has the helpers) with the fake LLM in its own process; a process is known to be up by
a FIFO it writes to and its death is awaited through a pidfd (no sleeps, no polling);
every test has an absolute deadline; whatever is still alive at the end is killed.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import call
from kvfake import PidWatch, is_gone
from test_api_daemon import client, serve
from test_cli import fake_llm
from test_sandbox import SLEEPER, named_sleeper, tagged_pids, tags  # noqa: F401  (tags is a fixture)

from navi_trio.tools.procs import TAG_VAR, data_digest, kill_orphans, new_tag, tag_owner
from navi_trio.tools.proctree import start_time

DEADLINE = 60


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def wait_up(fifo: Path) -> None:
    def read() -> str:
        with open(fifo, encoding="utf-8") as f:
            return f.read()

    assert (await trio.to_thread.run_sync(read, abandon_on_cancel=True)).strip() == "up"


@asynccontextmanager
async def approved_run(
    env: dict[str, str], cwd: Path, command: str, fifo: Path
) -> AsyncIterator[tuple[Any, str]]:
    """A real daemon (and its fake LLM's URL) that runs `command` in ``full`` mode from
    `cwd`, approved, until it reports on `fifo` that it is up."""
    replies = [call("terminal", action="run", command=command), {"text": "done"}]
    async with fake_llm(cwd, replies) as llm:
        async with serve(env, llm) as proc, client(proc.url, Path(env["NAVI_DATA_DIR"])) as c:
            created = await c.request(
                {"type": "message", "content": "go", "mode": "full", "cwd": str(cwd)}
            )
            sid = created["session_id"]
            ask = await c.until_type("approval_request", session_id=sid)
            await c.send(
                {"type": "approve", "session_id": sid, "call_id": ask["call_id"], "scope": "once"}
            )
            await wait_up(fifo)
            yield proc, llm


async def sleeper(marker: str, fifo: Path, owner: str) -> trio.Process:
    """A tagged ``sleep`` (argv[0] `marker`) in its own session, as a tool starts it."""
    proc = await trio.lowlevel.open_process(
        ["bash", "-c", f"echo up > {fifo}; exec -a {marker} sleep 300"],
        env={**os.environ, TAG_VAR: new_tag(owner)},
        start_new_session=True,
    )
    await wait_up(fifo)
    return proc


@pytest.mark.slow
async def test_only_a_dead_daemons_processes_on_the_same_data_folder_are_killed(
    tmp_path: Path,
    tags: list[str],  # noqa: F811
) -> None:
    data, other = tmp_path / "data", tmp_path / "other"
    me = os.getpid()
    dead = f"{data_digest(data)}.{me}.{(start_time(me) or 0) + 1}"  # our pid, reused
    cases = {
        "dead-owner": dead,
        "live-owner": tag_owner(data),  # this process: alive
        "other-folder": f"{data_digest(other)}.{me}.1",  # dead, but another data folder
        "no-owner": "",  # an MCP server's child or an older tag
    }
    procs = {}
    with trio.fail_after(DEADLINE):
        for name, owner in cases.items():
            marker = f"navi-orphan-{name}-{secrets.token_hex(4)}"
            tags.append(marker)
            fifo = tmp_path / f"{name}.fifo"
            os.mkfifo(fifo)
            procs[name] = await sleeper(marker, fifo, owner)
        killed = await kill_orphans(data)
        assert killed == [procs["dead-owner"].pid]
        await procs["dead-owner"].wait()
        assert procs["dead-owner"].returncode == -signal.SIGKILL
    for name in ("live-owner", "other-folder", "no-owner"):
        assert procs[name].returncode is None and not is_gone(procs[name].pid), name
        procs[name].kill()


@pytest.mark.slow
async def test_a_full_mode_command_left_by_a_sigkilled_daemon_dies_at_the_restart(
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
    tags: list[str],  # noqa: F811
) -> None:
    marker, fifo, named = named_sleeper(tmp_path, tags, "full-stray")
    # The named process itself says it is up: bash waits for it, both left behind.
    command = f"{named} & wait"
    with trio.fail_after(DEADLINE):
        async with approved_run(env, tmp_path, command, fifo) as (proc, llm):
            [sleep] = tagged_pids(marker)
            bash = parent(sleep)
            watch = PidWatch([sleep, bash])
            proc.kill()  # SIGKILL: no clean-up of any kind
            await proc.wait()
            try:
                # Unsandboxed, nothing took them down with the daemon.
                assert not is_gone(sleep) and not is_gone(bash)
                async with serve(env, llm) as again:
                    await watch.wait_exited()  # killed before the daemon listens
                    err = await again.stderr.receive_some(1 << 16)
                    assert b"a previous daemon on" in err, err
            finally:
                watch.close()


def test_the_tag_names_its_owner() -> None:
    data = Path("/some/data")
    owner = tag_owner(data)
    digest, pid, started = owner.split(".")
    assert digest == data_digest(data) and int(pid) == os.getpid()
    assert int(started) == start_time(os.getpid())
    assert new_tag(owner).startswith(owner + ":") and new_tag(owner) != new_tag(owner)
