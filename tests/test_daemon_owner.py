"""A client gives its token only to a daemon of an account it trusts.

Any account on the machine may bind 127.0.0.1:8765 while no daemon holds it and collect
the local admin token from the next `navi run`, `navi chat`, `navi sessions`. So before
its hello `open_daemon` looks up the socket at the other end of its connection in the
kernel's table: an account it does not trust (not root, not its own, not the token
file's owner, not named in NAVI_DAEMON_USERS) gets nothing.

Rules: real TCP sockets and WebSocket servers on 127.0.0.1. The squatter of the slow test
is a real process of another account (`nobody`, which needs root to start), speaking the
WebSocket handshake by hand and printing every frame it receives; the client is the real
`navi sessions` command. Every test has an absolute time limit.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

from navi_trio.api.daemon_client import open_daemon
from navi_trio.api.listener import other_end, trusted_accounts
from navi_trio.errors import ConfigError, UntrustedDaemonError

TIMEOUT = 30
TOKEN = "navi_the-local-admin-token-0123456789"


async def test_the_other_end_of_a_connection_is_found_with_its_account() -> None:
    with trio.fail_after(TIMEOUT):
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::")):
            with trio.socket.socket(family) as sock:
                if family == socket.AF_INET6:  # dual-stack: v4 peers are listed in tcp6
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                await sock.bind((host, 0))
                sock.listen(1)
                port = sock.getsockname()[1]
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                accepted, _ = await sock.accept()
                local, remote = stream.socket.getsockname(), stream.socket.getpeername()
                found = other_end(
                    (ipaddress.ip_address(local[0]), local[1]),
                    (ipaddress.ip_address(remote[0]), remote[1]),
                )
                assert found is not None and found.established, (host, found)
                assert found.uid == os.geteuid()
                accepted.close()
                await stream.aclose()


def test_the_trusted_accounts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "local-token").write_text(TOKEN)
    os.chown(data / "local-token", os.geteuid(), os.getegid())
    env = {"NAVI_DATA_DIR": str(data), "NAVI_DAEMON_USERS": "nobody, 4321"}
    assert trusted_accounts(env) == {0, os.geteuid(), 65534, 4321}
    assert trusted_accounts({"NAVI_DATA_DIR": str(tmp_path / "none")}) == {0, os.geteuid()}
    with pytest.raises(ConfigError, match="'no-such-account' is no account"):
        trusted_accounts({"NAVI_DAEMON_USERS": "no-such-account"})


@pytest.mark.slow  # waits out a 2 s hello timeout on the real clock
async def test_a_listener_of_an_untrusted_account_gets_no_hello_and_a_trusted_one_does() -> None:
    heard: list[str] = []

    async def squatter(request: WebSocketRequest) -> None:
        ws = await request.accept()
        with contextlib.suppress(ConnectionClosed):
            while True:
                heard.append(str(await ws.get_message()))

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                partial(serve_websocket, squatter, "127.0.0.1", 0, ssl_context=None)
            )
            url = f"ws://127.0.0.1:{server.port}/"
            # This process's own account, left out: as a squatter of another account is.
            others = {os.geteuid() + 4242}
            with pytest.raises(UntrustedDaemonError) as info:
                async with open_daemon(url, TOKEN, accounts=others, hello_timeout=2):
                    pass
            assert "the token was not sent" in str(info.value)
            assert f"uid {os.geteuid()}" in str(info.value)
            await trio.testing.wait_all_tasks_blocked()
            assert heard == []
            with pytest.raises(Exception, match="did not answer the hello"):  # no welcome
                async with open_daemon(url, TOKEN, accounts={os.geteuid()}, hello_timeout=2):
                    pass
            assert any(TOKEN in text for text in heard), heard
            nursery.cancel_scope.cancel()


# A WebSocket squatter in the standard library only (it runs as `nobody`): it takes the
# handshake, prints the first frame it gets (unmasked) and closes.
SQUATTER = r"""
import base64, hashlib, socket, struct
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    conn.settimeout(20)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                raise EOFError("a connection without a handshake")
            data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n")
               if l.lower().startswith(b"sec-websocket-key:")][0]
        magic = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        accept = base64.b64encode(hashlib.sha1(key + magic).digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        while len(data) < 2:
            data += conn.recv(4096)
        size, at = data[1] & 127, 2
        if size == 126:
            size, at = struct.unpack(">H", data[2:4])[0], 4
        while len(data) < at + 4 + size:
            data += conn.recv(65536)
        mask, body = data[at:at + 4], data[at + 4:at + 4 + size]
        text = bytes(b ^ mask[i % 4] for i, b in enumerate(body))
        print("FRAME", data[0] & 15, text.decode("utf-8", "replace"), flush=True)
    except Exception as exc:
        print("GONE", type(exc).__name__, flush=True)
    conn.close()
"""


async def navi(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    """The real `navi` command with `env`, its output captured."""
    return await trio.run_process(
        [sys.executable, "-m", "navi_trio", *args], env=env,
        capture_stdout=True, capture_stderr=True, check=False,
    )  # fmt: skip


@asynccontextmanager
async def squatter_of_nobody() -> AsyncIterator[tuple[int, list[str]]]:
    """SQUATTER running as `nobody` (root starts it): its port, and once it is killed on
    the way out, the frames it printed ("FRAME opcode text"), in order."""
    squatter = await trio.lowlevel.open_process(
        ["/usr/bin/python3", "-I", "-c", SQUATTER],
        stdout=-1, user=65534, group=65534, extra_groups=[], cwd="/",
    )  # fmt: skip
    assert squatter.stdout is not None
    frames: list[str] = []
    try:
        yield int((await squatter.stdout.receive_some(100)).split()[0]), frames
    finally:
        squatter.kill()
        await squatter.wait()
        heard = b""
        while chunk := await squatter.stdout.receive_some():
            heard += chunk
        frames += [line for line in heard.decode().splitlines() if line.startswith("FRAME")]


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="a socket of another account needs root")
async def test_navi_sessions_gives_a_squatter_of_another_account_nothing(
    tmp_path: Path, env: dict[str, str]
) -> None:
    token_file = trio.Path(env["NAVI_DATA_DIR"]) / "local-token"
    await token_file.parent.mkdir(parents=True)
    await token_file.write_text(TOKEN + "\n")
    with trio.fail_after(120):
        async with squatter_of_nobody() as (port, frames):
            url = f"ws://127.0.0.1:{port}/"
            refused = await navi(env, "sessions", "--url", url)
            said = refused.stderr.decode()
            assert refused.returncode == 1, said
            assert "a socket of nobody (uid 65534)" in said and "the token was not sent" in said
            # Trusted by name, the same squatter gets the hello, the token in it.
            trusting = await navi({**env, "NAVI_DAEMON_USERS": "nobody"}, "sessions", "--url", url)
            assert trusting.returncode == 1
    # The refused client sent only its close frame (opcode 8); the trusting one, the hello.
    assert frames[0].startswith("FRAME 8") and TOKEN not in frames[0], frames
    assert frames[1].startswith("FRAME 1") and TOKEN in frames[1], frames


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="a socket of another account needs root")
async def test_navi_status_and_serve_never_give_a_squatter_the_token_their_pid_file_names(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The pid file of this data folder names a live navi process on the port, but what
    answers there is a socket of another account: `navi status` and `navi serve` say
    whose, and send it nothing of the token."""
    data = trio.Path(env["NAVI_DATA_DIR"])
    await data.mkdir(parents=True)
    await (data / "local-token").write_text(TOKEN + "\n")
    # A live process whose command line is navi's, as a recycled pid would be.
    named = await trio.lowlevel.open_process(
        [sys.executable, "-c", "import time; time.sleep(600)", "navi_trio"]
    )
    try:
        with trio.fail_after(120):
            async with squatter_of_nobody() as (port, frames):
                await (data / f"navi-serve-{port}.pid").write_text(f"{named.pid}\n")
                status = await navi(env, "status", "--port", str(port))
                line = status.stdout.decode().splitlines()[0]
                assert f"pid {named.pid}" in line, line
                assert "not trusted with the token (the socket belongs to nobody" in line
                served = await navi(env, "serve", "--port", str(port))
                said = served.stderr.decode()
                assert served.returncode == 1, said
                assert f"port {port} (127.0.0.1) is in use: the pid file of this data" in said
                assert "the socket belongs to nobody (uid 65534); nothing was sent" in said
    finally:
        named.kill()
        await named.wait()
    assert frames and all(f.startswith("FRAME 8") for f in frames), frames  # closes only
    assert not any(TOKEN in f for f in frames), frames
