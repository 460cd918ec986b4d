"""`Redialing`: a client's connection to the daemon that comes back while it follows its message.

`navi run`, `navi acp` and the peer tool each send a message and follow its run to its
end. Every message sent here gets a key (`wire.message_key`). When the connection drops
before the message's ``ok`` or its run's end (a cut, a daemon restarted), the daemon is
dialled again (`retries` tries, `backoff_delay` between them), what the caller must say
first on a new connection is said (`on_connect`: the editor's tools of an ACP prompt),
each session followed is subscribed again from the last frame handed on (the replay; a
``resync`` is handed on when it is gone), and a message still unanswered is sent again
with its key: the daemon runs it once (a resend of one it took gets that one's ``ok``
again, ``duplicate``). A request or a frame that met the drop is sent again on the new
connection. Past the tries, `DaemonUnreachableError` says the daemon is lost.

A message's session is followed before the message goes (`DaemonConnection.follow`), so
the replay after a drop starts at or before its run's first frame even when neither
its ``ok`` nor any frame of it came. A resend whose duplicate ``ok`` names another epoch
than the session's now was taken by an earlier life of the daemon: its run ended with
that life (what it saved is in the history), so it is an error here, not a wait.

The connections are held by tasks in a nursery (`open_redialing`'s own, or the caller's
when the connection must outlive the caller's cancel scope: the peer link's).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TypeVar

import trio

from navi_trio import wire
from navi_trio.api.daemon_client import DaemonConnection
from navi_trio.api.our_run import Accepted
from navi_trio.backoff import backoff_delay
from navi_trio.errors import DaemonUnreachableError, RemoteError
from navi_trio.wire import Frame

log = logging.getLogger(__name__)

RETRIES = 6  # dials after a drop before the daemon counts as lost
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 8.0
CLOSE_GRACE = 2.0  # a connection let go (dropped, or at the end) closes within this

Dial = Callable[[], AbstractAsyncContextManager[DaemonConnection]]
OnConnect = Callable[[DaemonConnection], Awaitable[None]]
T = TypeVar("T")


class Redialing:
    """One daemon, through as many connections as drops need (see the module docstring)."""

    def __init__(
        self,
        dial: Dial,
        nursery: trio.Nursery,
        *,
        url: str,
        retries: int = RETRIES,
        backoff: float = BACKOFF_FIRST,
        on_connect: OnConnect | None = None,
    ) -> None:
        self._dial = dial
        self._nursery = nursery
        self.url = url
        self._retries = retries
        self._backoff = backoff
        self.on_connect = on_connect
        self._daemon: DaemonConnection | None = None
        self._let_go: Callable[[], None] = lambda: None  # closes the current connection
        self._lock = trio.Lock()
        self._followed: set[str] = set()
        self._lost: DaemonUnreachableError | None = None  # given up
        self.redials = 0  # connections made again after a drop

    @property
    def daemon(self) -> DaemonConnection:
        """The connection now (another after a drop)."""
        if self._lost is not None:
            raise self._lost
        assert self._daemon is not None, "not connected: call connect() first"
        return self._daemon

    @property
    def welcome(self) -> Frame:
        return self.daemon.welcome

    @property
    def role(self) -> str:
        return self.daemon.role

    async def connect(self) -> None:
        """The first connection; failing, the error `open_daemon` raises."""
        self._daemon, self._let_go = await self._open()

    def close(self) -> None:
        """Let the connection go (it closes within `CLOSE_GRACE`); nothing is dialled again."""
        self._lost = self._lost or DaemonUnreachableError(
            f"the connection to the daemon at {self.url} was closed", reason="closed"
        )
        self._let_go()

    async def _open(self) -> tuple[DaemonConnection, Callable[[], None]]:
        done = trio.Event()
        scope = trio.CancelScope()

        async def hold(*, task_status: trio.TaskStatus[DaemonConnection]) -> None:
            with scope:
                async with self._dial() as daemon:
                    task_status.started(daemon)
                    await done.wait()

        daemon: DaemonConnection = await self._nursery.start(hold)

        def let_go() -> None:
            done.set()
            scope.deadline = min(scope.deadline, trio.current_time() + CLOSE_GRACE)

        return daemon, let_go

    # -- what the callers use: as `DaemonConnection`, through drops ------------------------

    async def send(self, frame: Frame) -> None:
        await self._through(lambda d: d.send(frame))

    async def receive(self) -> Frame:
        return await self._through(lambda d: d.receive())

    async def request(self, frame: Frame, *, timeout: float = 30.0) -> Frame:  # noqa: ASYNC109
        return await self._through(lambda d: d.request(frame, timeout=timeout))

    async def stop(self, session_id: str) -> bool:
        return await self._through(lambda d: d.stop(session_id))

    async def send_message(
        self,
        content: str,
        *,
        session_id: str,
        profile: str | None = None,
        cwd: str | None = None,
        mode: str | None = None,
        on_busy: str | None = None,
        trace: Mapping[str, str] | None = None,
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> Accepted:
        """Send a user message with a key of its own and wait for its ``ok``, sending it
        again with that key on the next connection when this one drops first."""
        key = wire.message_key()
        if session_id not in self._followed:
            await self._through(lambda d: d.follow(session_id))
            self._followed.add(session_id)
        redials = self.redials
        accepted = await self._through(
            lambda d: d.send_message(
                content,
                session_id=session_id,
                profile=profile,
                cwd=cwd,
                mode=mode,
                on_busy=on_busy,
                trace=trace,
                key=key,
                timeout=timeout,
            )
        )
        if accepted.duplicate and self.redials != redials:
            mark = self.daemon.mark(session_id)
            now = mark[1] if mark is not None else None
            if now is not None and accepted.epoch not in (None, now) and not accepted.queued:
                raise DaemonUnreachableError(
                    f"the daemon at {self.url} restarted while it ran the message: its run "
                    f"ended there (`navi sessions history {session_id}` shows what it saved)",
                    reason="the daemon restarted during the run",
                )
        return accepted

    # -- drops ----------------------------------------------------------------------------

    async def _through(self, call: Callable[[DaemonConnection], Awaitable[T]]) -> T:
        while True:
            daemon = self.daemon
            try:
                return await call(daemon)
            except DaemonUnreachableError as exc:
                await self._redial(daemon, exc)

    async def _redial(self, failed: DaemonConnection, exc: DaemonUnreachableError) -> None:
        """A new connection in place of `failed` (unless another task made one already)."""
        async with self._lock:
            if self._lost is not None:
                raise self._lost
            if self._daemon is not failed:
                return
            self._let_go()
            reason = exc.reason or str(exc)
            log.info("lost the daemon at %s (%s): dialling again", self.url, reason)
            for attempt in range(1, self._retries + 1):
                await trio.sleep(backoff_delay(attempt, base=self._backoff, cap=BACKOFF_MAX))
                try:
                    daemon, let_go = await self._open()
                except DaemonUnreachableError as again:
                    log.info("dialling %s again: %s", self.url, again.reason or again)
                    continue
                daemon.carry(failed)
                self._daemon, self._let_go = daemon, let_go
                try:
                    await self._resume(daemon)
                except DaemonUnreachableError:
                    let_go()
                    failed = daemon
                    continue
                self.redials += 1
                return
            self._lost = DaemonUnreachableError(
                f"lost the connection to the daemon at {self.url} ({reason}) and "
                f"{self._retries} reconnects failed: is the daemon still running?",
                reason=reason,
            )
            raise self._lost

    async def _resume(self, daemon: DaemonConnection) -> None:
        """What a new connection says before the calls that met the drop go again."""
        if self.on_connect is not None:
            await self.on_connect(daemon)
        for sid in sorted(self._followed):
            last, epoch = daemon.mark(sid) or (0, None)
            try:
                await daemon.request(wire.subscribe(sid, last, epoch))
            except RemoteError as exc:
                if exc.code != "not_found":  # gone: the message, sent again, makes it
                    raise


@asynccontextmanager
async def open_redialing(
    dial: Dial,
    *,
    url: str,
    retries: int = RETRIES,
    backoff: float = BACKOFF_FIRST,
    on_connect: OnConnect | None = None,
) -> AsyncIterator[Redialing]:
    """A `Redialing` connected to the daemon, its connections held in a nursery of its
    own; a single error of the block comes out as itself, not in a group."""
    try:
        async with trio.open_nursery() as nursery:
            link = Redialing(
                dial, nursery, url=url, retries=retries, backoff=backoff, on_connect=on_connect
            )
            await link.connect()
            try:
                yield link
            finally:
                link.close()
    except BaseExceptionGroup as group:
        leaf: BaseException = group
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]
        if leaf is group:
            raise
        raise leaf from None


__all__ = ["Redialing", "open_redialing"]
