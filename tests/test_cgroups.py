"""Kernel limits per session (tools/cgroups.py): where the cgroups are, the limits in
config, and, where cgroups can be written, a fork bomb held by pids.max, a 2 GB
allocation killed with a clear result, a double-forked setsid daemon killed by a stop.

Rules: the path logic is tested on texts of /proc/self/mounts and /proc/self/cgroup;
the rest runs real processes in real cgroups with small limits (pids.max 32, 64 MiB),
each bomb bounded by itself too (at most 100 forks), every tree removed at the end
whatever happens (`limited`), and is skipped, with the reason, where cgroups cannot be
written. A process is known to be up by a FIFO it writes to, its death awaited through
a pidfd; every test has an absolute deadline.
"""

from __future__ import annotations

import os
import secrets
import select
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from kvfake import PidWatch, is_gone
from test_sandbox import named_sleeper, tagged_pids, tags  # noqa: F401  (tags is a fixture)

from navi_trio.errors import ConfigError
from navi_trio.profiles import ProcessLimits, parse_config
from navi_trio.tools import cgroups
from navi_trio.tools.procs import CommandResult, run_command, tag_owner
from navi_trio.tools.proctree import start_time
from navi_trio.tools.terminal import command_result

DEADLINE = 60
SMALL = ProcessLimits(memory_mb=64, pids=32)

HYBRID_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
HYBRID_CGROUP = """\
9:name=systemd:/
8:pids:/
6:freezer:/
4:memory:/process_api/dd63
1:cpu:/
0::/
"""


# -- Where the cgroups are ---------------------------------------------------------------


def test_a_hybrid_layout_kills_in_v2_and_limits_in_v1() -> None:
    where = cgroups.plan(HYBRID_MOUNTS, HYBRID_CGROUP)
    assert where.v2 == Path("/sys/fs/cgroup/unified")
    assert dict(where.v1) == {
        "memory": Path("/sys/fs/cgroup/memory/process_api/dd63"),
        "pids": Path("/sys/fs/cgroup/pids"),
        "cpu": Path("/sys/fs/cgroup/cpu"),
        "freezer": Path("/sys/fs/cgroup/freezer"),
    }


def test_a_pure_v2_systemd_service_uses_its_own_cgroup() -> None:
    mounts = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
    own = "0::/system.slice/navi.service\n"
    where = cgroups.plan(mounts, own)
    assert where.v2 == Path("/sys/fs/cgroup/system.slice/navi.service") and not where.v1


def test_shared_v1_hierarchies_and_odd_lines() -> None:
    mounts = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\nbroken line\n"
    own = "2:cpu,cpuacct:/user.slice\nnonsense\n3:memory:relative\n"
    assert cgroups.own_cgroups(own) == {"cpu": "/user.slice", "cpuacct": "/user.slice"}
    where = cgroups.plan(mounts, own)
    assert where.v2 is None and dict(where.v1) == {
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct/user.slice")
    }


def test_without_any_cgroup_status_says_why() -> None:
    ok, why = cgroups.status(cgroups.Plan(None, {}))
    assert not ok and "no cgroup v2 hierarchy is mounted" in why
    with pytest.raises(cgroups.CgroupsUnavailable, match="no cgroup v2"):
        cgroups.open_tree("x.1.1", cgroups.Plan(None, {}))


def test_a_read_only_v2_hierarchy_is_not_used(tmp_path: Path) -> None:
    (tmp_path / "cgroup.procs").write_text("")
    tmp_path.chmod(0o555)
    try:
        ok, why = cgroups.status(cgroups.Plan(tmp_path, {}))
    finally:
        tmp_path.chmod(0o755)
    if os.geteuid() != 0:  # root may write anyway: then the access check passes
        assert not ok and "is not writable" in why and "Delegate=yes" in why


def test_cgroup_kill_by_file_or_by_kernel_release(tmp_path: Path) -> None:
    assert cgroups.has_kill(tmp_path, "5.14.0")  # a root cgroup: the kernel decides
    assert not cgroups.has_kill(tmp_path, "5.10.200")
    (tmp_path / "cgroup.type").write_text("domain\n")  # a child without cgroup.kill
    assert not cgroups.has_kill(tmp_path, "6.1.0")
    (tmp_path / "cgroup.kill").write_text("")
    assert cgroups.has_kill(tmp_path, "4.19.0")


def test_only_a_dead_daemons_tree_of_the_same_data_folder_is_stale() -> None:
    me = os.getpid()
    live = f"navi-abc.{me}.{start_time(me)}"
    assert not cgroups.stale_owner(live, "abc")
    assert cgroups.stale_owner(f"navi-abc.{me}.{(start_time(me) or 0) + 1}", "abc")
    assert not cgroups.stale_owner(f"navi-other.{me}.1", "abc")
    assert not cgroups.stale_owner("navi-abc.x.1", "abc")
    assert not cgroups.stale_owner("navi-daemon", "abc")
    assert cgroups.tree_name(f"abc.{me}.1") == f"navi-abc.{me}.1"


def test_a_session_folder_name_is_never_a_path() -> None:
    assert cgroups.session_name("7f3a-b_c.d") == "session-7f3a-b_c.d"
    for odd in ("../../x", "..", "a/b", "", "x" * 200):
        name = cgroups.session_name(odd)
        assert "/" not in name and name.startswith("session-") and len(name) < 80


# -- The limits in config -----------------------------------------------------------------


def test_profile_limits_default_and_are_checked_strictly() -> None:
    def limits(value: object) -> ProcessLimits:
        data = {"default_profile": "a", "profiles": {"a": {"limits": value}}}
        return parse_config(data, Path("/c/config.json")).profiles["a"].limits

    assert ProcessLimits() == ProcessLimits(memory_mb=2048, pids=512, cpu_cores=None)
    assert limits({"memory_mb": 64, "pids": 32, "cpu_cores": 0.5}) == ProcessLimits(
        memory_mb=64, pids=32, cpu_cores=0.5
    )
    bad = {
        "memory_mb": (1, "memory_mb: expected a whole number from 16"),
        "pids": (0, "pids: expected a whole number from 8"),
        "cpu_cores": (0, "cpu_cores: expected a number of cores from 0.01"),
    }
    for key, (value, message) in bad.items():
        with pytest.raises(ConfigError, match=message):
            limits({key: value})
    with pytest.raises(ConfigError, match="extra fields found"):
        limits({"memory": 64})
    with pytest.raises(ConfigError, match=r"limits\.memory_mb"):
        limits({"memory_mb": True})


def test_an_mcp_command_entry_has_limits_of_its_own_and_a_url_entry_none() -> None:
    def servers(entry: dict[str, object]) -> ProcessLimits:
        data = {"default_profile": "a", "profiles": {"a": {}}, "mcp_servers": {"x": entry}}
        return parse_config(data, Path("/c/config.json")).mcp_servers["x"].limits

    assert servers({"command": "srv"}) == ProcessLimits()
    assert servers({"command": "srv", "limits": {"pids": 16}}) == ProcessLimits(pids=16)
    with pytest.raises(ConfigError, match="pids: expected a whole number from 8"):
        servers({"command": "srv", "limits": {"pids": 1}})
    with pytest.raises(ConfigError, match=r"\['x'\]\.limits: limits are for a command"):
        servers({"url": "http://127.0.0.1:1/mcp", "limits": {"pids": 16}})


def test_a_leaf_that_enters_itself_writes_its_own_pid_into_every_hierarchy() -> None:
    group = cgroups.Group(Path("/cg/v2/leaf"), {"pids": Path("/cg/pids/leaf")})
    leaf = cgroups.CommandGroup(group, None, False, "/bin/bash")
    argv = leaf.self_entry_argv(["srv", "--flag"])
    assert argv[:2] == ["/bin/bash", "-c"] and "shift 2" in argv[2]
    assert argv[3:] == [
        "navi-cgroup", "/cg/v2/leaf/cgroup.procs", "/cg/pids/leaf/cgroup.procs", "srv", "--flag"
    ]  # fmt: skip


def test_an_oom_kill_is_a_failed_result_naming_the_limit() -> None:
    killed = CommandResult(-9, "", False, 10.0, 0.1, memory_limit_mb=512)
    assert killed.status_text().startswith("memory limit 512 MB reached")
    result = command_result(killed)
    assert not result.ok and "memory limit 512 MB reached" in (result.error or "")
    # Even when the command went on and exited 0 after the kernel killed a child of it.
    survived = CommandResult(0, "ok", False, 10.0, 0.1, memory_limit_mb=64)
    assert not command_result(survived).ok


# -- Real cgroups ---------------------------------------------------------------------------


def need_cgroups(*limits: str) -> None:
    """Skip, with the reason, where cgroups (or these limits) cannot be used here."""
    ok, why = cgroups.status()
    if not ok:
        pytest.skip(f"cgroups cannot be used here: {why}")
    for name in limits:
        if name not in why.split("limits:", 1)[1]:
            pytest.skip(f"no writable {name} controller here: {why}")


@asynccontextmanager
async def limited(data: Path, *needs: str) -> AsyncIterator[cgroups.SessionCgroup]:
    """A session's cgroup with small limits (skipped where cgroups, or the limits
    `needs` names, cannot be used); the tree is emptied and removed at the end,
    whatever happens."""
    need_cgroups(*needs)
    tree = cgroups.open_tree(tag_owner(data))
    try:
        yield cgroups.SessionCgroup(tree, "test-" + secrets.token_hex(4), SMALL)
    finally:
        with trio.CancelScope(shield=True):
            await tree.close()
        assert all(not f.exists() for f in tree.top.folders())


async def wait_up(fifo: Path) -> None:
    """Until the process reports on `fifo` that it runs."""

    def read() -> str:
        with open(fifo, encoding="utf-8") as f:
            return f.read()

    assert (await trio.to_thread.run_sync(read, abandon_on_cancel=True)).strip() == "up"


async def run_script(session: cgroups.SessionCgroup, folder: Path, script: str) -> CommandResult:
    """Python running `script` as a command of `session`, for 30 s at most."""
    (folder / "script.py").write_text(script)
    argv = [sys.executable, "-I", "script.py"]
    return await run_command(argv, cwd=folder, time_limit=30, cgroup=session)


BOMB = """\
import os, sys, time
forked = 0
for _ in range(100):  # bounded, even if the containment is broken
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        break
    forked += 1
print("forked", forked, flush=True)
"""


@pytest.mark.slow
async def test_a_fork_bomb_is_held_by_pids_max(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with limited(tmp_path / "data", "pids") as session:
            result = await run_script(session, tmp_path, BOMB)
    assert result.exit_code == 0, result.output
    forked = int(result.output.split()[-1])
    # The bash that execs it and Python itself count too: fewer than 32 children.
    assert 0 < forked < SMALL.pids, result.output


ALLOC = """\
data = bytearray(2 << 30)  # 2 GiB, written (zeroed) as it is made
for i in range(0, len(data), 4096):
    data[i] = 1
print("allocated", flush=True)
"""


@pytest.mark.slow
async def test_a_2gb_allocation_is_killed_with_a_clear_result(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with limited(tmp_path / "data", "memory") as session:
            result = await run_script(session, tmp_path, ALLOC)
            # The session lives on: its next command runs.
            after = await run_command(
                "echo still here", cwd=tmp_path, time_limit=10, cgroup=session
            )
    assert "allocated" not in result.output
    assert result.memory_limit_mb == SMALL.memory_mb and result.exit_code == -9
    tool = command_result(result)
    assert not tool.ok and tool.error is not None
    assert tool.error.startswith("memory limit 64 MB reached"), tool.error
    assert after.exit_code == 0 and after.memory_limit_mb is None and "still here" in after.output


@pytest.mark.slow
async def test_a_stop_kills_a_double_forked_setsid_daemon_without_its_tag(
    tmp_path: Path,
    tags: list[str],  # noqa: F811
) -> None:
    # Leaves the session, empties its environment (no NAVI_PROC_TAG) and loses its
    # parent: the process tree and the tag cannot find it, only its cgroup holds it.
    marker, fifo, named = named_sleeper(tmp_path, tags, "cg-escaper")
    command = f"(setsid env -i bash -c '{named}' >/dev/null 2>&1 &); exec sleep 300"
    with trio.fail_after(DEADLINE):
        async with limited(tmp_path / "data") as session:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    lambda: run_command(command, cwd=tmp_path, time_limit=300, cgroup=session)
                )
                await wait_up(fifo)
                [escaper] = tagged_pids(marker)
                watch = PidWatch([escaper])
                try:
                    nursery.cancel_scope.cancel()  # the stop
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(10):
                        await watch.wait_exited()
                    watch.close()
            assert is_gone(escaper)


def dies_at_once(monkeypatch: pytest.MonkeyPatch, pid: int) -> None:
    """A write to a ``cgroup.kill`` returns once `pid` has died (left unreaped): as on a
    machine where the killed process gets a CPU before the writer reads the group again.
    Bounded: 10 s."""
    write = cgroups._write

    def then_dead(path: Path, text: str) -> None:
        write(path, text)
        if path.name == "cgroup.kill":
            fd = os.pidfd_open(pid)
            try:
                assert select.select([fd], [], [], 10)[0], f"{pid} outlived cgroup.kill"
            finally:
                os.close(fd)

    monkeypatch.setattr(cgroups, "_write", then_dead)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["as it comes", "quick"])
async def test_what_a_dead_daemons_cgroups_hold_is_killed_and_they_are_removed(
    tmp_path: Path,
    tags: list[str],  # noqa: F811
    kernel: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The processes in them are killed and said to be, also the ones that died of the
    group's kill before it was read again (`kernel` quick)."""
    need_cgroups()
    data = tmp_path / "data"
    me = os.getpid()
    digest = tag_owner(data).split(".")[0]
    dead = f"{digest}.{me}.{(start_time(me) or 0) + 1}"  # our pid, as if reused
    marker, fifo, named = named_sleeper(tmp_path, tags, "cg-stale")
    tree = cgroups.open_tree(dead)
    live = cgroups.open_tree(tag_owner(data))
    try:
        leaf = tree.command("s1", SMALL)
        with trio.fail_after(DEADLINE):
            process = await trio.lowlevel.open_process(
                ["bash", "-c", named],
                start_new_session=True,
            )
            leaf.enter(process.pid)
            await wait_up(fifo)
            if kernel == "quick":
                dies_at_once(monkeypatch, process.pid)
            killed = await cgroups.clear_stale(digest)
            assert process.pid in killed
            await process.wait()
            assert all(not f.exists() for f in tree.top.folders())
            assert all(f.exists() for f in live.top.folders())  # a live daemon's stays
    finally:
        with trio.CancelScope(shield=True):
            await tree.close()
            await live.close()


@pytest.mark.slow
async def test_doctor_says_why_cgroups_cannot_be_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import socket

    from navi_trio.cli import doctor
    from navi_trio.settings import Settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(doctor, "cgroups_status", lambda: cgroups.status(cgroups.Plan(None, {})))
    settings = Settings.from_env(
        {}, db_path=tmp_path / "navi.db", data_dir=tmp_path, llm_url=f"http://127.0.0.1:{port}"
    )
    with trio.fail_after(DEADLINE):
        report = await doctor.collect_doctor(settings, f"ws://127.0.0.1:{port}")
    assert report["cgroups"]["ok"] is False
    assert any("cgroups cannot be used (no cgroup v2" in w for w in report["warnings"])
    out = io.StringIO()
    doctor.print_doctor(report, out)
    assert "cgroups      UNAVAILABLE: no cgroup v2 hierarchy is mounted" in out.getvalue()
