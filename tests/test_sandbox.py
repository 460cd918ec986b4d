"""The bubblewrap sandbox of terminal and code_exec, with the REAL bwrap (issue 10).

Rules: real processes and the real bwrap (the whole module is skipped, with the probe's
reason, where it cannot run); loopback only; every test bounded by a real
`trio.fail_after`, no sleeps: a process inside the sandbox is found from outside by a
unique argv tag in /proc and its death observed through a pidfd; the timeout test runs
on a MockClock moved by hand once the command printed (`jump_after_line`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from kvfake import PidWatch, Recorder, is_gone, jump_after_line, make_ctx

from navi_trio.tools.base import ToolContext
from navi_trio.tools.code_exec import CodeExecTool
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.procs import ProcessPool
from navi_trio.tools.sandbox import SandboxSpec, bwrap_argv, find_bwrap, sandbox_available
from navi_trio.tools.terminal import TerminalTool

OK, REASON = sandbox_available()
pytestmark = [
    pytest.mark.slow,  # its tests start processes
    pytest.mark.skipif(not OK, reason=f"the sandbox is unavailable: {REASON}"),
]
TIMEOUT = 30


def sandboxed(tmp_path: Path, *, network: bool = False, **kw: Any) -> ToolContext:
    """A context whose workspace (the session folder) is the only writable place."""
    ctx = make_ctx(tmp_path, **kw)
    ctx.session_dir.mkdir(parents=True, exist_ok=True)
    return attrs.evolve(ctx, sandbox=SandboxSpec(writable=(ctx.session_dir,), network=network))


async def run(ctx: ToolContext, command: str, **args: Any) -> Any:
    with trio.fail_after(TIMEOUT):
        return await TerminalTool().execute({"action": "run", "command": command, **args}, ctx)


def tagged_pids(tag: str) -> list[int]:
    """Host pids of live processes named `tag` (argv[0]: ``exec -a TAG``)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.split(b"\0")[0] == tag.encode() and not is_gone(int(entry.name)):
            found.append(int(entry.name))
    return found


def new_tag() -> str:
    return f"navi-sbx-{secrets.token_hex(6)}"


@pytest.fixture
def tags() -> Iterator[list[str]]:
    """Tags for sleepers; any still alive after the test (a broken sandbox) is killed."""
    made: list[str] = []
    yield made
    for tag in made:
        for pid in tagged_pids(tag):
            os.kill(pid, signal.SIGKILL)


async def test_a_write_outside_the_workspace_fails(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    ctx = sandboxed(tmp_path)
    assert ctx.sandbox is not None
    ctx = attrs.evolve(ctx, sandbox=attrs.evolve(ctx.sandbox, readable=(outside,)))
    target = Path("/usr") / f"{new_tag()}.txt"
    try:
        result = await run(ctx, f"touch {outside}/x.txt; touch {target}; echo end")
        assert result.ok, result.content()  # the command ran: `echo end` is the exit code
        assert result.output.count("Read-only file system") == 2, result.output
        assert not (outside / "x.txt").exists() and not target.exists()
    finally:
        target.unlink(missing_ok=True)


async def test_a_write_inside_the_workspace_works(tmp_path: Path) -> None:
    ctx = sandboxed(tmp_path)
    result = await run(ctx, "echo hello > made.txt && cat made.txt")
    assert result.ok, result.content()
    assert (ctx.session_dir / "made.txt").read_text() == "hello\n"


async def test_output_streams_and_is_capped_under_the_sandbox(tmp_path: Path) -> None:
    rec = Recorder()
    ctx = sandboxed(tmp_path, recorder=rec, tool_output_max_chars=1000)
    result = await run(ctx, "seq 1 100000")
    assert result.ok, result.content()
    assert result.output.startswith("1\n2\n3") and "100000" in result.output
    assert "characters cut" in result.output and len(result.output) < 1200
    assert rec.emitted and rec.lines()[-1] == "100000"  # streamed live, up to the end


async def test_reading_etc_works_and_tmp_is_private(tmp_path: Path) -> None:
    (tmp_path / "host-secret.txt").write_text("host")
    ctx = sandboxed(tmp_path)
    result = await run(ctx, f"head -1 /etc/passwd; ls {tmp_path}/host-secret.txt; echo > /tmp/x")
    assert result.output.startswith("root:"), result.output
    assert "No such file" in result.output  # /tmp is the sandbox's own


async def test_the_private_tmp_holds_its_size_and_no_more(tmp_path: Path) -> None:
    # /tmp is a tmpfs, in RAM: a command that fills it gets "no space left" at the size
    # it was given, and the host's memory is spared.
    ctx = sandboxed(tmp_path)
    ctx = attrs.evolve(ctx, sandbox=SandboxSpec(writable=(ctx.session_dir,), tmp_max_bytes=1 << 20))
    fits = await run(ctx, "head -c 600000 /dev/zero > /tmp/a && echo fits")
    assert fits.ok and "fits" in fits.output, fits.content()
    over = await run(
        ctx, 'head -c 2000000 /dev/zero > /tmp/b; echo "kib=$(du -k /tmp/b | cut -f1)"'
    )
    assert "No space left on device" in over.output, over.output
    kept_kib = int(over.output.split("kib=")[1].split()[0])
    assert 0 < kept_kib <= 1024, over.output


@pytest.fixture
def var_tmp() -> Iterator[Path]:
    """A folder outside /tmp (which the sandbox replaces whole), removed after."""
    base = Path(tempfile.mkdtemp(prefix="navi-mask-", dir="/var/tmp")).resolve()
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_a_masked_folder_holds_no_data_even_for_its_owner(var_tmp: Path) -> None:
    # A folder hidden from commands is an empty tmpfs. Where the daemon is not root,
    # bwrap makes that tmpfs the command's own: it gets a small size, mount points
    # only, so it is no way around the size of /tmp. Run here as this process (no tool
    # user), which owns the masks as such a daemon's command does.
    base = var_tmp
    hidden = base / "hidden"
    hidden.mkdir()
    work = base / "work"
    work.mkdir()
    spec = SandboxSpec(writable=(work,), private=PrivatePaths(hidden=(hidden,)))
    fill = f'head -c 1000000 /dev/zero > {hidden}/fill; echo "kib=$(du -k {hidden}/fill | cut -f1)"'
    bwrap = find_bwrap()
    assert bwrap is not None
    with ExitStack() as stack, trio.fail_after(TIMEOUT):
        cmd = bwrap_argv(bwrap, spec, ["sh", "-c", fill], work, stack=stack)
        done = await trio.run_process(
            cmd.argv, pass_fds=cmd.fds, capture_stdout=True, capture_stderr=True, check=False
        )
    said = (done.stdout + done.stderr).decode()
    assert "No space left on device" in said, said
    assert int(said.split("kib=")[1].split()[0]) <= 64, said


async def test_a_loopback_listener_outside_is_out_of_reach(tmp_path: Path) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    probe = (
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
        f"{port}), timeout=5); print('connected')\""
    )
    try:
        result = await run(sandboxed(tmp_path), probe)
        assert not result.ok and "connected" not in result.output
        assert "Connection refused" in result.output, result.output
        # The same command with the network allowed connects: the probe itself works.
        allowed = await run(sandboxed(tmp_path, network=True), probe)
        assert allowed.ok and "connected" in allowed.output, allowed.content()
    finally:
        for listener in listeners:
            await listener.aclose()


async def test_the_api_key_is_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAVI_LLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("NAVI_SBX_HARMLESS", "visible")
    ctx = sandboxed(tmp_path)
    # Passed on only because the profile names it (an allow-list: tools/procs `child_env`).
    ctx = attrs.evolve(ctx, profile=attrs.evolve(ctx.profile, env=("NAVI_SBX_HARMLESS",)))
    result = await run(ctx, "env")
    assert result.ok
    assert "NAVI_SBX_HARMLESS=visible" in result.output
    assert "sk-very-secret" not in result.output and "NAVI_LLM_API_KEY" not in result.output


# Run as ``exec -a TAG python sleeper.py FIFO``: it is up (and named TAG) once it has
# written to FIFO, then it sleeps.
SLEEPER = "import sys, time\nopen(sys.argv[1], 'w').write('up')\ntime.sleep(300)\n"


def named_sleeper(folder: Path, tags: list[str], kind: str) -> tuple[str, Path, str]:
    """A fresh tag `navi-KIND-<hex>` (added to `tags`, so what it names dies at the end),
    the FIFO in `folder` the sleeper reports on, and the shell words that start it."""
    marker = f"navi-{kind}-{secrets.token_hex(4)}"
    tags.append(marker)
    fifo = folder / "up.fifo"
    os.mkfifo(fifo)
    script = folder / "sleeper.py"
    script.write_text(SLEEPER)
    return marker, fifo, f"exec -a {marker} {sys.executable} {script} {fifo}"


def sleeper(ctx: ToolContext, tag: str) -> str:
    """The shell words that start a sleeper named `tag` and make the FIFO it reports on."""
    (ctx.session_dir / "sleeper.py").write_text(SLEEPER)
    return f"exec -a {tag} {sys.executable} sleeper.py up"


def escaper(ctx: ToolContext, tag: str) -> str:
    """Starts a grandchild that leaves the session (setsid), empties its environment
    (env -i: no NAVI_PROC_TAG) and loses its parent, so only the PID namespace holds it;
    prints "started" once it runs, then waits for a line on the `go` FIFO."""
    return (
        f"mkfifo up; (setsid env -i bash -c '{sleeper(ctx, tag)}' >/dev/null 2>&1 &); "
        "read _ < up; echo started; read _ < go; echo done"
    )


async def test_a_setsid_grandchild_dies_with_the_call(tmp_path: Path, tags: list[str]) -> None:
    rec = Recorder()
    ctx = sandboxed(tmp_path, recorder=rec)
    os.mkfifo(ctx.session_dir / "go")
    tag = new_tag()
    tags.append(tag)
    results: list[Any] = []

    async def call() -> None:
        results.append(
            await TerminalTool().execute({"action": "run", "command": escaper(ctx, tag)}, ctx)
        )

    def say_go() -> None:
        with open(ctx.session_dir / "go", "w") as f:
            f.write("go\n")

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await rec.wait_lines("started", 1)
            pids = tagged_pids(tag)
            assert len(pids) == 1  # the grandchild, seen from outside by its host pid
            watch = PidWatch(pids)
            await trio.to_thread.run_sync(say_go)
        try:
            await watch.wait_exited()
        finally:
            watch.close()
    assert results[0].ok and "done" in results[0].output, results[0].content()
    assert tagged_pids(tag) == []


async def test_stop_mid_command_kills_everything_inside(tmp_path: Path, tags: list[str]) -> None:
    rec = Recorder()
    ctx = sandboxed(tmp_path, recorder=rec)
    tag = new_tag()
    tags.append(tag)
    command = f"mkfifo up; ({sleeper(ctx, tag)}) & read _ < up; echo started; wait"
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(TerminalTool().execute, {"action": "run", "command": command}, ctx)
            await rec.wait_lines("started", 1)
            pids = tagged_pids(tag)
            assert len(pids) == 1
            watch = PidWatch(pids)
            nursery.cancel_scope.cancel()  # what Stop does to the call
        try:
            await watch.wait_exited()
        finally:
            watch.close()


async def test_the_timeout_kills_the_sandboxed_command(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    rec = Recorder()
    ctx = sandboxed(tmp_path, recorder=rec)
    args = {"action": "run", "command": "echo before; sleep 30; echo after", "timeout": 1}
    result = await jump_after_line(
        mock_clock, lambda: TerminalTool().execute(args, ctx), rec, "before", 2
    )
    assert not result.ok and "timed out after 1 s" in (result.error or "")
    assert "before" in result.output and "after" not in result.output


async def test_terminal_open_is_sandboxed_too(tmp_path: Path) -> None:
    pool = ProcessPool(grace=1.0)
    ctx = attrs.evolve(sandboxed(tmp_path), services=SimpleNamespace(processes=pool))
    target = Path("/usr") / f"{new_tag()}.txt"
    tool = TerminalTool()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            opened = await tool.execute(
                {"action": "open", "command": f"touch {target}; touch inside.txt; cat"}, ctx
            )
            assert opened.ok, opened.content()
            handle = opened.data["handle"] if opened.data else ""
            await tool.execute({"action": "write", "handle": handle, "eof": True}, ctx)
            await pool.wait_exit(ctx.session_id, handle)
            read = await tool.execute({"action": "read", "handle": handle}, ctx)
            nursery.cancel_scope.cancel()
    target_made = target.exists()
    target.unlink(missing_ok=True)
    assert "Read-only file system" in read.output and not target_made
    assert (ctx.session_dir / "inside.txt").exists()


async def test_code_exec_is_sandboxed(tmp_path: Path) -> None:
    target = Path("/usr") / f"{new_tag()}.txt"
    code = (
        "from pathlib import Path\n"
        "Path('inside.txt').write_text('ok')\n"
        f"try:\n    Path({str(target)!r}).write_text('x')\nexcept OSError as e:\n"
        "    print('refused', e.strerror)\n"
    )
    ctx = sandboxed(tmp_path)
    try:
        with trio.fail_after(TIMEOUT):
            result = await CodeExecTool().execute({"code": code}, ctx)
    finally:
        target_made = target.exists()
        target.unlink(missing_ok=True)
    assert result.ok, result.content()
    assert "refused Read-only file system" in result.output and not target_made
    assert (ctx.session_dir / "inside.txt").read_text() == "ok"


async def test_an_empty_spec_makes_nothing_writable_but_the_snippet_still_runs(
    tmp_path: Path,
) -> None:
    ctx = attrs.evolve(make_ctx(tmp_path), sandbox=SandboxSpec())  # read-only mode
    with trio.fail_after(TIMEOUT):
        result = await CodeExecTool().execute({"code": "open('x.txt', 'w')"}, ctx)
    assert not result.ok and "Read-only file system" in result.output, result.content()
    assert not (ctx.session_dir / "x.txt").exists()


async def test_an_open_process_and_its_setsid_grandchild_die_at_shutdown(
    tmp_path: Path, tags: list[str]
) -> None:
    pool = ProcessPool(grace=1.0)
    ctx = attrs.evolve(sandboxed(tmp_path), services=SimpleNamespace(processes=pool))
    os.mkfifo(ctx.session_dir / "go")  # never written: the command waits on it
    tag = new_tag()
    tags.append(tag)
    tool = TerminalTool()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            opened = await tool.execute({"action": "open", "command": escaper(ctx, tag)}, ctx)
            assert opened.ok, opened.content()
            handle = opened.data["handle"] if opened.data else ""
            read = await tool.execute({"action": "read", "handle": handle, "wait": 20}, ctx)
            assert "started" in read.output, read.output
            pids = tagged_pids(tag)
            assert len(pids) == 1
            watch = PidWatch(pids)
            nursery.cancel_scope.cancel()  # the daemon shuts down
        try:
            await watch.wait_exited()
        finally:
            watch.close()


STARTER = """
import subprocess, sys
from contextlib import ExitStack
from pathlib import Path
from navi_trio.tools.sandbox import SandboxSpec, bwrap_argv, find_bwrap

with ExitStack() as stack:
    bwrap = find_bwrap()
    assert bwrap is not None
    argv = ["sh", "-c", "echo started; exec sleep 600"]
    cmd = bwrap_argv(bwrap, SandboxSpec(), argv, Path(sys.argv[1]), stack=stack)
    child = subprocess.Popen(
        cmd.argv, pass_fds=cmd.fds, cwd="/", start_new_session=True, stdout=subprocess.PIPE
    )
assert child.stdout is not None and child.stdout.readline() == b"started\\n"
print(child.pid, flush=True)
sys.stdin.read()
"""


async def test_a_sandbox_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    # A daemon killed with SIGKILL runs no clean-up: its sandboxes (in sessions of their
    # own, so no group kill reaches them) end with it all the same, once they run (bwrap
    # killed as it starts may not: containers/bubblewrap#633).
    script = tmp_path / "starter.py"
    script.write_text(STARTER)
    with trio.fail_after(TIMEOUT):
        starter = await trio.lowlevel.open_process(
            [sys.executable, str(script), str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert starter.stdout is not None
            said = b""
            while not said.endswith(b"\n"):
                said += await starter.stdout.receive_some()
            bwrap = int(said)
            watch = PidWatch([bwrap])
            try:
                starter.kill()
                await watch.wait_exited()
            finally:
                watch.close()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(bwrap, signal.SIGKILL)  # its own group: all it started
        finally:
            starter.kill()
            await starter.wait()
