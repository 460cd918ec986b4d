"""`navi chat`'s daemon finding: the token's sources, and starting a daemon in the
background when none answers (with stand-in scripts instead of `navi serve`).

Rules: loopback only; a stand-in daemon is a detached process (as the real one is)
that writes its pid to a file, so the test kills it by pid in `finally`. Waits are for
a port to accept, bounded by START_TIMEOUT; nothing sleeps.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest
import trio

from navi_trio.client.daemon import LOG_FILE, TOKEN_FILE, ensure_daemon, find_token, host_port
from navi_trio.errors import DaemonUnreachableError, UsageError

DEADLINE = 40

LISTENER = """
import os, socket, sys, time
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
open(sys.argv[2], "w").write(str(os.getpid()))
print("stand-in daemon listening", flush=True)
time.sleep(30)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_token_comes_from_the_option_then_the_env_then_the_local_file(
    tmp_path: Path,
) -> None:
    assert find_token(None, {}, tmp_path) == ""
    (tmp_path / TOKEN_FILE).write_text("from-file\n")
    assert find_token(None, {}, tmp_path) == "from-file"
    assert find_token(None, {"NAVI_TOKEN": "from-env"}, tmp_path) == "from-env"
    assert find_token("given", {"NAVI_TOKEN": "from-env"}, tmp_path) == "given"


def test_a_bad_url_is_named() -> None:
    assert host_port("ws://127.0.0.1:8765") == ("127.0.0.1", 8765)
    with pytest.raises(UsageError, match="expected a ws:// URL"):
        host_port("http://127.0.0.1:8765")
    with pytest.raises(UsageError, match="port is not a number"):
        host_port("ws://127.0.0.1:eighty")


async def test_no_daemon_answering_starts_one_in_the_background(tmp_path: Path) -> None:
    port, pid_file = _free_port(), tmp_path / "pid"
    script = tmp_path / "standin.py"
    script.write_text(LISTENER)
    command = [sys.executable, str(script), str(port), str(pid_file)]
    url = f"ws://127.0.0.1:{port}"
    try:
        with trio.fail_after(DEADLINE):
            line = await ensure_daemon(url, tmp_path / "data", command)
            assert line is not None
            assert line.startswith(f"started a navi daemon in the background on 127.0.0.1:{port}")
            assert str(tmp_path / "data" / LOG_FILE) in line
            # Now one answers: nothing more is started.
            assert await ensure_daemon(url, tmp_path / "data", ["false"]) is None
        log = (tmp_path / "data" / LOG_FILE).read_text()
        assert "stand-in daemon listening" in log
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


async def test_a_daemon_that_exits_at_once_is_one_line_pointing_at_its_log(
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-c", "import sys; print('boom: no config'); sys.exit(3)"]
    with trio.fail_after(DEADLINE):
        with pytest.raises(
            DaemonUnreachableError, match=r"exited with code 3; see .*navi-serve\.log"
        ):
            await ensure_daemon(f"ws://127.0.0.1:{_free_port()}", tmp_path, command)
    assert "boom: no config" in (tmp_path / LOG_FILE).read_text()


async def test_a_remote_url_is_never_started_here(tmp_path: Path) -> None:
    assert await ensure_daemon("ws://example.invalid:8765", tmp_path, ["false"]) is None
    assert not (tmp_path / LOG_FILE).exists()
