"""A throwaway OpenSSH server on 127.0.0.1 for the ssh_exec tests (issue 12).

`sshd_server` is a session-scoped fixture: when ``/usr/sbin/sshd`` exists it makes a
host key and a client key (ssh-keygen) in a temp folder, writes an sshd_config (only
127.0.0.1 on a free port, only that client key, no PAM, no password, StrictModes off),
starts ``sshd -D -e -f CONFIG`` as a child, waits for its "Server listening" line (a
thread drains its log, so it never blocks on a full pipe), writes the known_hosts file,
checks one real login, and stops it at the end of the session. The tests log in as the
user running them. When sshd is missing or cannot start, every test that uses it is
SKIPPED with the reason (``-rs`` shows it): never silently passed.

As root, sshd needs its privilege separation folder (/run/sshd, which the Debian
package's service would create): the fixture creates it when it is missing.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")
START_SEC = 30.0  # only a broken start waits this long
LOGIN_SEC = 30.0
TRIES = 3  # another process may take the free port before sshd binds it


@attrs.frozen
class SshServer:
    port: int
    user: str
    client_key: Path
    known_hosts: Path
    folder: Path
    log: Path

    def host(self, commands: list[str] | None = None, **extra: Any) -> dict[str, Any]:
        """A host entry of config.json's ``ssh.hosts`` for this server."""
        return {
            "user": self.user,
            "host": "127.0.0.1",
            "port": self.port,
            "identity_file": str(self.client_key),
            "commands": commands or ["*"],
            **extra,
        }

    def ssh_section(self, **hosts: list[str] | None) -> dict[str, Any]:
        """config.json's ``ssh`` section: one alias per keyword, its allowed commands."""
        return {
            "known_hosts": str(self.known_hosts),
            "hosts": {alias: self.host(commands) for alias, commands in hosts.items()},
        }


class _Log:
    """Drains sshd's stderr into a file; `settled` is set once it listens or ends."""

    def __init__(self, stream: Any, path: Path) -> None:
        self.lines: list[str] = []
        self.listening = False
        self.settled = threading.Event()
        self._thread = threading.Thread(target=self._drain, args=(stream, path), daemon=True)
        self._thread.start()

    def _drain(self, stream: Any, path: Path) -> None:
        with path.open("a", encoding="utf-8") as out:
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.lines.append(line)
                out.write(line + "\n")
                out.flush()
                if "Server listening on" in line:
                    self.listening = True
                    self.settled.set()
        self.settled.set()

    def join(self) -> None:
        self._thread.join(timeout=5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "navi-test", "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=60,
    )


def _config(folder: Path, port: int, user: str) -> Path:
    path = folder / "sshd_config"
    lines = [
        f"ListenAddress 127.0.0.1:{port}",
        f"HostKey {folder / 'host_key'}",
        f"AuthorizedKeysFile {folder / 'authorized_keys'}",
        f"PidFile {folder / 'sshd.pid'}",
        f"AllowUsers {user}",
        "UsePAM no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password",
        "StrictModes no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "LogLevel INFO",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def start_sshd(folder: Path, user: str) -> tuple[subprocess.Popen[bytes], _Log, int] | str:
    """A listening sshd, or why none could start."""
    why = "no attempt"
    for attempt in range(TRIES):
        port = _free_port()
        config = _config(folder, port, user)
        process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        log = _Log(process.stderr, folder / "sshd.log")
        log.settled.wait(START_SEC)
        if log.listening:
            return process, log, port
        _stop(process)
        log.join()
        why = f"sshd did not start (try {attempt + 1}): " + " | ".join(log.lines[-5:])
    return why


def _login_check(server: SshServer) -> str | None:
    """None when a plain ssh login works, else what went wrong."""
    argv = [
        "ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={server.known_hosts}", "-o", "IdentitiesOnly=yes",
        "-i", str(server.client_key), "-p", str(server.port), f"{server.user}@127.0.0.1",
        "--", "true",
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, timeout=LOGIN_SEC, text=True)
    except subprocess.TimeoutExpired:
        return f"a test login did not finish within {LOGIN_SEC:g} s"
    if done.returncode != 0:
        return f"a test login failed (exit {done.returncode}): {done.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    if not SSHD.exists():
        pytest.skip(f"{SSHD} not found: install openssh-server (.ci/run does, as root)")
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found: install openssh-client")
    if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    folder = tmp_path_factory.mktemp("sshd")
    user = pwd.getpwuid(os.getuid()).pw_name
    _keygen(folder / "host_key")
    _keygen(folder / "client_key")
    shutil.copy(folder / "client_key.pub", folder / "authorized_keys")
    started = start_sshd(folder, user)
    if isinstance(started, str):
        pytest.skip(started)
    process, log, port = started
    host_key = (folder / "host_key.pub").read_text(encoding="utf-8").strip()
    known_hosts = folder / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_key}\n", encoding="utf-8")
    server = SshServer(
        port=port,
        user=user,
        client_key=folder / "client_key",
        known_hosts=known_hosts,
        folder=folder,
        log=folder / "sshd.log",
    )
    try:
        problem = _login_check(server)
        if problem is not None:
            pytest.skip(f"sshd runs but {problem}; its log: {' | '.join(log.lines[-5:])}")
        yield server
    finally:
        _stop(process)
        log.join()
