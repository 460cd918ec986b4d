"""`navi` commands forked from one warm process instead of a new interpreter each.

A `python -m navi_trio` process spends most of a short command on starting Python and
importing navi (0.3 s of a 0.35 s `navi --version`, on a quiet machine). For tests whose
subject is what a command does, not how a new interpreter starts it, this module keeps
one process per test process (the fork server, started on first use) that has imported
the commands' modules once, and forks it for each command. The child is a real process
of its own: its own pid, exit code, signals, stdin/stdout/stderr (the caller's pipes or
terminal, passed over a Unix socket), environment, working folder and umask; it runs
``navi_trio.__main__`` as ``python -m navi_trio`` does, and ends as Python ends (threads
joined, atexit, streams flushed). Its command line is the server's, which ends in
"navi_trio" as `python -m navi_trio`'s does. What differs from a new interpreter: the
modules are already imported and the token encoding loaded (a test of start-up, of
what gets imported or of the encoding's load needs `python -m navi_trio` itself),
`sys.flags` are the fork server's, and so is what /proc/PID/environ shows (the
environment a process started with; `os.environ`, and what the child passes on, are the
caller's).

A caller that must spawn the command itself (an SDK's stdio client) gets
`attach_command`: a small process that hands its own stdio to the server and passes
signals on. A server with more modules imported (`warm`, e.g. the MCP server's) is a
server of its own; it can also run a test's helper script (`python SCRIPT ARGS`).

Lifetimes: the server ends when the test process that started it does (end of file on
its stdin); a child is killed when its request's connection closes (the test process
ended, or the caller gave up on it), and dies with the server (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

# What the commands the tests run import on their way (run, serve, doctor, chat, the
# store): imported once here rather than in every child.
WARM = (
    "navi_trio.cli",
    "navi_trio.cli.run",
    "navi_trio.cli.serve",
    "navi_trio.cli.doctor",
    "navi_trio.cli.daemons",
    "navi_trio.store.sqlite",
    "navi_trio.store._sqlite_utils",  # a new database's migrations
    "navi_trio.api.metrics",
    "navi_trio.web",
    "navi_trio.store.postgres",  # psycopg: the cluster tests' daemons (tests/daemons.py)
    "navi_trio.client.app",
)
# One server for the agents' tests (MCP server, ACP agent and the ACP SDK's client
# script): a server started for each set would cost a start each on every worker.
AGENTS_WARM = (
    "navi_trio.cli.mcp_server",
    "navi_trio.acp.serve",
    "navi_trio.acp.backend",
    "acp_sdk_client",
)
START_LIMIT = 120  # real seconds for the server's imports (a busy 2-core machine)
_HEADER = struct.Struct("!I")
_PR_SET_PDEATHSIG = 1


# ---------------------------------------------------------------- the fork server


def _serve(path: str, warm: list[str]) -> tuple[str, list[str]]:
    """Import (WARM and `warm`), listen at `path`, and fork for each request. Returns
    only in a child, once it is the process asked for: the script it runs ("": navi)
    and its arguments."""
    import importlib

    from navi_trio import class_code
    from navi_trio.imports import start_up_collections

    with start_up_collections():
        class_code.install()  # as navi_trio.__main__ does before the cli's imports
        for name in [*WARM, *warm]:
            importlib.import_module(name)
    _load_token_encoding()
    assert threading.active_count() == 1, "a fork server must have no other thread"
    assert os.listdir("/proc/self/task") == [str(os.getpid())], "nor a native one"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ, ("control", None))
    sel.register(listener, selectors.EVENT_READ, ("accept", None))
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd: (pid, connection)
    by_conn: dict[socket.socket, int] = {}  # connection: its child's pidfd

    def forget(conn: socket.socket) -> None:
        sel.unregister(conn)
        by_conn.pop(conn, None)
        conn.close()

    while True:
        for key, _ in sel.select():
            kind, conn = key.data
            if kind == "control":
                if not os.read(0, 1024):  # the test process ended
                    for pidfd in children:
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    os.unlink(path)
                    os.rmdir(os.path.dirname(path))
                    os._exit(0)
            elif kind == "accept":
                conn, _ = listener.accept()
                request, fds = _receive(conn)
                set_up, done = os.pipe()
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    listener.close()
                    for other in [*by_conn, conn]:
                        other.close()
                    for pidfd in children:
                        os.close(pidfd)
                    os.close(set_up)
                    return _child(request, fds, done)
                os.close(done)
                for fd in fds:
                    os.close(fd)
                os.read(set_up, 1)  # its pid is told once it is what was asked (or gone)
                os.close(set_up)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, conn)
                by_conn[conn] = pidfd
                sel.register(pidfd, selectors.EVENT_READ, ("child", None))
                sel.register(conn, selectors.EVENT_READ, ("conn", conn))
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            elif kind == "child":
                pidfd = key.fd
                pid, conn = children.pop(pidfd)
                _, status = os.waitpid(pid, 0)
                sel.unregister(pidfd)
                os.close(pidfd)
                if conn in by_conn:
                    code = os.waitstatus_to_exitcode(status)
                    try:
                        conn.sendall(json.dumps({"code": code}).encode() + b"\n")
                    except OSError:
                        pass  # the caller is gone
                    forget(conn)
            else:  # a signal to send, or the caller gone
                pidfd = by_conn[conn]
                try:
                    data = conn.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    forget(conn)
                    continue
                for line in data.splitlines():
                    try:
                        signal.pidfd_send_signal(pidfd, int(line))
                    except ProcessLookupError:
                        pass  # it has just ended: its exit code is on the way


def _load_token_encoding() -> None:
    """Load the token encoding once, here: tiktoken keeps it per process, so a forked
    daemon's start-up load (0.7 s of a forked `navi serve`'s 1.3 s, measured on a busy
    machine) finds it ready. A start that has to load it is test_api_daemon's, on a new
    interpreter."""
    import tiktoken

    from navi_trio.core.turn.tokens import ENCODING_NAME

    tiktoken.get_encoding(ENCODING_NAME)


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request: a length, then its JSON, with the child's stdio fds beside it."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < _HEADER.size:
        data += conn.recv(1 << 16)
    (size,) = _HEADER.unpack_from(data)
    while len(data) < _HEADER.size + size:
        data += conn.recv(1 << 16)
    return json.loads(data[_HEADER.size :]), list(fds)


def _child(request: dict[str, Any], fds: list[int], done: int) -> tuple[str, list[str]]:
    """In the forked child: become the requested process, up to running navi; then
    close `done`, on which the server waits."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if request["tty"]:  # a terminal of its own, as pexpect gives its child
        os.setsid()
        fcntl.ioctl(fds[0], termios.TIOCSCTTY, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    script = str(request.get("script") or "")
    # As Python puts the script's folder first, or with `-m` the working folder.
    sys.path[0] = os.path.dirname(script) if script else request["cwd"]
    _stdio()
    os.close(done)
    return script, list(request["args"])


def _stdio() -> None:
    """New sys.stdin/stdout/stderr on fds 0-2, made as a new interpreter makes them
    (line-buffered on a terminal, stderr always)."""
    import io

    def text(fd: int, mode: str, errors: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        buffered: io.BufferedReader | io.BufferedWriter = (
            io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        )
        tty = raw.isatty()
        return io.TextIOWrapper(
            buffered, encoding="utf-8", errors=errors,
            line_buffering=tty or fd == 2, write_through=fd == 2,
        )  # fmt: skip

    for name, stream in (
        ("stdin", text(0, "r", "strict")),
        ("stdout", text(1, "w", "strict")),
        ("stderr", text(2, "w", "backslashreplace")),
    ):
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _run_navi(args: list[str], script: str = "") -> None:
    """`python -m navi_trio ARGS` (or `python SCRIPT ARGS`) in this process, then exit as
    Python would."""
    import runpy
    import traceback

    import navi_trio

    sys.argv = [script or str(Path(navi_trio.__file__).parent / "__main__.py"), *args]
    code: int = 0
    interrupted = False
    try:
        if script:  # `python SCRIPT ARGS`
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module("navi_trio", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        if exit_.code is None:
            code = 0
        elif isinstance(exit_.code, int):
            code = exit_.code
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # as Python's exit: threads first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError) as failed:  # said as Python says it, and exit 120
            with contextlib.suppress(OSError, ValueError):
                print(f"Exception ignored flushing {stream!r}: {failed!r}", file=sys.stderr)
            code = 120
    if interrupted:  # as Python ends on an uncaught KeyboardInterrupt: by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


# ---------------------------------------------------------------- the test side


class _Server:
    """This process's fork server, started on first use: one per set of extra modules
    to import (`warm`), each with its own socket."""

    lock = threading.Lock()
    procs: dict[tuple[str, ...], subprocess.Popen[bytes]] = {}
    paths: dict[tuple[str, ...], str] = {}

    @classmethod
    def started(cls, warm: tuple[str, ...] = ()) -> str:
        with cls.lock:
            proc = cls.procs.get(warm)
            if proc is None or proc.poll() is not None:
                folder = tempfile.mkdtemp(prefix="navi-forks-")
                cls.paths[warm] = path = os.path.join(folder, "s")
                env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
                # "navi_trio" in its command line, which its children share: `navi
                # status` and `navi stop` tell a navi process by it (cli/daemons.py).
                cls.procs[warm] = proc = subprocess.Popen(
                    [sys.executable, __file__, path, "navi_trio", *warm],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                )  # fmt: skip
                assert proc.stdout is not None
                line = proc.stdout.readline()
                assert line == b"ready\n", line
                atexit.register(proc.stdin.close)  # type: ignore[union-attr]
            return cls.paths[warm]


def attach_command(*args: str, warm: tuple[str, ...] = (), script: str = "") -> list[str]:
    """A command line that runs `navi ARGS` forked, for a caller that must spawn a
    command itself (an SDK's stdio client): a small `python -I -S` process (~0.02 s) hands
    its own stdin, stdout and stderr, environment and working folder to the fork server
    (with `warm` imported there too), passes on SIGTERM, SIGINT and SIGHUP, and exits
    with the forked command's exit code (or its signal). With `script`, the command is
    `python SCRIPT ARGS` (a test's helper program that imports what `warm` names).
    Blocking: call it on a thread the first time, or after `start` with the same `warm`."""
    path = _Server.started(warm)
    return [sys.executable, "-I", "-S", __file__, "attach", path, script, *args]


def _attach(path: str, script: str, args: list[str]) -> None:
    """`attach_command`'s process: ask the server at `path` to fork `navi ARGS` (or
    `python SCRIPT ARGS`) on this process's stdio, and end as it ends."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):  # it has just ended: its exit code is on the way
            conn.send(b"%d\n" % signum)

    mask = os.umask(0o022)
    os.umask(mask)
    request = json.dumps({
        "args": args, "env": dict(os.environ), "cwd": os.getcwd(), "umask": mask, "tty": False,
        "script": script,
    }).encode()  # fmt: skip
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    socket.send_fds(conn, [_HEADER.pack(len(request)) + request], [0, 1, 2])
    devnull = os.open(os.devnull, os.O_RDWR)  # the forked command alone holds the pipes
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)

    buffer = b""
    while True:
        while b"\n" not in buffer:
            chunk = conn.recv(4096)
            if not chunk:
                os._exit(1)  # the server went away
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        said = json.loads(line)
        if "code" in said:
            break
    code = int(said["code"])
    if code < 0:  # ended by a signal: end by it too, as the caller would see the command end
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


class Forked:
    """A navi command forked by the server: what tests use of a trio.Process (pid,
    stdin/stdout/stderr streams, send_signal, kill, wait, returncode)."""

    def __init__(self, conn: socket.socket, pid: int, streams: list[Any]) -> None:
        self._conn = conn
        self._buffer = b""
        self.pid = pid
        self.stdin, self.stdout, self.stderr = streams
        self.returncode: int | None = None
        self.url = ""  # a daemon's, once it listens (`serving`)

    async def _line(self) -> dict[str, Any]:
        import trio

        while b"\n" not in self._buffer:
            await trio.lowlevel.wait_readable(self._conn)
            try:
                chunk = self._conn.recv(4096)
            except BlockingIOError:
                continue
            if not chunk:
                raise AssertionError("the fork server went away")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                self._conn.send(b"%d\n" % sig)
            except OSError:
                pass  # let go already: the server has killed it

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    async def wait(self) -> int:
        if self.returncode is None:
            self.returncode = int((await self._line())["code"])
            self._conn.close()
        return self.returncode

    def close(self) -> None:
        """Let it go: the server kills it if it still runs."""
        self._conn.close()

    async def end(self) -> None:
        """Killed if it still runs, and reaped (within a bound, whatever cancels)."""
        import trio

        self.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await self.wait()
        self.close()


async def start(
    *args: str,
    env: Mapping[str, str],
    cwd: Path | str,
    stdio: tuple[int, int, int] | None = None,
    tty: bool = False,
    warm: tuple[str, ...] = (),
) -> Forked:
    """`python -m navi_trio ARGS`, forked: with pipes for stdin, stdout and stderr (trio
    streams on the returned `Forked`), or the given fds (kept open here; a terminal's
    slave with `tty`)."""
    import trio

    path = await trio.to_thread.run_sync(_Server.started, warm)
    ours: list[Any] = [None, None, None]
    if stdio is None:
        pipes = [os.pipe() for _ in range(3)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        ours = [trio.lowlevel.FdStream(pipes[0][1])] + [
            trio.lowlevel.FdStream(pipes[i][0]) for i in (1, 2)
        ]
    else:
        theirs = list(stdio)
    mask = os.umask(0o022)
    os.umask(mask)
    request = json.dumps({
        "args": list(args), "env": dict(env), "cwd": str(cwd), "umask": mask, "tty": tty,
    }).encode()  # fmt: skip
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        socket.send_fds(conn, [_HEADER.pack(len(request)) + request], theirs)
    finally:
        if stdio is None:
            for fd in theirs:
                os.close(fd)
    conn.setblocking(False)
    forked = Forked(conn, 0, ours)
    try:
        forked.pid = int((await forked._line())["pid"])
    except BaseException:
        conn.close()  # the server kills what it forked
        raise
    return forked


async def communicate(proc: Forked, stdin: bytes = b"") -> tuple[int, bytes, bytes]:
    """Feed `stdin`, read stdout and stderr to their ends, wait for the exit."""
    import trio

    out: list[bytes] = []
    err: list[bytes] = []

    async def feed() -> None:
        async with proc.stdin:
            if stdin:
                await proc.stdin.send_all(stdin)

    async def drain(stream: Any, into: list[bytes]) -> None:
        async with stream:
            while chunk := await stream.receive_some():
                into.append(chunk)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed)
            nursery.start_soon(drain, proc.stdout, out)
            nursery.start_soon(drain, proc.stderr, err)
        code = await proc.wait()
    finally:
        proc.kill()
        proc.close()
    return code, b"".join(out), b"".join(err)


@asynccontextmanager
async def serving(
    env: Mapping[str, str],
    llm: str,
    *extra: str,
    warm: tuple[str, ...] = (),
    log: Path | None = None,
) -> AsyncIterator[Forked]:
    """`navi serve --port 0 --llm-url LLM EXTRA`, forked (by the server with `warm`), once
    it listens (its `url`); killed and reaped on the way out. Its stderr is appended to
    `log` when given (its stdin is then /dev/null), else a pipe, `proc.stderr`, for the
    caller to read. The one forked daemon of the tests (reliability.py's `navi_serve`
    and tests/daemons.py's start theirs here)."""
    import trio

    args = ("serve", "--port", "0", "--llm-url", llm, *extra)
    stdio: tuple[int, int, int] | None = None
    if log is not None:
        out, write = os.pipe()
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        stdio = (os.open(os.devnull, os.O_RDONLY), write, os.open(log, flags, 0o644))
    try:
        proc = await start(*args, env=env, cwd=os.getcwd(), warm=warm, stdio=stdio)
    except BaseException:
        if stdio is not None:
            os.close(out)
        raise
    finally:
        for fd in stdio or ():
            os.close(fd)
    if stdio is not None:
        proc.stdout = trio.lowlevel.FdStream(out)
    try:
        with trio.fail_after(START_LIMIT):
            said = b""
            while b"\n" not in said:
                chunk = await proc.stdout.receive_some()
                if not chunk:  # its log says why (what CI shows of a failure is all we get)
                    tail = (
                        ""
                        if log is None
                        else (await trio.Path(log).read_text(errors="replace"))[-4000:]
                    )
                    raise AssertionError(
                        f"navi serve ended before listening: {said!r}; its log ends:\n{tail}"
                    )
                said += chunk
        line = said.decode().splitlines()[0]
        assert line.startswith("navi: listening on ws://127.0.0.1:"), line
        proc.url = line.split()[-1]
        yield proc
    finally:
        await proc.end()
        if stdio is not None:  # the pipe made here; a caller's pipes stay theirs to read
            with trio.CancelScope(shield=True):
                await proc.stdout.aclose()


class Terminal:
    """A forked command on a pseudo-terminal of its own: what tests use of a
    pexpect.spawn (read_nonblocking, send, sendline, close, terminate), blocking calls
    for worker threads; its exit code comes from `proc`."""

    def __init__(self, proc: Forked, master: int) -> None:
        import codecs

        self.proc = proc
        self.master = master
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def read_nonblocking(self, size: int, timeout: float) -> str:
        import select

        import pexpect

        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            raise pexpect.TIMEOUT("nothing to read")
        try:
            data = os.read(self.master, size)
        except OSError:  # EIO: no process holds the terminal any more
            data = b""
        if not data:
            raise pexpect.EOF("the terminal closed")
        return str(self._decoder.decode(data))

    def send(self, text: str) -> int:
        return os.write(self.master, text.encode())

    def sendline(self, text: str = "") -> int:
        return self.send(text + os.linesep)

    def close(self) -> None:
        if self.master >= 0:
            os.close(self.master)
            self.master = -1

    def isalive(self) -> bool:
        return self.proc.returncode is None

    def terminate(self, force: bool = False) -> None:
        self.proc.kill()


async def on_terminal(
    *args: str, env: Mapping[str, str], cwd: Path | str, rows: int, cols: int
) -> Terminal:
    """`python -m navi_trio ARGS`, forked onto a new pseudo-terminal of `rows` x `cols`
    whose controlling process it is, as pexpect.spawn starts one."""
    master, slave = os.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        proc = await start(*args, env=env, cwd=cwd, stdio=(slave, slave, slave), tty=True)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    return Terminal(proc, master)


if __name__ == "__main__":
    if sys.argv[1] == "attach":
        _attach(sys.argv[2], sys.argv[3], sys.argv[4:])
    script, command = _serve(sys.argv[1], sys.argv[3:])
    _run_navi(command, script)
