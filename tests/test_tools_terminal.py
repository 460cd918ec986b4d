"""The terminal tool and the process-group machinery under it.

Rules for this module: real processes only (no autojump clock — a virtual clock would
jump while the kernel works), every test bounded by a real `trio.fail_after`, and no
sleeps: process deaths are observed through pidfds, output through emitted lines.
Timeout tests run on a MockClock moved by hand once the command has printed
(`jump_after_line`), so no test depends on the machine's speed.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
import trio.testing
from kvfake import PidWatch, Recorder, is_gone, jump_after_line, make_ctx, pids_in

from navi_trio.errors import ToolInputError
from navi_trio.tools.procs import ProcessPool, run_command
from navi_trio.tools.terminal import TerminalTool

pytestmark = pytest.mark.slow  # its tests start processes

# A shell whose children and grandchildren sleep; each prints "pid N" first.
SPAWNER = (
    "sh -c 'echo pid $$; sleep 300 & echo pid $!; sleep 300 & echo pid $!; "
    "(sleep 300 & echo pid $!; wait) & wait'"
)


async def test_run_streams_lines_and_returns_exit_code_zero(tmp_path: Path) -> None:
    rec = Recorder()
    ctx = make_ctx(tmp_path, recorder=rec)
    with trio.fail_after(20):
        result = await TerminalTool().execute(
            {"action": "run", "command": "echo one; echo two >&2; echo three"}, ctx
        )
    assert result.ok, result.content()
    assert rec.lines() == ["one", "two", "three"]
    assert "one\ntwo\nthree" in result.output
    assert result.data is not None and result.data["exit_code"] == 0


async def test_run_non_zero_exit_is_a_failure_with_the_output(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    with trio.fail_after(20):
        result = await TerminalTool().execute(
            {"action": "run", "command": "echo broken; exit 3"}, ctx
        )
    assert not result.ok
    assert "exited with code 3" in (result.error or "")
    assert "broken" in result.output
    assert result.data is not None and result.data["exit_code"] == 3


async def test_run_defaults_to_the_session_folder_and_creates_it(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    assert not ctx.session_dir.exists()
    with trio.fail_after(20):
        result = await TerminalTool().execute({"action": "run", "command": "pwd"}, ctx)
    assert result.ok
    assert str(ctx.session_dir.resolve()) in result.output


async def test_run_in_a_cwd_outside_the_roots_is_refused(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    with trio.fail_after(20):
        result = await TerminalTool().execute(
            {"action": "run", "command": "ls", "cwd": "/etc"}, ctx
        )
    assert not result.ok and "'/etc'" in (result.error or "")


async def test_run_timeout_kills_and_reports_output_so_far(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    rec = Recorder()
    ctx = make_ctx(tmp_path, recorder=rec)
    args = {"action": "run", "command": "echo before; sleep 30; echo after", "timeout": 1}
    result = await jump_after_line(
        mock_clock, lambda: TerminalTool().execute(args, ctx), rec, "before", 1.0
    )
    assert not result.ok
    assert "timed out after 1 s" in (result.error or "")
    assert "before" in result.output and "after" not in result.output


async def test_run_timeout_is_capped_by_settings(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    rec = Recorder()
    ctx = make_ctx(tmp_path, recorder=rec, terminal_timeout_sec=0.3)
    args = {"action": "run", "command": "echo go; sleep 30", "timeout": 600}
    result = await jump_after_line(
        mock_clock, lambda: TerminalTool().execute(args, ctx), rec, "go", 0.3
    )
    assert not result.ok and "timed out after 0.3 s" in (result.error or "")
    assert "capped at 0.3 s" in result.output


async def test_run_output_is_capped_head_and_tail(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, tool_output_max_chars=300)
    command = "echo FIRST; head -c 50000 /dev/zero | tr '\\0' x; echo; echo LAST"
    with trio.fail_after(20):
        result = await TerminalTool().execute({"action": "run", "command": command}, ctx)
    assert result.ok
    assert result.output.startswith("FIRST")
    assert "LAST" in result.output
    assert "characters cut" in result.output
    assert len(result.output) < 500


@pytest.mark.parametrize(
    "args, needle",
    [
        ({}, "'action'"),
        ({"action": "explode"}, "'action'"),
        ({"action": "run"}, "'command'"),
        ({"action": "run", "command": "true", "timeout": "soon"}, "'timeout'"),
        ({"action": "run", "command": "true", "timeout": -1}, "'timeout'"),
        ({"action": "read"}, "not available here"),
    ],
)
async def test_bad_arguments_give_a_failed_result_naming_them(
    tmp_path: Path, args: dict[str, object], needle: str
) -> None:
    with trio.fail_after(20):
        result = await TerminalTool().execute(args, make_ctx(tmp_path))
    assert not result.ok and needle in (result.error or ""), result.error


async def test_cancelled_run_kills_children_and_grandchildren(tmp_path: Path) -> None:
    rec = Recorder()
    ctx = make_ctx(tmp_path, recorder=rec)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(TerminalTool().execute, {"action": "run", "command": SPAWNER}, ctx)
            pids = pids_in(await rec.wait_lines("pid ", 4))
            watch = PidWatch(pids)
            assert not any(is_gone(p) for p in pids)
            nursery.cancel_scope.cancel()  # what Stop does to an inline call
        try:
            await watch.wait_exited()
        finally:
            watch.close()
    assert all(is_gone(p) for p in pids), pids


async def test_background_children_do_not_outlive_a_finished_run(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    with trio.fail_after(20):
        result = await TerminalTool().execute(
            {"action": "run", "command": "sleep 300 & echo pid $!"}, ctx
        )
        assert result.ok
        pid = pids_in([ln for ln in result.output.splitlines() if ln.startswith("pid")])[0]
        if not is_gone(pid):
            watch = PidWatch([pid])
            try:
                await watch.wait_exited()
            finally:
                watch.close()
    assert is_gone(pid)


async def test_group_members_ignoring_sigterm_are_killed_after_the_grace(
    tmp_path: Path,
) -> None:
    # Stopped once the member is up (no time limit to race): SIGTERM is ignored by
    # all, so only the SIGKILL after the grace ends them.
    lines: list[str] = []
    up = trio.Event()

    def on_line(line: str) -> None:
        lines.append(line)
        up.set()

    command = "trap '' TERM; sh -c \"trap '' TERM; sleep 300\" & echo pid $!; sleep 300"
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: run_command(
                    command, cwd=tmp_path, time_limit=600, on_line=on_line, grace=0.2
                )
            )
            await up.wait()
            nursery.cancel_scope.cancel()
    assert len(pids_in(lines)) == 1
    assert all(is_gone(p) for p in pids_in(lines)), lines


# -- persistent processes (ProcessPool) ------------------------------------------------


async def test_pool_open_write_read_kill_round_trip(tmp_path: Path) -> None:
    pool = ProcessPool()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            handle = await pool.open("s1", "cat", tmp_path)
            await pool.write("s1", handle, "hello\n")
            got = await pool.read("s1", handle, 100, wait=10)
            assert got.output == "hello\n" and got.running
            assert [i.handle_id for i in pool.list("s1")] == [handle]
            final = await pool.kill("s1", handle)
            assert not final.running
            assert pool.list("s1") == []
            nursery.cancel_scope.cancel()


async def test_pool_handles_are_private_to_their_session(tmp_path: Path) -> None:
    pool = ProcessPool()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            handle = await pool.open("s1", "cat", tmp_path)
            assert pool.list("s2") == []
            for attempt in (
                pool.read("s2", handle, 100),
                pool.write("s2", handle, "x\n"),
                pool.kill("s2", handle),
            ):
                with pytest.raises(ToolInputError, match=f"no process '{handle}'"):
                    await attempt
            assert pool.list("s1")[0].running
            nursery.cancel_scope.cancel()


async def test_pool_buffer_is_bounded_and_reports_dropped_output(tmp_path: Path) -> None:
    pool = ProcessPool(buffer_chars=100)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            handle = await pool.open(
                "s1", "head -c 1000 /dev/zero | tr '\\0' x; echo END", tmp_path
            )
            assert await pool.wait_exit("s1", handle) == 0
            got = await pool.read("s1", handle, 1000)
            assert len(got.output) == 100 and got.output.endswith("END\n")
            assert got.dropped == 1004 - 100
            assert not got.running and got.exit_code == 0
            nursery.cancel_scope.cancel()


async def test_pool_shutdown_kills_every_group_it_owns(tmp_path: Path) -> None:
    pool = ProcessPool()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            text = ""
            for session in ("s1", "s2"):
                handle = await pool.open(session, SPAWNER, tmp_path)
                while text.count("pid ") < 4 * (1 + (session == "s2")):
                    got = await pool.read(session, handle, 10_000, wait=10)
                    text += got.output
            pids = pids_in([ln for ln in text.splitlines() if ln.startswith("pid ")])
            watch = PidWatch(pids)
            assert len(pids) == 8 and not any(is_gone(p) for p in pids)
            nursery.cancel_scope.cancel()  # the daemon shuts down
        try:
            await watch.wait_exited()
        finally:
            watch.close()
    assert all(is_gone(p) for p in pids), pids


async def test_pool_refuses_new_processes_when_not_running(tmp_path: Path) -> None:
    with pytest.raises(ToolInputError, match="not running"):
        await ProcessPool().open("s1", "cat", tmp_path)


async def test_a_stopped_pool_refuses_new_processes_in_the_tools_terms(tmp_path: Path) -> None:
    pool = ProcessPool()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            nursery.cancel_scope.cancel()  # the daemon shuts down
        with pytest.raises(ToolInputError, match="the process pool is not running"):
            await pool.open("s1", "cat", tmp_path)
    assert pool.list("s1") == []


# -- the terminal tool over the pool ----------------------------------------------------


async def test_terminal_open_read_write_kill_list_through_services(tmp_path: Path) -> None:
    pool = ProcessPool()
    ctx = make_ctx(tmp_path, services=SimpleNamespace(processes=pool))
    tool = TerminalTool()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            opened = await tool.execute(
                {"action": "open", "command": "cat", "background": True}, ctx
            )
            assert opened.ok and opened.data is not None
            handle = opened.data["handle"]
            wrote = await tool.execute({"action": "write", "handle": handle, "text": "ping\n"}, ctx)
            assert wrote.ok
            read = await tool.execute({"action": "read", "handle": handle, "wait": 10}, ctx)
            assert read.ok and "ping" in read.output
            listed = await tool.execute({"action": "list"}, ctx)
            assert handle in listed.output and "running" in listed.output
            eof = await tool.execute({"action": "write", "handle": handle, "eof": True}, ctx)
            assert eof.ok
            ended = await tool.execute({"action": "read", "handle": handle, "wait": 10}, ctx)
            assert "exited with code 0" in ended.output
            killed = await tool.execute({"action": "kill", "handle": handle}, ctx)
            assert killed.ok
            gone = await tool.execute({"action": "read", "handle": handle}, ctx)
            assert not gone.ok and f"no process '{handle}'" in (gone.error or "")
            bad = await tool.execute({"action": "read", "handle": handle, "wait": 99}, ctx)
            assert not bad.ok and "'wait'" in (bad.error or "")
            nursery.cancel_scope.cancel()
