"""Whether the tool user can start a program where it lies (tools/runas.py `closed_to`),
and the one clear error an MCP server's start gives when it cannot (tools/sandbox.py).

A root daemon starts its MCP servers as the tool user (nobody). A program under a
folder closed to that user (a home of mode 0700, pyenv's interpreter under /root) would
only fail inside the child, "Permission denied" in its stderr; navi says which folder
and what to do before it starts anything. What the sandbox binds (navi's own Python) is
reachable whatever lies above it. Only the last test starts processes (a root daemon's
runtime); the others name a missing bwrap.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
import trio
from kvfake import make_ctx
from test_mcp_client import DEMO, unavailable_warning

from navi_trio.errors import ConfigError, ToolInputError
from navi_trio.tools.code_exec import CodeExecTool
from navi_trio.tools.runas import NOBODY, RunAs, closed_to
from navi_trio.tools.sandbox import dropped_argv, sandboxed_argv

TIMEOUT = 10
TOOL_USER = RunAs(NOBODY, NOBODY, "nobody")


@pytest.fixture
def closed(tmp_path: Path) -> Path:
    """A folder of mode 0700 that is not the tool user's, with an executable in it."""
    if os.geteuid() == NOBODY:
        pytest.skip("the tool user owns what it makes here")
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    home.chmod(0o700)
    program = home / "bin" / "server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    return home


def test_a_folder_closed_to_the_tool_user_is_named(closed: Path) -> None:
    why = closed_to(str(closed / "bin" / "server"), TOOL_USER)
    assert why == f"{closed} is closed to it (mode 0700, owner uid {os.geteuid()})"


def test_a_link_into_a_closed_folder_is_followed(closed: Path, tmp_path: Path) -> None:
    link = tmp_path / "server"
    link.symlink_to(closed / "bin" / "server")
    assert closed_to(str(link), TOOL_USER) == closed_to(str(closed / "bin" / "server"), TOOL_USER)


def test_what_the_sandbox_binds_is_reachable_whatever_lies_above(closed: Path) -> None:
    assert closed_to(str(closed / "bin" / "server"), TOOL_USER, [str(closed / "bin")]) is None


def test_a_program_it_may_not_execute_is_named(tmp_path: Path) -> None:
    program = tmp_path / "server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o744)
    assert closed_to(str(program), TOOL_USER) == (
        f"{program} is not executable by it (mode 0744, owner uid {os.geteuid()})"
    )


def test_navis_python_and_the_system_tools_are_reachable() -> None:
    shown = [sys.prefix, sys.base_prefix]
    assert closed_to(sys.executable, TOOL_USER, shown) is None
    assert closed_to("/bin/sh", TOOL_USER) is None


async def test_an_mcp_server_in_a_closed_folder_is_refused_saying_where_and_what_to_do(
    closed: Path, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT), pytest.raises(ConfigError) as caught:
        await dropped_argv(TOOL_USER, "server", [], tmp_path / "no-bwrap", path=str(closed / "bin"))
    said = str(caught.value)
    assert said.startswith("server cannot be started as the tool user nobody (uid 65534): ")
    assert f"{closed} is closed to it (mode 0700" in said
    assert "NAVI_TOOL_USER" in said
    assert f"bwrap at {tmp_path / 'no-bwrap'} is missing" in said


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="only a daemon running as root drops")
async def test_a_root_daemons_mcp_server_in_a_closed_folder_is_reported_and_the_run_goes_on(
    closed: Path, tmp_path: Path
) -> None:
    python = closed / "bin" / "python"
    python.symlink_to(sys.executable)
    said = await unavailable_warning(
        tmp_path, {"hidden": {"command": str(python), "args": [str(DEMO)]}}
    )
    assert "MCP server hidden" in said
    assert f"{closed} is closed to it (mode 0700" in said


async def test_an_mcp_servers_script_in_a_closed_folder_is_refused_saying_where(
    closed: Path, tmp_path: Path
) -> None:
    script = str(closed / "bin" / "server")
    with trio.fail_after(TIMEOUT), pytest.raises(ConfigError) as caught:
        await dropped_argv(TOOL_USER, "sh", ["-e", script, "/"], tmp_path / "no-bwrap")
    said = str(caught.value)
    assert said.startswith(f"sh {script} cannot be started as the tool user nobody (uid 65534)")
    assert f"{closed} is closed to it (mode 0700" in said


async def test_a_full_mode_program_in_a_closed_folder_without_bwrap_is_refused_saying_where(
    closed: Path, tmp_path: Path
) -> None:
    program = str(closed / "bin" / "server")
    with trio.fail_after(TIMEOUT), ExitStack() as stack, pytest.raises(ToolInputError) as caught:
        await sandboxed_argv(
            None, [program, "-v"], tmp_path, tmp_path / "no-bwrap", stack=stack, user=TOOL_USER
        )
    said = str(caught.value)
    assert said.startswith(f"{program} cannot be started as the tool user nobody (uid 65534): ")
    assert f"{closed} is closed to it (mode 0700" in said
    assert f"bwrap at {tmp_path / 'no-bwrap'} is missing" in said


@pytest.mark.slow  # before the check, the denied interpreter was started
@pytest.mark.skipif(os.geteuid() != 0, reason="only a daemon running as root drops")
async def test_a_root_daemons_code_exec_without_bwrap_names_a_python_the_tool_user_cannot_reach(
    closed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = closed / "bin" / "python"
    python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(python))
    ctx = make_ctx(tmp_path, bwrap_path=tmp_path / "no-bwrap")  # full mode: no sandbox
    with trio.fail_after(TIMEOUT):
        result = await CodeExecTool().execute({"code": "print(1)"}, ctx)
    assert not result.ok
    assert result.error is not None and f"{closed} is closed to it (mode 0700" in result.error
    assert "NAVI_TOOL_USER" in result.error
