"""`navi serve --workers N`: N daemon processes on one port, supervised.

Why processes: one daemon is one CPU-bound process; N workers on one PostgreSQL use N
cores, each session run by the worker holding its lease.

Why SO_REUSEPORT: each worker listens on its own socket bound to the port and the kernel
spreads new connections over them, so no hand-over process sits on every connection.
The supervisor holds one more socket bound to the port (never listening): the port
stays ours while a worker restarts.

A worker that exits is started again (0.5 s, doubling to 30 s while it keeps dying
within a minute). Workers die with their supervisor however it ends, SIGKILL too: each
watches a pipe whose write end only the supervisor holds (not ``PR_SET_PDEATHSIG``: it
fires when the starting thread ends, and trio starts processes from worker threads).
SQLite is refused: workers would share one file with no way to reach each other's
clients.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

import attrs
import trio

from navi_trio.backoff import backoff_delay
from navi_trio.errors import NaviError, UsageError
from navi_trio.settings import Settings

log = logging.getLogger(__name__)

START_LIMIT_SEC = 120.0  # a worker must print its listening line within this
RESTART_FIRST_SEC = 0.5
RESTART_MAX_SEC = 30.0
STABLE_SEC = 60.0  # a worker that lived this long starts again with the first delay
STOP_WAIT_SEC = 60.0  # after SIGTERM, then SIGKILL


def check_workers(workers: int, settings: Settings) -> None:
    """UsageError unless `workers` is 1, or more on a PostgreSQL store."""
    from navi_trio.store.factory import store_kind

    if workers < 1:
        raise UsageError(f"--workers must be 1 or more, got {workers}")
    if workers > 1 and store_kind(settings) != "postgresql":
        raise UsageError(
            f"--workers {workers} needs a database the workers share: set "
            "NAVI_DB=postgresql://… (with SQLite, NAVI_DB a file, run one daemon)"
        )


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT, never listening: the port's holder."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


@attrs.define(eq=False)
class _Worker:
    number: int
    proc: trio.Process | None = None
    restarts: int = 0


class Supervisor:
    """Starts `count` workers of `argv` (the `navi serve` command line) and keeps them up."""

    def __init__(
        self,
        argv: Sequence[str],
        count: int,
        out: TextIO,
        ready: Callable[[int], None] = lambda port: None,
    ) -> None:
        self.argv = list(argv)
        self.count = count
        self.out = out
        self.ready = ready  # called with the port once every worker listens
        self.workers = [_Worker(n + 1) for n in range(count)]
        self.stopping = False
        # The workers' lifeline (made with the first worker): they hold its read end, only
        # this process its write end.
        self._lifeline: tuple[int, int] | None = None

    async def run(self, host: str, port: int) -> None:
        holder = reserve_port(host, port)
        listening = False
        try:
            bound = int(holder.getsockname()[1])
            async with trio.open_nursery() as nursery:
                ready = []
                for worker in self.workers:
                    started = trio.Event()
                    ready.append(started)
                    nursery.start_soon(self._keep, worker, bound, started)
                with trio.move_on_after(START_LIMIT_SEC):
                    for started in ready:
                        await started.wait()
                listening = all(started.is_set() for started in ready)
                if listening:
                    self.ready(bound)
                    self._say(f"navi: listening on ws://{host}:{bound}/ ({self.count} workers)")
                    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for signum in signals:
                            log.info("%s: stopping the workers", signal.Signals(signum).name)
                            break
                self.stopping = True
                await self._stop_all()
                nursery.cancel_scope.cancel()
        finally:
            holder.close()
            if self._lifeline is not None:
                for fd in self._lifeline:
                    os.close(fd)
        if not listening:
            raise NaviError(
                f"not every worker listened on {host}:{bound} within {START_LIMIT_SEC:g} s "
                "(the warnings above say why)"
            )

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    async def _keep(self, worker: _Worker, port: int, first_ready: trio.Event) -> None:
        restart = 0
        while not self.stopping:
            began = trio.current_time()
            if await self._start(worker, port):
                first_ready.set()  # the supervisor says "listening" once every worker does
            proc = worker.proc
            assert proc is not None
            code = await proc.wait()
            if self.stopping:
                return
            if trio.current_time() - began >= STABLE_SEC:
                restart = 0
            restart += 1
            delay = backoff_delay(restart, base=RESTART_FIRST_SEC, cap=RESTART_MAX_SEC)
            log.warning(
                "worker %d (pid %d) exited with %s; starting it again in %.1f s",
                worker.number,
                proc.pid,
                _exit_text(code),
                delay,
            )
            await trio.sleep(delay)
            worker.restarts += 1

    async def _start(self, worker: _Worker, port: int) -> bool:
        """Start `worker`; True once it listens (its first line), False when it did not."""
        if self._lifeline is None:
            self._lifeline = os.pipe()
        lifeline = self._lifeline[0]
        argv = [*self.argv, "--port", str(port), "--reuse-port", "--supervisor-fd", str(lifeline)]
        proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, pass_fds=(lifeline,))
        worker.proc = proc
        assert proc.stdout is not None
        try:
            with trio.fail_after(START_LIMIT_SEC):
                line = await _first_line(proc.stdout)
        except (trio.TooSlowError, EOFError):
            log.warning("worker %d (pid %d) did not start listening", worker.number, proc.pid)
            proc.kill()
            return False
        finally:
            await proc.stdout.aclose()  # the worker prints nothing more on stdout
        if worker.restarts:
            self._say(f"navi: worker {worker.number} started again (pid {proc.pid})")
        log.info("worker %d (pid %d): %s", worker.number, proc.pid, line)
        return True

    async def _stop_all(self) -> None:
        procs = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        with trio.CancelScope(shield=True):
            with trio.move_on_after(STOP_WAIT_SEC):
                for proc in procs:
                    await proc.wait()
            for proc in procs:
                if proc.returncode is None:
                    log.warning(
                        "worker pid %d ignored SIGTERM for %g s: killed", proc.pid, STOP_WAIT_SEC
                    )
                    proc.kill()
                    await proc.wait()


async def _first_line(stream: trio.abc.ReceiveStream) -> str:
    data = b""
    while b"\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            raise EOFError("the worker closed its output before listening")
        data += chunk
    return data.decode(errors="replace").splitlines()[0]


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def worker_argv(args_argv: Sequence[str]) -> list[str]:
    """This `navi serve` command line for one worker: without --workers and --port."""
    kept: list[str] = []
    skip = False
    for arg in args_argv:
        if skip:
            skip = False
            continue
        if arg in ("--workers", "--port"):
            skip = True
            continue
        if arg.startswith(("--workers=", "--port=")):
            continue
        kept.append(arg)
    return [sys.executable, "-m", "navi_trio", *kept]


def serve_workers(
    argv: Sequence[str],
    count: int,
    host: str,
    port: int,
    out: TextIO,
    ready: Callable[[int], None] = lambda port: None,
) -> int:
    """Run the supervisor until SIGTERM / SIGINT; the exit code. `ready(port)` once
    every worker listens."""
    supervisor = Supervisor(worker_argv(argv), count, out, ready)
    trio.run(supervisor.run, host, port)
    return 0
