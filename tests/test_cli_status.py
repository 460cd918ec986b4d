"""`navi status` and `navi stop` on real daemons, each port with its own pid file, and
`navi serve` on a port that is taken.

Rules as in tests/test_cli.py: real `navi` processes on 127.0.0.1, forked from the warm
fork server (tests/navi_forks.py), the fake LLM in the test's loop, the DBs and the data
folder under tmp_path, an absolute deadline on every test; nothing sleeps: `navi stop`
itself waits for the daemon's exit, and the test reaps it. Every daemon is killed at the
end.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import navi_forks
import pytest
import trio
from test_cli import ANSWER, DEADLINE, _one_error_line, fake_llm, forked

from navi_trio.client.daemon import pid_file

pytestmark = pytest.mark.slow


@pytest.fixture
def quiet_port() -> Iterator[str]:
    """A port that nothing answers on (held, never listening): `navi status --port` of it
    leaves out whatever answers on 8765 on this machine."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield str(sock.getsockname()[1])


def port_of(daemon: Any) -> int:
    return int(daemon.url.rstrip("/").rsplit(":", 1)[1])


async def test_status_names_each_daemon_and_stop_waits_for_the_one_asked(
    env: dict[str, str], tmp_path: Path, quiet_port: str
) -> None:
    data = Path(env["NAVI_DATA_DIR"])
    async with fake_llm(tmp_path, [{"text": ANSWER}]) as llm:
        async with (
            navi_forks.serving(env, llm) as a,
            navi_forks.serving(env, llm) as b,
        ):  # one data folder, two ports
            ports = {port_of(a): a.pid, port_of(b): b.pid}
            for port, pid in ports.items():  # each its own pid file, written once listening
                assert pid_file(data, port).read_text() == f"{pid}\n"
            status = await forked("status", "--port", quiet_port, env=env, cwd=tmp_path)
            assert status.code == 0 and status.err == "", status
            lines = status.out.splitlines()
            assert len(lines) == 2, status.out
            for line, (port, pid) in zip(lines, sorted(ports.items()), strict=True):
                assert line.startswith(f"ws://127.0.0.1:{port}/  pid {pid}  since "), line
                assert line.endswith("backend ollama  log: its terminal (navi serve)"), line

            many = await forked("stop", env=env, cwd=tmp_path)
            assert many.code == 1 and "say which with --port" in _one_error_line(many)
            stop = await forked("stop", "--port", str(port_of(a)), env=env, cwd=tmp_path)
            assert stop.code == 0, stop
            assert stop.out.splitlines() == [
                f"stopping the navi daemon on port {port_of(a)} (pid {a.pid})…",
                f"stopped (pid {a.pid})",
            ]
            with trio.fail_after(DEADLINE):
                assert await a.wait() == 0  # it had exited: its clean shutdown
            assert not pid_file(data, port_of(a)).exists()  # removed on its way out
            status = await forked("status", "--port", quiet_port, env=env, cwd=tmp_path)
            assert [ln.split("  ")[:2] for ln in status.out.splitlines()] == [
                [b.url, f"pid {b.pid}"]
            ]

            # A daemon killed outright leaves its pid file: named stale, never trusted.
            b.kill()
            with trio.fail_after(DEADLINE):
                await b.wait()
            status = await forked("status", "--port", quiet_port, env=env, cwd=tmp_path)
            assert status.code == 1
            assert status.out.splitlines()[0] == (
                f"port {port_of(b)}: the daemon of pid {b.pid} is gone (a stale pid file)"
            )
            stale = await forked("stop", "--port", str(port_of(b)), env=env, cwd=tmp_path)
            assert stale.code == 0 and "its stale pid file is removed" in stale.out
            assert not pid_file(data, port_of(b)).exists()


async def test_a_start_that_fails_writes_no_pid_file(env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{\n}\n,")
    done = await forked("serve", "--port", "0", "--config", str(bad), "--llm-url",
                        "http://127.0.0.1:9", env=env, cwd=tmp_path)  # fmt: skip
    assert done.code == 1 and "config.json" in _one_error_line(done)
    assert not list(Path(env["NAVI_DATA_DIR"]).glob("*.pid"))  # noqa: ASYNC240


async def test_a_port_in_use_names_who_answers_there_before_anything_else(
    env: dict[str, str], tmp_path: Path
) -> None:
    async with (
        fake_llm(tmp_path, [{"text": ANSWER}]) as llm,
        navi_forks.serving(env, llm) as daemon,
    ):
        port = port_of(daemon)
        # Nothing configured: the backend would be chosen and said first; the port comes first.
        done = await forked("serve", "--port", str(port), env=env, cwd=tmp_path)
        assert done.code == 1 and done.out == ""
        assert done.err_lines == [
            f"navi: error: port {port} (127.0.0.1) is in use: a navi daemon of this data folder "
            f"answers there (pid {daemon.pid}), backend ollama: use it, stop it with "
            f"`navi stop --port {port}`, or choose another port with --port"
        ]
        # Another data folder's daemon: it refuses this folder's token.
        elsewhere = {**env, "NAVI_DATA_DIR": str(tmp_path / "elsewhere")}
        done = await forked("serve", "--port", str(port), env=elsewhere, cwd=tmp_path)
        assert _one_error_line(done) == (
            f"navi: error: port {port} (127.0.0.1) is in use: a navi daemon of another data "
            f"folder (no pid file of it in {tmp_path / 'elsewhere'}), or another WebSocket "
            "server, answers there: choose another port with --port"
        )
    with socket.socket() as sock:  # a program that is not navi
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = await forked("serve", "--port", str(port), env=env, cwd=tmp_path)
    assert done.err_lines == [
        f"navi: error: port {port} (127.0.0.1) is in use by a program that is not a navi "
        "daemon: choose another port with --port"
    ]


async def test_stop_never_signals_a_process_that_is_no_navi_daemon(
    env: dict[str, str], tmp_path: Path
) -> None:
    # A pid file left by a killed daemon, its pid since taken by another program.
    data = Path(env["NAVI_DATA_DIR"])
    data.mkdir(parents=True)  # noqa: ASYNC240
    other = await trio.lowlevel.open_process(["sleep", "60"])
    try:
        pid_file(data, 9999).write_text(f"{other.pid}\n")
        done = await forked("stop", "--port", "9999", env=env, cwd=tmp_path)
        assert done.code == 0 and "is gone already: its stale pid file is removed" in done.out
        assert other.returncode is None and other.poll() is None  # not signalled
        assert not pid_file(data, 9999).exists()
    finally:
        other.kill()
        with trio.CancelScope(shield=True):
            await other.wait()


async def test_a_program_on_the_port_never_gets_the_local_token(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Asking who answers at a port sends this data folder's token only to the daemon its
    pid file names: a WebSocket server that took the port gets a handshake, no hello."""
    from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

    data = Path(env["NAVI_DATA_DIR"])
    data.mkdir(parents=True)  # noqa: ASYNC240
    (data / "local-token").write_text("the-local-admin-token\n")  # noqa: ASYNC240
    heard: list[str] = []

    async def handler(request: WebSocketRequest) -> None:
        ws = await request.accept()
        try:
            heard.append(str(await ws.get_message()))
        except ConnectionClosed:
            pass  # a handshake only

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        port = str(server.port)
        done = await forked("serve", "--port", port, env=env, cwd=tmp_path)
        assert "or another WebSocket server, answers there" in _one_error_line(done)
        status = await forked("status", "--port", port, env=env, cwd=tmp_path)
        assert status.out.splitlines()[0] == (
            f"ws://127.0.0.1:{port}/  a navi daemon of another data folder, or another "
            "WebSocket server"
        )
        nursery.cancel_scope.cancel()
    assert not any("the-local-admin-token" in text for text in heard), heard
