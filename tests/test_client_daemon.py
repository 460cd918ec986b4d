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

from navi_trio.cli import main
from navi_trio.client.daemon import (
    TOKEN_FILE,
    ensure_daemon,
    find_token,
    host_port,
    log_file,
    pid_file,
)
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
    with pytest.raises(UsageError, match="expected a ws:// or wss:// URL"):
        host_port("http://127.0.0.1:8765")
    with pytest.raises(UsageError, match="port is not a number"):
        host_port("ws://127.0.0.1:eighty")


@pytest.mark.parametrize(
    "words",
    [
        ["sessions", "list"],
        ["run", "hi"],
        ["schedule", "list"],
        ["rewind", "--session", "s-1", "--list"],
        ["compact", "--session", "s-1"],
        ["doctor"],
        ["web"],
    ],
)
def test_every_command_names_a_bad_url(
    words: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The browser page's http:// address, or a port out of range, given as --url: one
    line naming it (and the daemon's address), not the WebSocket library's ValueError."""
    monkeypatch.setenv("NAVI_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("NAVI_DB", str(tmp_path / "navi.db"))
    assert main([*words, "--url", "http://127.0.0.1:8765"]) == 1
    said = capsys.readouterr().err
    assert said == (
        "navi: error: --url 'http://127.0.0.1:8765': expected a ws:// or wss:// URL "
        "(the page's address is not the daemon's: ws://127.0.0.1:8765/)\n"
    )
    assert main([*words, "--url", "ws://127.0.0.1:99999"]) == 1
    assert "the port is not a number from 1 to 65535" in capsys.readouterr().err


@pytest.mark.slow
async def test_no_daemon_answering_starts_one_in_the_background(tmp_path: Path) -> None:
    port, standin_pid = _free_port(), tmp_path / "pid"
    script = tmp_path / "standin.py"
    script.write_text(LISTENER)
    command = [sys.executable, str(script), str(port), str(standin_pid)]
    url = f"ws://127.0.0.1:{port}"
    try:
        with trio.fail_after(DEADLINE):
            line = await ensure_daemon(url, tmp_path / "data", command)
            assert line is not None
            assert line.startswith(f"started a navi daemon in the background on 127.0.0.1:{port}")
            assert str(log_file(tmp_path / "data", port)) in line
            # Now one answers: nothing more is started.
            assert await ensure_daemon(url, tmp_path / "data", ["false"]) is None
        log = log_file(tmp_path / "data", port).read_text()
        assert "stand-in daemon listening" in log
        # The pid file is the daemon's own to write, once it listens (a stand-in writes none).
        assert not pid_file(tmp_path / "data", port).exists()
    finally:
        if standin_pid.exists():
            os.kill(int(standin_pid.read_text()), signal.SIGKILL)


@pytest.mark.slow
async def test_a_daemon_that_exits_at_once_is_one_line_with_its_error_and_its_log(
    tmp_path: Path,
) -> None:
    port = _free_port()
    log = log_file(tmp_path, port)
    log.write_text("navi: error: an older start's error\n")  # not this start's
    running = pid_file(tmp_path, 8765)  # another daemon's, on another port
    running.write_text("4242\n")
    command = [
        sys.executable, "-c",
        "import sys; print('navi: warning: something'); print('navi: error: boom: no config');"
        " print('after it'); sys.exit(3)",
    ]  # fmt: skip
    with trio.fail_after(DEADLINE):
        with pytest.raises(DaemonUnreachableError) as said:
            await ensure_daemon(f"ws://127.0.0.1:{port}", tmp_path, command)
    assert str(said.value) == f"the background daemon did not start: boom: no config (log: {log})"
    # A start that failed wrote no pid file, and left the other daemon's as it was.
    assert [p.name for p in tmp_path.glob("*.pid")] == [running.name]  # noqa: ASYNC240
    assert running.read_text() == "4242\n"
    # A start that says no error line: its last line, else its exit code.
    silent = [sys.executable, "-c", "import sys; sys.exit(4)"]
    with trio.fail_after(DEADLINE):
        with pytest.raises(DaemonUnreachableError, match="it exited with code 4 \\(log: "):
            await ensure_daemon(f"ws://127.0.0.1:{port}", tmp_path, silent)


def test_two_ports_have_a_pid_file_and_a_log_each(tmp_path: Path) -> None:
    assert pid_file(tmp_path, 8765) == tmp_path / "navi-serve-8765.pid"
    assert log_file(tmp_path, 9000) == tmp_path / "navi-serve-9000.log"


async def test_a_remote_url_is_never_started_here(tmp_path: Path) -> None:
    assert await ensure_daemon("ws://example.invalid:8765", tmp_path, ["false"]) is None
    assert not list(tmp_path.iterdir())  # noqa: ASYNC240
