"""`WsPeerLink`: the `peer` tool's link to another navi daemon (through `open_daemon`).

    async with link.ask(url, token, "question", session_id=None, profile=None) as run:
        frame = await run.receive()          # the run's session frames, stream_end last

`ask` connects, says hello, sends the message and waits for its ``ok``; a message the
peer queued behind other runs is followed from the start of its own run (`OurRun`). A
connection that drops before the run's end is dialled again and the message sent again
with its key (`Redialing`): the peer runs it once; a new session's id is chosen here,
as the key is the session's.

When the calling tool is cancelled (our run stopped, its task cancelled, its timeout),
the peer's run must be stopped too and the peer heard confirming it, so each connection
lives in the link's own nursery, not under the caller's cancel scope: leaving `ask`
before the run's stream_end sends ``stop`` and waits for the run to end, shielded, within
`STOP_GRACE` seconds; then the connection closes (within `CLOSE_GRACE`), whatever the
peer does.

Failures are `PeerUnreachableError`, `PeerRefusedError` and `PeerError`. The token goes
into the hello frame and nowhere else. When the daemon traces, the message carries the
calling span's W3C trace context, so the peer's turn joins the caller's trace.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager

import trio

from navi_trio.actor import NurseryHolder
from navi_trio.api.daemon_client import DaemonConnection, OurRun, open_daemon
from navi_trio.api.redial import BACKOFF_FIRST, RETRIES, Redialing
from navi_trio.errors import (
    DaemonUnreachableError,
    PeerError,
    PeerRefusedError,
    PeerUnreachableError,
    RemoteError,
)
from navi_trio.wire import Frame, new_session_id

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
REPLY_TIMEOUT = 30.0  # the welcome, and the ok of the message
STOP_GRACE = 5.0  # for the peer to confirm a stop, then to close
MAX_FRAME = 16 * 1024 * 1024  # a long final answer comes as one stream_end frame


@contextmanager
def _as_peer_errors(connected: bool = True) -> Iterator[None]:
    """The daemon client's errors as the peer tool's (its own words before the welcome)."""
    try:
        yield
    except PeerError:
        raise
    except DaemonUnreachableError as exc:
        message = str(exc) if connected else f"no navi daemon answers: {exc.reason or exc}"
        raise PeerUnreachableError(message, reason=exc.reason) from None
    except RemoteError as exc:
        raise PeerRefusedError(exc.code, exc.detail) from None


class _Run:
    """One message's run on the peer, as `WsPeerLink.ask` yields it."""

    def __init__(self, daemon: Redialing, run: OurRun, created: bool) -> None:
        self._daemon = daemon
        self._run = run
        self.session_id = run.session_id
        self.created = created

    @property
    def running(self) -> bool:
        return self._run.running

    async def receive(self) -> Frame:
        with _as_peer_errors():
            while True:
                frame = await self._daemon.receive()
                if self._run.ours(frame):
                    return frame

    async def stop(self) -> None:
        """Ask the peer to stop our run, and wait until it ended (or was not running)."""
        with _as_peer_errors():
            if not await self._daemon.stop(self.session_id):
                return  # it had ended already: nothing will come
            while not self._run.ended:
                self._run.ours(await self._daemon.receive())


class WsPeerLink(NurseryHolder):
    """The runtime's link to peers; `run` hosts the connections."""

    retries: int = RETRIES  # dials again after a drop (a test may lower the backoff)
    backoff: float = BACKOFF_FIRST

    @asynccontextmanager
    async def ask(
        self,
        url: str,
        token: str,
        message: str,
        *,
        session_id: str | None,
        profile: str | None,
        trace: Mapping[str, str] | None = None,
    ) -> AsyncIterator[_Run]:
        if not self.running:
            raise PeerError("the peer link is not running (the daemon is stopping)")

        def dial() -> AbstractAsyncContextManager[DaemonConnection]:
            return open_daemon(
                url,
                token,
                connect_timeout=CONNECT_TIMEOUT,
                hello_timeout=REPLY_TIMEOUT,
                max_frame=MAX_FRAME,
            )

        # The connections live in the link's nursery, not under the caller's cancel scope.
        daemon = Redialing(dial, self.nursery, url=url, retries=self.retries, backoff=self.backoff)
        with _as_peer_errors(connected=False):
            await daemon.connect()
        run: _Run | None = None
        try:
            # A session id of ours for a new session: its message's key is the session's,
            # so a resend after a drop must name the session the first one made.
            sid = session_id or new_session_id()
            with _as_peer_errors():
                accepted = await daemon.send_message(
                    message, session_id=sid, profile=profile, trace=trace, timeout=REPLY_TIMEOUT
                )
            created = accepted.created or session_id is None
            run = _Run(daemon, OurRun.of(accepted, message), created)
            yield run
        finally:
            await _close(run)
            daemon.close()  # within CLOSE_GRACE whatever the peer does


async def _close(run: _Run | None) -> None:
    """Stop our run if it is still going; shielded, within STOP_GRACE."""
    if run is None or not run.running:
        return
    with trio.move_on_after(STOP_GRACE, shield=True) as grace:
        log.info("peer session %s: our side stopped; sending stop", run.session_id)
        try:
            await run.stop()
        except PeerError as exc:
            log.warning("peer session %s: stop not confirmed: %s", run.session_id, exc)
    if grace.cancelled_caught:
        log.warning("peer session %s: no stop confirmation within %g s", run.session_id, STOP_GRACE)


async def check_peer(url: str, token: str, timeout: float = 3.0) -> str | None:  # noqa: ASYNC109
    """None when the peer at `url` accepts `token`; else why not (for `navi doctor`)."""
    try:
        with trio.fail_after(timeout):
            async with open_daemon(url, token, connect_timeout=timeout, hello_timeout=timeout):
                pass
    except trio.TooSlowError:
        return f"no answer within {timeout:g} s"
    except RemoteError as exc:
        return f"refused the token: {exc}" if exc.code == "unauthorized" else str(exc)
    except DaemonUnreachableError as exc:
        return f"unreachable: {exc.reason or exc}"
    return None
