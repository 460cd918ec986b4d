"""Finding the daemon: its token, and starting one in the background when none answers.

`ensure_daemon` is the one place `navi chat` starts a process: when nothing accepts
connections at the URL's loopback address it runs ``python -m navi_trio serve --port
P`` detached (its output in ``data_dir/navi-serve-P.log``) and waits, bounded, until
the port accepts. The command is a parameter so tests can use a stand-in script.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import trio

from navi_trio.api.daemon_client import open_daemon
from navi_trio.backoff import backoff_delay
from navi_trio.errors import DaemonUnreachableError, NaviError, UsageError

TOKEN_FILE = "local-token"
DAEMON_FILES = "navi-serve-"  # navi-serve-PORT.pid, navi-serve-PORT.log in the data folder
ERROR_PREFIX = "navi: error: "  # how a `navi` command says why it failed (cli/__init__.py)
ERROR_TAIL = 64 * 1024  # bytes of a failed start's log read for its error line
START_TIMEOUT = 20.0
PROBE_TIMEOUT = 1.0
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def pid_file(data_dir: Path, port: int) -> Path:
    """The pid file of the daemon on `port` (written by the daemon once it listens)."""
    return data_dir / f"{DAEMON_FILES}{port}.pid"


def log_file(data_dir: Path, port: int) -> Path:
    """The log of a daemon `navi chat` started in the background on `port`."""
    return data_dir / f"{DAEMON_FILES}{port}.log"


def find_token(given: str | None, environ: Mapping[str, str], data_dir: Path) -> str:
    """--token, else NAVI_TOKEN, else the daemon's local-token file, else ""."""
    if given:
        return given
    if environ.get("NAVI_TOKEN"):
        return environ["NAVI_TOKEN"]
    try:
        return (data_dir / TOKEN_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def token_hint(data_dir: Path, given: bool) -> str:
    """What to do about a token the daemon refused: where the local admin's token is.
    `given`: the token came from --token or NAVI_TOKEN (else from the local-token file).
    """
    path = data_dir / TOKEN_FILE
    if given:
        return (
            f"on a machine of your own the local admin's token is in {path}: leave out "
            "--token and NAVI_TOKEN to use it"
        )
    if path.is_file():
        return (
            f"the token in {path} is not this daemon's (a daemon keeps its own in its data "
            "folder, NAVI_DATA_DIR): pass its token with --token or NAVI_TOKEN"
        )
    return (
        f"there is no local token in {data_dir} (a daemon writes one there when it starts "
        "with this data folder): pass a token with --token or NAVI_TOKEN"
    )


def host_port(url: str) -> tuple[str, int]:
    """The host and port of the daemon at `url` (--url); `UsageError` naming what is
    wrong with it when it is not a ws:// or wss:// address."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        hint = "such as ws://127.0.0.1:8765"
        if parts.scheme in ("http", "https") and parts.netloc:  # the browser page's address
            ws = "wss" if parts.scheme == "https" else "ws"
            hint = f"(the page's address is not the daemon's: {ws}://{parts.netloc}/)"
        raise UsageError(f"--url {url[:80]!r}: expected a ws:// or wss:// URL {hint}")
    try:
        port = parts.port or (443 if parts.scheme == "wss" else 80)
    except ValueError:
        raise UsageError(f"--url {url[:80]!r}: the port is not a number from 1 to 65535") from None
    return parts.hostname, port


async def answers(host: str, port: int) -> bool:
    """Whether something accepts TCP connections at host:port (within PROBE_TIMEOUT)."""
    with trio.move_on_after(PROBE_TIMEOUT):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError:
            return False
        await stream.aclose()
        return True
    return False


def serve_command(port: int, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "navi_trio", "serve", "--port", str(port), *extra]


async def daemon_needed(url: str) -> bool:
    """Whether `ensure_daemon` would start a daemon for `url` (loopback, nothing answers)."""
    host, port = host_port(url)
    return host in _LOOPBACK and not await answers(host, port)


async def daemon_backend(url: str, token: str) -> str | None:
    """The LLM backend the daemon at `url` says it runs with (its welcome), or None."""
    with trio.move_on_after(PROBE_TIMEOUT * 5):
        try:
            async with open_daemon(url, token, connect_timeout=PROBE_TIMEOUT) as daemon:
                backend = daemon.welcome.get("llm_backend")
        except NaviError:  # unreachable, or the token refused: the chat will say so
            return None
        return backend if isinstance(backend, str) else None
    return None


def _spawn(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        # Detached on purpose: the daemon outlives this chat (own session), so it is
        # no task of ours.
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ),
        )


async def ensure_daemon(
    url: str, data_dir: Path, command: Sequence[str] | None = None, serve_args: Sequence[str] = ()
) -> str | None:
    """Start a background daemon if none answers at `url`; the line to show, or None."""
    host, port = host_port(url)
    if host not in _LOOPBACK or await answers(host, port):
        return None  # another machine's daemon is not ours to start: connecting will tell
    log_path = log_file(data_dir, port)
    start = log_path.stat().st_size if log_path.exists() else 0  # where this start writes
    proc = _spawn(list(command or serve_command(port, serve_args)), log_path)
    probes = 0
    with trio.move_on_after(START_TIMEOUT):
        while True:
            # Waiting on another process's socket: there is no event to wait on, so
            # probe with backoff (bounded by START_TIMEOUT).
            if proc.poll() is not None:
                why = error_line(log_path, start) or f"it exited with code {proc.returncode}"
                raise DaemonUnreachableError(
                    f"the background daemon did not start: {why} (log: {log_path})"
                )
            if await answers(host, port):
                return (
                    f"started a navi daemon in the background on {host}:{port} "
                    f"(pid {proc.pid}, log: {log_path})"
                )
            probes += 1
            await trio.sleep(backoff_delay(probes, base=0.05, cap=0.5))
    raise DaemonUnreachableError(
        f"started `navi serve` but it did not accept connections within {START_TIMEOUT:.0f}s; "
        f"see {log_path}"
    )


def error_line(log_path: Path, start: int) -> str | None:
    """Why a start failed, from what it wrote to its log after byte `start`: its last
    ``navi: error:`` line (without the prefix), else its last line; None when it wrote
    nothing."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(start, f.seek(0, os.SEEK_END) - ERROR_TAIL))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    lines = [line.strip() for line in lines if line.strip()]
    errors = [line for line in lines if line.startswith(ERROR_PREFIX)]
    if errors:
        return errors[-1].removeprefix(ERROR_PREFIX)
    return lines[-1] if lines else None
