"""The fork server of the tests (tests/navi_forks.py): a forked `navi` is a process of
its own with the caller's environment, working folder, umask and streams, signalled and
reaped as a child is, and it does not outlive a caller that lets it go.

Rules: a real `navi serve` forked from the server, on 127.0.0.1 port 0 with a fake LLM
in the test's loop; what the process is, read from /proc; every wait bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
from functools import partial
from pathlib import Path

import navi_forks
import pytest
import trio
from test_cli import fake_llm_here

from navi_trio.cli.daemons import is_navi
from navi_trio.client.daemon import pid_file

pytestmark = pytest.mark.slow
LIMIT = 60


def _umask(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError("no Umask line")


async def test_a_forked_daemon_is_its_own_process_as_asked_and_dies_with_its_caller(
    env: dict[str, str], tmp_path: Path
) -> None:
    with trio.fail_after(LIMIT):
        async with fake_llm_here([{"text": "unused"}]) as llm:
            async with navi_forks.serving(env, llm) as daemon:
                pid = daemon.pid
                assert pid not in (os.getpid(), os.getppid())
                # Its environment is the caller's: the daemon's files are where it says.
                port = daemon.url.rstrip("/").rsplit(":", 1)[1]
                data = Path(env["NAVI_DATA_DIR"])
                assert (data / "local-token").exists()  # noqa: ASYNC240
                assert Path(env["NAVI_DB"]).exists()  # noqa: ASYNC240
                assert pid_file(data, int(port)).read_text() == f"{pid}\n"
                assert os.readlink(f"/proc/{pid}/cwd") == os.getcwd()
                mask = os.umask(0)
                os.umask(mask)
                assert _umask(pid) == mask
                assert is_navi(pid)  # what `navi status` and `navi stop` ask of a daemon
                assert daemon.url.startswith("ws://127.0.0.1:")
                daemon.send_signal(signal.SIGTERM)
                assert await daemon.wait() == 0  # its clean shutdown's exit code

            # Let go while it runs: the fork server kills it.
            proc = await navi_forks.start(
                "serve", "--port", "0", "--llm-url", llm, env=env, cwd=tmp_path
            )
            assert os.readlink(f"/proc/{proc.pid}/cwd") == str(tmp_path)
            gone = os.pidfd_open(proc.pid)
            try:
                proc.close()
                await trio.lowlevel.wait_readable(gone)  # it ended
            finally:
                os.close(gone)


async def test_a_forked_command_reads_its_stdin_and_says_its_exit_code(
    env: dict[str, str], tmp_path: Path
) -> None:
    with trio.fail_after(LIMIT):
        async with fake_llm_here([{"text": "piped"}]) as llm:
            proc = await navi_forks.start("run", "--llm-url", llm, "-", env=env, cwd=tmp_path)
            code, out, err = await navi_forks.communicate(proc, b"from stdin")
        assert (code, out) == (0, b"piped\n"), err
        proc = await navi_forks.start("fly", env=env, cwd=tmp_path)
        code, out, err = await navi_forks.communicate(proc)
    assert code == 1 and out == b"" and err.startswith(b"navi: error: ")


async def test_an_attached_command_runs_on_the_callers_stdio_and_gets_its_signals(
    env: dict[str, str], tmp_path: Path
) -> None:
    # For a caller that spawns a command itself (an SDK's stdio client).
    def command(*args: str) -> list[str]:
        return navi_forks.attach_command(*args)

    with trio.fail_after(LIMIT):
        async with fake_llm_here([{"text": "piped"}]) as llm:
            run = await trio.to_thread.run_sync(command, "run", "--llm-url", llm, "-")
            done = await trio.run_process(
                run, stdin=b"from stdin", capture_stdout=True, capture_stderr=True,
                env=env, cwd=tmp_path, check=False,
            )  # fmt: skip
            assert (done.returncode, done.stdout) == (0, b"piped\n"), done.stderr
            fly = await trio.run_process(
                command("fly"), capture_stdout=True, capture_stderr=True, env=env, check=False
            )
            assert fly.returncode == 1 and fly.stderr.startswith(b"navi: error: ")
            serve = command("serve", "--port", "0", "--llm-url", llm)
            async with trio.open_nursery() as nursery:
                proc = await nursery.start(partial(trio.run_process, serve, env=env, check=False,
                                                   stdout=subprocess.PIPE))  # fmt: skip
                said = b""
                while b"/\n" not in said:
                    said += await proc.stdout.receive_some()
                assert said.startswith(b"navi: listening on ws://127.0.0.1:")
                proc.send_signal(signal.SIGTERM)  # passed on: the daemon's clean exit
                assert await proc.wait() == 0
