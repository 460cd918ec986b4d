"""Tool processes never run as root (tools/runas.py): a daemon running as root runs them
as NAVI_TOOL_USER, else nobody.

Through a real ``navi serve`` (tests/served.py, forked: users written to its database,
the daemon a root process forked from the warm fork server; the fake LLM scripted for
each step) on this machine, which runs as root: what a terminal
command, a persistent process, code_exec, a full-mode command and an MCP server started
for a session see of their own ids, and what the host sees (the owner of what they
make, a root-only file they cannot read). A uid mapping in a user namespace alone would
fail here: its "nobody" inside is root outside, owns what it makes as root and reads
root's 0600 files. Also what the filesystem tool makes belongs to the folder's owner, a
setting naming root stops the daemon, and the doctor warns.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from rewind_kit import call, calls, run, say, write
from served import results, send, served

from navi_trio.cli.doctor import collect_doctor, print_doctor
from navi_trio.core.turn.policy import sandbox_for
from navi_trio.errors import ConfigError
from navi_trio.settings import Settings
from navi_trio.tools.procs import run_command
from navi_trio.tools.runas import NOBODY, RunAs, parse
from navi_trio.tools.sandbox import sandbox_available

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only a daemon running as root drops")
TIMEOUT = 180  # real seconds: two Python processes start on 2 busy cores
DEMO = Path(__file__).parent / "mcp_servers" / "demo.py"
needs_sandbox = pytest.mark.skipif(not sandbox_available()[0], reason="no sandbox here")


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder outside /tmp, open to others, with a root-only secret in it."""
    folder = Path(tempfile.mkdtemp(prefix="navi-uid-", dir="/var/tmp")).resolve()
    folder.chmod(0o755)
    (folder / "secret.txt").write_text("ROOT-ONLY")
    (folder / "secret.txt").chmod(0o600)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def with_demo_mcp(data: dict[str, Any]) -> None:
    data["mcp_servers"] = {"demo": {"command": sys.executable, "args": [str(DEMO)]}}
    general = data["profiles"]["general"]
    general["mcp_servers"] = ["demo"]
    rules = general.setdefault("policy", {}).setdefault("rules", [])
    rules.insert(0, {"tool": "mcp__demo__*", "decision": "allow"})
    rules.insert(0, {"tool": "terminal", "decision": "allow"})


def ids_of(output: str) -> list[str]:
    return [line.split(":")[0] for line in output.splitlines() if line.startswith("ids ")]


@pytest.mark.slow
@needs_sandbox
async def test_a_root_daemons_tool_processes_never_run_as_root(base: Path) -> None:
    secret = base / "secret.txt"
    # One line, so that a read of an open process gets all of it at once.
    probe = f'echo made > mine.txt; echo "ids $(id -u) $(id -g): $(cat {secret} 2>&1)"'
    python = "import os; print('ids', os.getuid(), os.getgid()); open('py.txt', 'w')"
    async with served(base, edit=with_demo_mcp, admins=("root",), forked=True) as s:
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice, s.connect("root") as admin:
                s.fake.add_replies(
                    calls(run(probe)),
                    calls(call("code_exec", code=python)),
                    calls(call("terminal", action="open", command=probe)),
                    calls(call("terminal", action="read", handle="p1", wait=20)),
                    calls(call("mcp__demo__whoami", path=str(secret))),
                    calls(write("fs.txt", "x"), call("filesystem", action="mkdir", path="d")),
                    say("done"),
                )
                sid = str((await send(alice, "who am I"))["session_id"])
                await alice.until_end(sid)
                listing = f"ls {s.data_dir / 'sessions'}; ls -d $HOME"
                s.fake.add_replies(calls(run(probe)), calls(run(listing)), say("done"))
                full = str((await send(admin, "and in full mode", mode="full",
                                       cwd=str(base)))["session_id"])  # fmt: skip
                await admin.until_end(full)
    folder = s.session_dir(sid)
    command, code, _, opened, mcp, *_ = results(alice, sid)
    unconfined, listed = results(admin, full)
    # The session folders: all nobody's, and closed to nobody but through its own.
    assert (s.data_dir / "sessions").stat().st_mode & 0o777 == 0o700
    own = str(s.session_dir(full))
    assert listed["output"].split()[:2] == [full, own] and sid not in listed["output"], listed
    nobody = f"ids {NOBODY} {NOBODY}"
    for result in (command, opened, unconfined):
        assert ids_of(result["output"]) == [nobody], result
        assert "ROOT-ONLY" not in result["output"] and "Permission denied" in result["output"]
    assert ids_of(code["output"]) == [nobody], code
    assert json.loads(mcp["output"]) == {"uid": NOBODY, "gid": NOBODY, "read": "Permission denied"}
    # What the host sees: everything they made is nobody's, nothing root's.
    for made in (folder / "mine.txt", folder / "py.txt"):
        assert (made.stat().st_uid, made.stat().st_gid) == (NOBODY, NOBODY), made
    assert not (base / "mine.txt").exists()  # full mode, in root's own folder: refused
    # The session folder is theirs; what the filesystem tool made there too.
    for made in (folder, folder / "fs.txt", folder / "d"):
        assert (made.stat().st_uid, made.stat().st_gid) == (NOBODY, NOBODY), made


PROBE = "id -G; grep -E '^(Cap(Prm|Eff|Amb)|NoNewPrivs):' /proc/self/status"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["sandboxed", "without-bwrap"])
async def test_a_tool_process_keeps_no_group_and_no_capability_of_roots(
    base: Path, where: str
) -> None:
    # Root's supplementary groups (gid 0) and capabilities stay with the daemon: the
    # command, in the sandbox or started without bwrap, has only the tool user's group
    # and no capability. (bwrap as root leaves its command every capability until the
    # drop; the drop's setuid empties these sets, and in the sandbox no_new_privs keeps
    # an exec from gaining any from the inheritable set, which a setuid leaves full.)
    if where == "sandboxed" and not sandbox_available()[0]:
        pytest.skip("no sandbox here")
    spec = sandbox_for("read-only", base, None) if where == "sandboxed" else None
    no_bwrap = base / "no-bwrap" if where == "without-bwrap" else None
    groups_before = os.getgroups()
    os.setgroups([0])  # this process, as a daemon of root's often is: in group root
    try:
        with trio.fail_after(TIMEOUT):
            done = await run_command(
                PROBE,
                cwd=base,
                time_limit=TIMEOUT,
                sandbox=spec,
                bwrap_path=no_bwrap,
                user=RunAs(NOBODY, NOBODY, "nobody"),
            )
    finally:
        os.setgroups(groups_before)
    groups, *lines = done.output.splitlines()
    assert groups.split() == [str(NOBODY)], done.output
    caps = {name: int(value, 16) for name, value in (line.split(":") for line in lines)}
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapAmb"] == 0, done.output
    if where == "sandboxed":
        assert caps["NoNewPrivs"] == 1, done.output


@pytest.mark.slow
@needs_sandbox
async def test_navi_tool_user_names_whom_they_run_as(base: Path) -> None:
    async with served(base, env={"NAVI_TOOL_USER": "4242:4343"}, forked=True) as s:
        with trio.fail_after(TIMEOUT):
            async with s.connect("alice") as alice:
                s.fake.add_replies(calls(run('echo "ids $(id -u) $(id -g)"')), say("done"))
                sid = str((await send(alice, "who am I"))["session_id"])
                await alice.until_end(sid)
    (result,) = results(alice, sid)
    assert ids_of(result["output"]) == ["ids 4242 4343"], result
    st = s.session_dir(sid).stat()
    assert (st.st_uid, st.st_gid) == (4242, 4343)


def test_a_tool_user_is_never_root() -> None:
    for value in ("root", "0", "0:0", "00:5"):
        with pytest.raises(ConfigError, match="never run as root"):
            Settings.from_env({"NAVI_TOOL_USER": value})
    with pytest.raises(ConfigError, match="never run as root"):
        parse("4242:0")
    with pytest.raises(ConfigError, match="no such user"):
        parse("no-such-user-here")
    assert parse("nobody").uid == NOBODY and parse("4242:4343").gid == 4343


async def test_the_doctor_warns_when_navi_runs_as_root(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings.from_env(
        {}, db_path=tmp_path / "navi.db", data_dir=tmp_path, llm_url=f"http://127.0.0.1:{port}"
    )
    with trio.fail_after(60):
        report = await collect_doctor(settings, f"ws://127.0.0.1:{port}")
    assert report["tool_user"]["root"] is True
    assert any("navi runs as root" in w and "nobody" in w for w in report["warnings"])
    out = io.StringIO()
    print_doctor(report, out)
    assert f"tools as     nobody (uid {NOBODY}, gid {NOBODY})" in out.getvalue()
