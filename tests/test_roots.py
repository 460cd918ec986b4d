"""Held roots (tools/roots.py): a folder walked once without following a symlink, checked
through its fd, verified before each use; a sandbox binds the fd, so a swap after the
check leads nowhere; a run's fds are closed when its turn ends.

Real folders under tmp_path, the real bwrap for the sandbox test; each I/O test has an
absolute time limit.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
import trio
from rewind_kit import calls, run, say, write

from navi_trio.errors import RootChangedError
from navi_trio.testing import open_harness
from navi_trio.tools.procs import run_command
from navi_trio.tools.roots import CWD, Root, RunRoots
from navi_trio.tools.runas import run_as
from navi_trio.tools.sandbox import SandboxSpec, bwrap_argv, find_bwrap, sandbox_available

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 60
OK, REASON = sandbox_available()
needs_sandbox = pytest.mark.skipif(not OK, reason=f"the sandbox is unavailable: {REASON}")


def held_in(folder: Path) -> list[str]:
    """This process's open fds that name `folder` or anything below it."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == str(folder) or target.startswith(f"{folder}/"):
            found.append(target)
    return found


def test_a_root_is_walked_without_following_a_symlink_anywhere(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "to-etc").symlink_to("/etc")
    with Root.open(tmp_path / "real" / "sub", CWD) as root:
        assert os.readlink(f"/proc/self/fd/{root.fd}") == str(tmp_path / "real" / "sub")
    for path, where in [
        (tmp_path / "link" / "sub", tmp_path / "link"),  # a link on the way
        (tmp_path / "real" / "to-etc", tmp_path / "real" / "to-etc"),  # the last part
    ]:
        with pytest.raises(RootChangedError) as info:
            Root.open(path, CWD)
        assert f"{path} cannot be used: {where} is a symlink now" in str(info.value)
    with pytest.raises(RootChangedError, match="does not exist"):
        Root.open(tmp_path / "missing", CWD)
    made = Root.open(tmp_path / "new" / "deeper", CWD, create=True)
    made.close()
    assert (tmp_path / "new" / "deeper").is_dir()


def test_verify_names_a_root_moved_swapped_or_deleted(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    root = Root.open(folder, CWD)
    copy = root.dup()
    try:
        assert root.verify() is root
        folder.rename(tmp_path / "moved")
        folder.symlink_to(tmp_path / "elsewhere")
        with pytest.raises(RootChangedError) as info:
            root.verify()
        assert f"{folder} is not the folder that was checked any more" in str(info.value)
        assert f"that folder is now {tmp_path / 'moved'}" in str(info.value)
        (tmp_path / "moved").rmdir()
        with pytest.raises(RootChangedError, match=f"{folder} was deleted after it was checked"):
            copy.verify()
    finally:
        root.close()
        copy.close()
    assert root.closed and held_in(tmp_path) == []


def test_roots_that_could_not_be_held_fail_every_use_with_the_reason(tmp_path: Path) -> None:
    roots = RunRoots.open(tmp_path / "data" / "sessions" / "s1", tmp_path / "gone")
    assert roots.session is None and f"{tmp_path / 'gone'} does not exist" in str(roots.error)
    with pytest.raises(RootChangedError):
        roots.all()
    roots.dup().close()
    roots.close()


@needs_sandbox
async def test_a_folder_swapped_after_the_sandbox_was_built_is_still_the_one_bound(
    tmp_path: Path,
) -> None:
    """The bind is of the held fd: a symlink put in the folder's place between the
    check and bwrap's mount sends no write anywhere else."""
    work, victim = tmp_path / "work", tmp_path / "victim"
    work.mkdir()
    victim.mkdir()
    with Root.open(work, CWD) as root, ExitStack() as stack, trio.fail_after(TIMEOUT):
        found = find_bwrap()
        assert found is not None
        cmd = bwrap_argv(
            found, SandboxSpec(writable=(work,)), ["sh", "-c", "echo in > f.txt; pwd"],
            root, roots=(root,), stack=stack,
        )  # fmt: skip
        assert not any(a in ("--bind", "--ro-bind") and b == str(work)
                       for a, b in zip(cmd.argv, cmd.argv[1:], strict=False))  # fmt: skip
        work.rename(tmp_path / "moved")
        work.symlink_to(victim)
        done = await trio.run_process(
            cmd.argv, cwd="/", pass_fds=cmd.fds, capture_stdout=True, check=False
        )
    assert done.returncode == 0 and done.stdout.decode().strip() == str(work)
    assert (tmp_path / "moved" / "f.txt").read_text() == "in\n"
    assert list(victim.iterdir()) == []


async def test_an_unsandboxed_command_starts_in_its_held_folder(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with Root.open(work, CWD) as root, trio.fail_after(TIMEOUT):
        work.rename(tmp_path / "moved")
        work.symlink_to("/etc")
        done = await run_command("pwd -P; echo x > made.txt", cwd=root, time_limit=TIMEOUT)
    assert done.output.splitlines()[0] == str(tmp_path / "moved")
    assert (tmp_path / "moved" / "made.txt").exists()


async def test_a_runs_folders_are_closed_when_its_turn_ends(tmp_path: Path) -> None:
    work = (tmp_path / "work").resolve()
    work.mkdir()
    replies = []
    for i in range(3):
        replies += [calls(write(f"f{i}.txt", "x"), run(f"echo {i} > t{i}.txt")), say(f"{i}")]
    rules = [{"tool": "terminal", "decision": "allow"}]
    profiles = {"general": {"planning_first_message": False, "policy": {"rules": rules}}}
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=profiles) as h:
            folder = h.runtime.settings.session_dir("s-held")
            for i in range(3):
                frames = await h.turn("s-held", f"turn {i}", cwd=work, user_role="admin",
                                      mode="full")  # fmt: skip
                results = [f for f in frames if f["type"] == "tool_result"]
                assert [r["ok"] for r in results] == [True, True], results
                actor = h.runtime.sessions.actor("s-held")
                assert actor is not None
                await actor.idle.wait()
                assert held_in(work) == [] and held_in(folder) == []
    assert sorted(p.name for p in work.iterdir()) == [
        "f0.txt", "f1.txt", "f2.txt", "t0.txt", "t1.txt", "t2.txt",
    ]  # fmt: skip


@needs_sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="only a daemon running as root drops")
async def test_a_folder_under_one_the_tool_user_cannot_pass_is_still_reached(
    tmp_path: Path,
) -> None:
    """/root/proj under a /root of mode 0700: the command, as nobody, gets its folder
    (and navi's Python) through an empty folder over the closed one, which hides only
    what it could not reach anyway."""
    closed = tmp_path / "closed"
    work = closed / "work"
    work.mkdir(parents=True)
    closed.chmod(0o700)
    work.chmod(0o777)
    (closed / "private.txt").write_text("root's")
    with Root.open(work, CWD) as root, ExitStack() as stack, trio.fail_after(TIMEOUT):
        found = find_bwrap()
        assert found is not None
        user = run_as("")
        assert user is not None
        cmd = bwrap_argv(
            found, SandboxSpec(writable=(work,)),
            ["sh", "-c", f"id -u; echo in > f.txt; ls -A {closed}; {sys.executable} -c 'print(7)'"],
            root, roots=(root,), stack=stack, user=user,
        )  # fmt: skip
        done = await trio.run_process(
            cmd.argv, cwd="/", pass_fds=cmd.fds, capture_stdout=True, check=False
        )
    assert done.returncode == 0, done
    assert done.stdout.decode().split() == ["65534", "work", "7"]
    assert (work / "f.txt").stat().st_uid == 65534
