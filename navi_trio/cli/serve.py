"""The daemon's life: `navi serve` runs `serve_daemon`; a command with no daemon to speak
to serves itself privately (`serve_privately`).

SIGTERM / SIGINT: stop accepting, wait up to ``shutdown_wait_tasks_sec`` for background
jobs, then leave the runtime (active runs stopped and saved, jobs cancelled, the store
drained). SIGHUP reloads the config file. Before anything else, what a dead daemon of
the same data folder left running is killed, with its cgroups: a ``full``-mode command
outlives a SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import attrs
import trio

from navi_trio.api.auth import OneToken, ensure_local_token, folder_admin
from navi_trio.api.server import ApiServer
from navi_trio.api.tracing import open_tracing
from navi_trio.core.turn import Observer, Observers
from navi_trio.llm.base import LLMBackend
from navi_trio.profiles import ConfigSource
from navi_trio.runtime import Runtime, open_runtime
from navi_trio.settings import Settings
from navi_trio.tools.cgroups import clear_stale, close_trees
from navi_trio.tools.procs import data_digest, kill_orphans

if TYPE_CHECKING:
    from navi_trio.api.metrics import DaemonMetrics

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def serve_daemon(
    settings: Settings,
    config: ConfigSource,
    *,
    host: str,
    port: int,
    ready: Callable[[int], None] = lambda port: None,
    reuse_port: bool = False,
    supervisor_fd: int | None = None,
) -> None:
    """`supervisor_fd`: a worker's end of its supervisor's lifeline: at its end the
    supervisor is gone, and the worker shuts down as on SIGTERM."""
    await kill_orphans(settings.data_dir)
    if settings.cgroups:
        await clear_stale(data_digest(settings.data_dir))
    from navi_trio.api.metrics import DaemonMetrics  # prometheus_client: a daemon's only

    metrics = DaemonMetrics()
    tracing = open_tracing(os.environ)  # the OpenTelemetry SDK, only when configured
    if tracing is not None:  # each line logged in a turn names its trace and span
        from navi_trio.api.traces import WithTraceIds

        for handler in logging.getLogger().handlers:
            handler.setFormatter(WithTraceIds(handler.formatter))
    try:
        observer = metrics if tracing is None else Observers(metrics, tracing[0])
        await _serve(
            settings, config, metrics, observer, host, port, ready, reuse_port, supervisor_fd
        )
    finally:
        if tracing is not None:  # flushes the spans left, off the event loop
            await trio.to_thread.run_sync(tracing[1].shutdown)
    log.info("stopped")


async def _serve(
    settings: Settings,
    config: ConfigSource,
    metrics: DaemonMetrics,
    observer: Observer,
    host: str,
    port: int,
    ready: Callable[[int], None],
    reuse_port: bool,
    supervisor_fd: int | None,
) -> None:
    async with open_runtime(
        settings, config=config, cluster=True, schedules=True, observer=observer
    ) as rt:
        await ensure_local_token(rt.store, settings.data_dir)
        await rt.warm_up()  # before listening: no first turn waits behind the load
        rt.sessions.adopt = True  # session actors run what a crash left queued
        async with trio.open_nursery() as nursery:
            server = ApiServer(rt, host=host, port=port, reuse_port=reuse_port, metrics=metrics)
            bound = await nursery.start(server.run)
            # Only while serving: once shutdown starts, a second Ctrl-C or SIGTERM acts
            # as usual (KeyboardInterrupt / termination) instead of waiting for it.
            with (
                trio.open_signal_receiver(*STOP_SIGNALS, signal.SIGHUP) as signals,
                trio.CancelScope() as serving,
            ):
                ready(bound)
                nursery.start_soon(rt.sessions.resume_queued)  # what a crash left queued
                if supervisor_fd is not None:
                    nursery.start_soon(_outlive_not, supervisor_fd, serving)
                _notify_systemd("READY=1")
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        changed = rt.config.reload()
                        log.info("SIGHUP: config %s", "reloaded" if changed else "unchanged")
                        continue
                    log.info("%s: shutting down", signal.Signals(signum).name)
                    break
            _notify_systemd("STOPPING=1")
            nursery.cancel_scope.cancel()  # stop accepting, close every connection
        await wait_background_jobs(rt, settings.shutdown_wait_tasks_sec)
        log.info("stopping active runs and closing the store")
    await close_trees()  # what the runs' ends left in their cgroups


@attrs.frozen
class Private:
    """Where a private server listens, and the token it takes (`serve_privately`)."""

    url: str
    token: str = attrs.field(repr=False)


@asynccontextmanager
async def serve_privately(
    settings: Settings, config: ConfigSource, *, backend: LLMBackend | None = None
) -> AsyncIterator[Private]:
    """The runtime and a server only this process can use, for as long as the block.

    Loopback, port 0: nothing of the machine's ports is taken for good. Only this process
    holds the token, and a browser page is refused by the Origin check as at any daemon.
    Leaving the block closes the server, then the runtime.
    """
    async with open_runtime(settings, config=config, backend=backend) as rt:
        # The folder's local admin when a daemon of the folder made one: what this command
        # creates is then theirs, as that daemon shows it to the local token; else the
        # person at the shell as a user of no table (`LOCAL_USER`).
        admin = await folder_admin(rt.store, settings.data_dir)
        tokens = OneToken() if admin is None else OneToken(who=admin)
        async with trio.open_nursery() as nursery:
            server = ApiServer(rt, host="127.0.0.1", port=0, tokens=tokens)
            port = await nursery.start(server.run)
            yield Private(f"ws://127.0.0.1:{port}/", tokens.token)
            nursery.cancel_scope.cancel()


async def _outlive_not(fd: int, serving: trio.CancelScope) -> None:
    """Until the supervisor's lifeline ends (nothing is ever written to it): then stop
    serving, as on SIGTERM."""
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)
    log.warning("the supervisor of this worker is gone: shutting down")
    serving.cancel()


async def wait_background_jobs(rt: Runtime, seconds: float) -> None:
    """Give running background jobs up to `seconds` to finish; the rest are cancelled."""
    jobs = [
        job
        for row in await rt.store.list_sessions()
        for job in rt.supervisor.list_jobs(row.id)
        if not job.finished
    ]
    if not jobs:
        return
    log.info("waiting up to %g s for %d background job(s)", seconds, len(jobs))
    with trio.move_on_after(seconds):
        for job in jobs:
            await job.done.wait()
    left = sum(1 for job in jobs if not job.finished)
    if left:
        log.info("cancelling %d background job(s) still running", left)


def _notify_systemd(state: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("could not notify systemd (%s): %s", state, exc)
