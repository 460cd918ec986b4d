"""Where bwrap cannot run, sandboxed calls are refused, never run unsandboxed (issue 10).

The machine's bwrap may well work, so these tests point ``NAVI_BWRAP`` (the
`Settings.bwrap_path` override) at a bwrap that is missing, or at a stand-in script that
fails the way bwrap does without user namespaces. They need no working sandbox and are
never skipped. Each is bounded by a real `trio.fail_after`; no sleeps.
"""

from __future__ import annotations

import io
import logging
import socket
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import trio
from kvfake import make_ctx
from sandbox_args import by_path

from navi_trio.cli.doctor import collect_doctor, print_doctor
from navi_trio.testing import open_harness
from navi_trio.tools.base import ToolContext
from navi_trio.tools.code_exec import CodeExecTool
from navi_trio.tools.procs import ProcessPool
from navi_trio.tools.sandbox import SandboxSpec, bwrap_argv, sandbox_available
from navi_trio.tools.terminal import TerminalTool

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 30
NO_USERNS = (
    "bwrap: No permissions to create new namespace, likely because the kernel does not "
    "allow non-privileged user namespaces"
)


def broken_bwrap(tmp_path: Path, *, binds_fds: bool = True) -> Path:
    """A stand-in for a bwrap that cannot build a sandbox here (exit 1, bwrap's words);
    its --help lists --bind-fd and --size unless `binds_fds` is false (before 0.10)."""
    path = tmp_path / "bwrap"
    options = "--bind-fd FD DEST --size BYTES" if binds_fds else "--bind SRC DEST"
    path.write_text(
        f'#!/bin/sh\nif [ "$1" = --help ]; then echo "{options}"; exit 0; fi\n'
        f"echo '{NO_USERNS}' >&2\nexit 1\n"
    )
    path.chmod(0o755)
    return path


def test_a_bwrap_that_cannot_bind_by_fd_is_refused_saying_so(tmp_path: Path) -> None:
    ok, reason = sandbox_available(broken_bwrap(tmp_path, binds_fds=False))
    assert not ok and "--bind-fd" in reason and "bubblewrap 0.10" in reason


def refusing(tmp_path: Path, bwrap: Path, **kw: Any) -> ToolContext:
    ctx = make_ctx(tmp_path, bwrap_path=bwrap, **kw)
    return attrs.evolve(ctx, sandbox=SandboxSpec(writable=(ctx.session_dir,)))


def test_the_probe_names_a_missing_bwrap(tmp_path: Path) -> None:
    ok, reason = sandbox_available(tmp_path / "nowhere" / "bwrap")
    assert not ok and str(tmp_path / "nowhere" / "bwrap") in reason


def test_the_probe_passes_on_what_bwrap_said(tmp_path: Path) -> None:
    ok, reason = sandbox_available(broken_bwrap(tmp_path))
    assert not ok and NO_USERNS in reason and "user namespaces" in reason


@pytest.mark.parametrize("which", ["missing", "broken"])
async def test_terminal_run_is_refused_and_nothing_runs(tmp_path: Path, which: str) -> None:
    bwrap = tmp_path / "missing-bwrap" if which == "missing" else broken_bwrap(tmp_path)
    ctx = refusing(tmp_path, bwrap)
    with trio.fail_after(TIMEOUT):
        result = await TerminalTool().execute({"action": "run", "command": "touch ran.txt"}, ctx)
    assert not result.ok
    assert "must run sandboxed, but the sandbox is unavailable" in (result.error or "")
    assert not (ctx.session_dir / "ran.txt").exists()


async def test_terminal_open_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    pool = ProcessPool(grace=1.0)
    ctx = attrs.evolve(
        refusing(tmp_path, broken_bwrap(tmp_path)), services=SimpleNamespace(processes=pool)
    )
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            result = await TerminalTool().execute(
                {"action": "open", "command": "touch ran.txt; cat"}, ctx
            )
            nursery.cancel_scope.cancel()
    assert not result.ok and "the sandbox is unavailable" in (result.error or "")
    assert pool.list(ctx.session_id) == []
    assert not (ctx.session_dir / "ran.txt").exists()


async def test_code_exec_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    ctx = refusing(tmp_path, tmp_path / "missing-bwrap")
    with trio.fail_after(TIMEOUT):
        result = await CodeExecTool().execute({"code": "open('ran.txt', 'w')"}, ctx)
    assert not result.ok and "the sandbox is unavailable" in (result.error or "")
    assert not (ctx.session_dir / "ran.txt").exists()


async def test_without_a_spec_nothing_changes_even_without_bwrap(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, bwrap_path=tmp_path / "missing-bwrap")
    assert ctx.sandbox is None  # the default: unsandboxed, as before the sandbox existed
    with trio.fail_after(TIMEOUT):
        result = await TerminalTool().execute({"action": "run", "command": "echo hi"}, ctx)
    assert result.ok and "hi" in result.output


def test_a_writable_folder_inside_a_readable_one_stays_writable(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    spec = SandboxSpec(writable=(inner,), readable=(tmp_path,))
    with ExitStack() as stack:
        argv = by_path(bwrap_argv(Path("/bwrap"), spec, ["true"], inner, stack=stack).argv)
        open_spec = SandboxSpec(network=True)
        assert "--unshare-net" not in bwrap_argv(Path("/b"), open_spec, [], inner, stack=stack).argv
    binds = [(argv[i], argv[i + 1]) for i in range(len(argv)) if argv[i].endswith("bind")]
    assert binds.index(("--ro-bind", str(tmp_path))) < binds.index(("--bind", str(inner)))
    assert ("--ro-bind", str(inner)) not in binds  # the cwd, inside a writable folder
    assert "--unshare-net" in argv and "--unshare-pid" in argv


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_doctor_says_the_sandbox_is_unavailable(tmp_path: Path) -> None:
    from navi_trio.settings import Settings

    settings = Settings.from_env(
        {},
        db_path=tmp_path / "navi.db",
        data_dir=tmp_path,
        llm_url=f"http://127.0.0.1:{unused_port()}",
        bwrap_path=broken_bwrap(tmp_path),
    )
    with trio.fail_after(TIMEOUT):
        report = await collect_doctor(settings, f"ws://127.0.0.1:{unused_port()}")
    assert report["sandbox"]["ok"] is False and NO_USERNS in report["sandbox"]["reason"]
    assert any("the sandbox is unavailable" in w for w in report["warnings"])
    out = io.StringIO()
    print_doctor(report, out)
    assert "sandbox      UNAVAILABLE: " in out.getvalue()


async def test_start_up_says_the_sandbox_is_unavailable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="navi_trio.runtime")
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, scripted=True, bwrap_path=broken_bwrap(tmp_path)):
            pass
    assert any(
        "the sandbox is unavailable" in r.getMessage() and NO_USERNS in r.getMessage()
        for r in caplog.records
    ), caplog.text
