"""The code_exec tool: Python in an isolated subprocess, capped, streamed, killable.

Real processes, so no autojump clock; every test bounded by a real `trio.fail_after`,
except the timeout test, on a MockClock moved by hand once the code has printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from kvfake import PidWatch, Recorder, is_gone, jump_after_line, make_ctx, pids_in

from navi_trio.tools.code_exec import CodeExecTool

pytestmark = pytest.mark.slow  # its tests start processes


async def test_runs_python_and_streams_printed_lines(tmp_path: Path) -> None:
    rec = Recorder()
    ctx = make_ctx(tmp_path, recorder=rec)
    code = "import sys\nprint(6 * 7)\nprint('isolated', sys.flags.isolated)\n"
    with trio.fail_after(20):
        result = await CodeExecTool().execute({"code": code}, ctx)
    assert result.ok, result.content()
    assert rec.lines() == ["42", "isolated 1"]
    assert result.data is not None and result.data["exit_code"] == 0


async def test_the_snippet_is_an_fd_of_its_own_and_nothing_is_written_to_disk(
    tmp_path: Path,
) -> None:
    ctx = make_ctx(tmp_path)
    code = "import os\nprint(__file__)\nprint(os.readlink(__file__))"
    with trio.fail_after(20):
        result = await CodeExecTool().execute({"code": code}, ctx)
    assert result.ok, result.content()
    script, target = result.output.splitlines()[:2]
    assert script.startswith("/proc/self/fd/") and target.startswith("/memfd:navi-snippet")
    assert sorted(p.name for p in ctx.session_dir.iterdir()) == []


async def test_runs_in_the_cwd_when_the_run_has_one(tmp_path: Path) -> None:
    work = tmp_path / "project"
    work.mkdir()
    ctx = make_ctx(tmp_path, cwd=work)
    with trio.fail_after(20):
        result = await CodeExecTool().execute({"code": "import os; print(os.getcwd())"}, ctx)
    assert result.output.splitlines()[0] == str(work.resolve())


async def test_an_exception_is_a_failed_result_with_the_traceback(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    with trio.fail_after(20):
        result = await CodeExecTool().execute({"code": "print('so far')\n1 / 0\n"}, ctx)
    assert not result.ok
    assert "exited with code 1" in (result.error or "")
    assert "so far" in result.output and "ZeroDivisionError" in result.output


async def test_timeout_reports_output_so_far(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    rec = Recorder()
    ctx = make_ctx(tmp_path, recorder=rec)
    code = "import time\nprint('started')\ntime.sleep(30)\nprint('never')\n"
    result = await jump_after_line(
        mock_clock,
        lambda: CodeExecTool().execute({"code": code, "timeout": 2}, ctx),
        rec,
        "started",
        2.0,
    )
    assert not result.ok and "timed out after 2 s" in (result.error or "")
    assert "started" in result.output and "never" not in result.output


async def test_output_is_capped(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, tool_output_max_chars=200)
    with trio.fail_after(20):
        result = await CodeExecTool().execute({"code": "print('y' * 100000)"}, ctx)
    assert result.ok and "characters cut" in result.output and len(result.output) < 400


async def test_missing_or_bad_arguments_name_the_argument(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    with trio.fail_after(20):
        missing = await CodeExecTool().execute({}, ctx)
        bad_timeout = await CodeExecTool().execute({"code": "pass", "timeout": True}, ctx)
    assert not missing.ok and "'code'" in (missing.error or "")
    assert not bad_timeout.ok and "'timeout'" in (bad_timeout.error or "")


async def test_cancel_kills_every_process_the_code_started(tmp_path: Path) -> None:
    rec = Recorder()
    ctx = make_ctx(tmp_path, recorder=rec)
    # The sh child prints while the snippet does: each line goes out in one write. A
    # print() under `python -u` is several (b"pid", b" ", b"4100", b"\n"), and the
    # child's line landing between them left "pidpid 4101" and " 4100": 2 of 4 lines.
    code = (
        "import os, subprocess, time\n"
        "def say(pid): os.write(1, f'pid {pid}\\n'.encode())\n"
        "say(os.getpid())\n"
        "kid = subprocess.Popen(['sleep', '300'])\n"
        "say(kid.pid)\n"
        "sh = subprocess.Popen(['sh', '-c', 'sleep 300 & echo pid $!; wait'])\n"
        "say(sh.pid)\n"
        "time.sleep(300)\n"
    )
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(CodeExecTool().execute, {"code": code}, ctx)
            pids = pids_in(await rec.wait_lines("pid ", 4, within=15))
            watch = PidWatch(pids)
            assert not any(is_gone(p) for p in pids)
            nursery.cancel_scope.cancel()
        try:
            await watch.wait_exited()
        finally:
            watch.close()
    assert all(is_gone(p) for p in pids), pids
