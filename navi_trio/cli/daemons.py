"""The daemons of a data folder: their pid files, `navi status`, `navi stop`, and what
answers at a port that is in use.

Each port has its own ``navi-serve-PORT.pid`` (written once the daemon listens, removed
when it stops) and ``.log``. A pid file whose process is gone (a SIGKILL) is named
stale, never trusted: `navi stop` checks that the pid is still a navi process.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import time
from pathlib import Path
from typing import TextIO

import attrs
import trio

from navi_trio.api.listener import USERS_VAR, trusted_accounts
from navi_trio.client.daemon import DAEMON_FILES, answers, find_token, log_file, pid_file
from navi_trio.errors import NaviError, RemoteError, UntrustedDaemonError, UsageError
from navi_trio.settings import Settings
from navi_trio.text import terminal_safe

PROBE_TIMEOUT = 2.0  # a daemon on this machine answers a hello at once
STOP_MARGIN_SEC = 30.0  # beyond shutdown_wait_tasks_sec: stopping runs, closing the store
DEFAULT_PORT = 8765


@attrs.define
class PidFile:
    """This process's pid file for `port`, while it serves (`write`, `remove`)."""

    data_dir: Path
    port: int

    @property
    def path(self) -> Path:
        return pid_file(self.data_dir, self.port)

    def write(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{os.getpid()}\n", encoding="utf-8")
        os.replace(tmp, self.path)  # whole or not at all

    def remove(self) -> None:
        """Remove it if it is still ours (a later daemon on the port may have its own)."""
        if read_pid(self.path) == os.getpid():
            self.path.unlink(missing_ok=True)


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def is_navi(pid: int) -> bool:
    """Whether process `pid` runs (not a zombie) and is a navi command (its command line)."""
    from navi_trio.store.fence import pid_alive

    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc here: trust the pid
    words = [w.decode(errors="replace") for w in cmdline]
    return any(w == "navi_trio" or w.endswith("/navi") or w == "navi" for w in words)


def _running(path: Path) -> bool:
    pid = read_pid(path)
    return pid is not None and is_navi(pid)


def _ports(data_dir: Path) -> list[int]:
    found = []
    for path in data_dir.glob(f"{DAEMON_FILES}*.pid"):
        number = path.name.removeprefix(DAEMON_FILES).removesuffix(".pid")
        if number.isdigit():
            found.append(int(number))
    return sorted(found)


@attrs.frozen
class Answer:
    """What answers at a port: nothing, no WebSocket server, a navi daemon of this data
    folder (`ours`, with its `backend`), another WebSocket server (`navi`: most likely
    another data folder's daemon), or a socket of an account the folder does not trust
    with its token (`untrusted`)."""

    navi: bool = False
    listening: bool = False
    ours: bool = False
    backend: str | None = None
    untrusted: str | None = None


async def probe(port: int, data_dir: Path, host: str = "127.0.0.1") -> Answer:
    """Who answers at host:port. The local admin's token goes only to the daemon this
    folder's pid file names, through a socket of an account the folder trusts: a program
    that took the port never gets it. Of any other, a WebSocket handshake (no hello) tells
    whether it may be navi."""
    from navi_trio.api.daemon_client import open_daemon
    from navi_trio.api.remote import daemon_answers

    if not await answers(host, port):
        return Answer()
    url = f"ws://{_url_host(host)}:{port}/"
    if _running(pid_file(data_dir, port)):
        accounts = trusted_accounts(os.environ, data_dir)
        try:
            with trio.fail_after(PROBE_TIMEOUT * 2):
                token = find_token(None, {}, data_dir)
                async with open_daemon(
                    url, token, connect_timeout=PROBE_TIMEOUT, accounts=accounts
                ) as daemon:
                    backend = daemon.welcome.get("llm_backend")
                    backend = backend if isinstance(backend, str) else None
                    return Answer(navi=True, listening=True, ours=True, backend=backend)
        except UntrustedDaemonError as exc:
            return Answer(listening=True, untrusted=exc.reason or str(exc))
        except RemoteError:
            return Answer(navi=True, listening=True)  # it refused this folder's token
        except (NaviError, trio.TooSlowError):
            pass
    return Answer(navi=await daemon_answers(url, PROBE_TIMEOUT), listening=True)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def port_in_use(host: str, port: int, data_dir: Path) -> str:
    """The one line for a port `navi serve` cannot take: who answers there, what to do."""
    answer = trio.run(probe, port, data_dir, "127.0.0.1" if host in ("0.0.0.0", "") else host)
    where = f"port {port} ({host}) is in use"
    if answer.untrusted:
        pid = read_pid(pid_file(data_dir, port))
        return (
            f"{where}: the pid file of this data folder names pid {pid} there, but what "
            f"answers is not trusted with its token ({answer.untrusted}; nothing was sent): "
            f"choose another port with --port, or name that account in {USERS_VAR} if it "
            "runs your daemon"
        )
    if answer.ours:
        pid = read_pid(pid_file(data_dir, port))
        whose = f" (pid {pid})" if pid is not None else ""
        return (
            f"{where}: a navi daemon of this data folder answers there{whose}, backend "
            f"{answer.backend or '?'}: use it, stop it with `navi stop --port {port}`, or "
            "choose another port with --port"
        )
    if answer.navi:
        return (
            f"{where}: a navi daemon of another data folder (no pid file of it in {data_dir}), "
            "or another WebSocket server, answers there: choose another port with --port"
        )
    return f"{where} by a program that is not a navi daemon: choose another port with --port"


def check_port(host: str, port: int, data_dir: Path) -> None:
    """UsageError naming who has host:port, before anything else starts (port 0: any)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return  # the server says what else is wrong, when it binds
            raise UsageError(port_in_use(host, port, data_dir)) from None


def address_in_use(group: BaseException) -> bool:
    """Whether `group` (a nursery's) is a failure to bind: the port was taken meanwhile."""
    if isinstance(group, BaseExceptionGroup):
        return any(address_in_use(e) for e in group.exceptions)
    return isinstance(group, OSError) and group.errno == errno.EADDRINUSE


@attrs.frozen
class DaemonState:
    port: int
    pid: int | None
    running: bool  # the pid is a live navi process
    since: float | None  # when it began listening (its pid file's time)
    answer: Answer
    log: Path | None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"


async def daemon_states(data_dir: Path, also: int = DEFAULT_PORT) -> list[DaemonState]:
    """Every daemon with a pid file in `data_dir`, and the one answering on `also`."""
    states = []
    for port in sorted({*_ports(data_dir), also}):
        path = pid_file(data_dir, port)
        pid = read_pid(path)
        running = pid is not None and is_navi(pid)
        answer = await probe(port, data_dir)
        if pid is None and not answer.listening:
            continue  # the default port, and nothing there
        since = path.stat().st_mtime if pid is not None and path.exists() else None
        log = log_file(data_dir, port)
        states.append(DaemonState(port, pid, running, since, answer, log if log.exists() else None))
    return states


def status_line(state: DaemonState, now: float) -> str:
    a = state.answer
    if state.pid is not None and not state.running:
        return f"port {state.port}: the daemon of pid {state.pid} is gone (a stale pid file)"
    if state.pid is None:  # what answers on the default port, with no pid file here
        if a.navi:
            return f"{state.url}  a navi daemon of another data folder, or another WebSocket server"
        return f"{state.url}  in use by a program that is not a navi daemon"
    since = ""
    if state.since is not None:
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(state.since))
        since = f"  since {stamp} ({_age(now - state.since)})"
    if a.untrusted:
        answers = f"not trusted with the token ({a.untrusted}; nothing sent, see {USERS_VAR})"
    elif a.ours:
        answers = f"backend {a.backend or '?'}"
    else:
        answers = "refuses this data folder's token" if a.navi else "not answering"
    log = f"  log {state.log}" if state.log is not None else "  log: its terminal (navi serve)"
    return f"{state.url}  pid {state.pid}{since}  {answers}{log}"


def _age(seconds: float) -> str:
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def cmd_status(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    settings = Settings.from_env()
    states = trio.run(daemon_states, settings.data_dir, args.port)
    now = time.time()
    for state in states:
        print(terminal_safe(status_line(state, now)), file=out)
    if not any(s.running or s.answer.navi for s in states):
        print(
            f"no navi daemon runs from {settings.data_dir} (`navi serve` or `navi chat` "
            "starts one)",
            file=out,
        )
        return 1
    return 0


def cmd_stop(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    settings = Settings.from_env()
    data_dir = settings.data_dir
    if args.port is not None:
        port = args.port
    else:
        live = [
            p for p in _ports(data_dir) if (pid := read_pid(pid_file(data_dir, p))) and is_navi(pid)
        ]
        if not live:
            print(f"no navi daemon of {data_dir} runs: nothing to stop", file=out)
            return 0
        if len(live) > 1:
            ports = ", ".join(str(p) for p in live)
            raise UsageError(f"navi daemons run on ports {ports}: say which with --port")
        (port,) = live
    path = pid_file(data_dir, port)
    pid = read_pid(path)
    if pid is None:
        print(
            f"no navi daemon of {data_dir} runs on port {port} (no pid file): nothing to stop",
            file=out,
        )
        return 0
    if not is_navi(pid):
        path.unlink(missing_ok=True)
        print(
            f"the daemon on port {port} (pid {pid}) is gone already: its stale pid file is removed",
            file=out,
        )
        return 0
    limit = settings.shutdown_wait_tasks_sec + STOP_MARGIN_SEC
    print(f"stopping the navi daemon on port {port} (pid {pid})…", file=out, flush=True)
    os.kill(pid, signal.SIGTERM)
    if trio.run(_wait_exit, pid, limit):
        print(f"stopped (pid {pid})", file=out)
        return 0
    raise NaviError(
        f"the daemon (pid {pid}) is still shutting down after {limit:g} s (it waits for "
        f"background tasks up to NAVI_SHUTDOWN_WAIT_TASKS_SEC); `kill -9 {pid}` ends it now"
    )


async def _wait_exit(pid: int, limit: float) -> bool:
    """Whether process `pid` (not our child) exits within `limit` seconds: its pidfd
    turns readable when it does."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        with trio.move_on_after(limit):
            await trio.lowlevel.wait_readable(fd)
            return True
        return False
    finally:
        os.close(fd)
