"""navi's own Python, wherever it lives, starts the tool user's processes (a root daemon).

A venv under /tmp (a checkout cloned there) is hidden by the sandbox's private /tmp, and
the interpreter its ``python`` links to may lie under a ``/root`` of mode 0700 (pyenv):
the sandbox shows both, so the probe that decides whether the sandbox works, and the
MCP server started through the drop, run as the tool user. Here a venv of navi's
interpreter is made under the test's folder in /tmp and stands in for navi's own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import trio

from navi_trio.tools import sandbox
from navi_trio.tools.private import within
from navi_trio.tools.runas import NOBODY, parse

pytestmark = [
    pytest.mark.slow,  # bwrap and the interpreter run
    pytest.mark.skipif(os.geteuid() != 0, reason="only a daemon running as root drops"),
    pytest.mark.skipif(not sandbox.sandbox_available()[0], reason="no sandbox here"),
]
TIMEOUT = 60  # real seconds, for one interpreter's start on a busy machine


@pytest.fixture(params=["open", "closed"])
def venv_in_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Path]:
    """A venv under /tmp whose ``python`` links to navi's interpreter, made navi's own
    (`sys.executable` and the folders the sandbox shows of it); its ``python``. Its
    folder open to others, or in one closed to them (a clone in a ``mktemp -d``)."""
    real = Path(os.path.realpath(sys.executable))
    venv = tmp_path / "above" / "venv"
    (venv / "bin").mkdir(parents=True)
    if request.param == "closed":
        venv.parent.chmod(0o700)
    (venv / "bin" / "python").symlink_to(real)
    (venv / "pyvenv.cfg").write_text(
        f"home = {real.parent}\ninclude-system-site-packages = false\n"
    )
    python = venv / "bin" / "python"
    assert within(python, sandbox.PRIVATE_TMP)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setattr(sandbox, "_PYTHON", (venv, venv, Path(sys.base_prefix)))
    # The probe's answers are cached: those made with navi's real Python are not this one's.
    sandbox._probe.cache_clear()
    try:
        yield python
    finally:
        sandbox._probe.cache_clear()


def test_the_probe_runs_navis_python_from_a_venv_under_tmp(venv_in_tmp: Path) -> None:
    ok, reason = sandbox.sandbox_available(None, parse(str(NOBODY)))
    assert ok, reason


def test_a_probe_that_cannot_start_navis_python_says_so(
    venv_in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox, "_PYTHON", (Path(sys.base_prefix),))  # the venv not shown
    ok, reason = sandbox.sandbox_available(None, parse(str(NOBODY)))
    assert not ok
    assert f"navi's Python ({venv_in_tmp}) cannot start in it as nobody" in reason
    assert "user namespaces" not in reason


async def test_an_mcp_server_of_navis_python_under_tmp_starts_as_the_tool_user(
    venv_in_tmp: Path,
) -> None:
    code = "import os; print(os.getuid())"
    with trio.fail_after(TIMEOUT):
        argv = await sandbox.dropped_argv(parse(str(NOBODY)), str(venv_in_tmp), ["-I", "-c", code])
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout.split() == [str(NOBODY).encode()]


async def test_a_full_mode_command_of_navis_python_under_tmp_runs_as_the_tool_user(
    venv_in_tmp: Path, tmp_path: Path
) -> None:
    user = parse(str(NOBODY))
    bwrap = sandbox.find_bwrap()
    assert bwrap is not None
    argv = [str(venv_in_tmp), "-I", "-c", "import os; print(os.getuid())"]
    with ExitStack() as stack, trio.fail_after(TIMEOUT):
        cmd = sandbox.unconfined_argv(bwrap, argv, tmp_path, stack=stack, user=user)
        done = await trio.run_process(
            cmd.argv, cwd="/", pass_fds=cmd.fds, capture_stdout=True, capture_stderr=True,
            check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout.split() == [str(NOBODY).encode()]
