"""`Connection`: the chat client's link to the daemon, one `open_daemon` at a time.

Every frame goes to the owner's channel. When the connection drops it sends the owner
a local ``_disconnected`` frame, reconnects with exponential backoff (a bounded number
of tries) and, once back, sends what the owner's `resume` returns (``subscribe`` with
the last seq seen, and the messages to send again: paced, `RESUME_BURST`) before a
``_reconnected`` frame. Local frame types start with ``_``:
the server never sends those. It gives up with `DaemonUnreachableError` or
`RemoteError` (the daemon refused the token).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from navi_trio.api.daemon_client import DaemonConnection, open_daemon
from navi_trio.api.redial import BACKOFF_FIRST as BACKOFF_FIRST  # one reconnect policy
from navi_trio.api.redial import BACKOFF_MAX
from navi_trio.api.redial import RETRIES as RETRIES
from navi_trio.backoff import backoff_delay
from navi_trio.errors import DaemonUnreachableError, RemoteError
from navi_trio.wire import Frame

CONNECT_TIMEOUT = 5.0
WELCOME_TIMEOUT = 10.0
CLOSE_TIMEOUT = 2.0
# What a reconnect sends at once (the subscribe, the tasks list, the messages sent again),
# then one frame per 1/RESUME_PER_SEC s: within the daemon's frame limits (its defaults:
# a burst of 40, 20 a second, NAVI_WS_FRAMES_BURST / _PER_SEC), leaving room for the
# frames the chat sends meanwhile, so no resent message is refused as rate_limited.
RESUME_BURST = 30
RESUME_PER_SEC = 10.0
TOKEN_HINT = "pass --token, set NAVI_TOKEN, or use the local-token file `navi serve` writes"


def _refused(exc: RemoteError, hint: str = TOKEN_HINT) -> RemoteError:
    """A refusal as the person at the chat reads it: what to do about a bad token."""
    if exc.code == "unauthorized":
        return RemoteError(exc.code, f"the daemon refused the token ({exc.detail}): {hint}")
    return RemoteError(exc.code, f"the daemon refused the connection: {exc.detail}")


@attrs.define(eq=False)
class Connection:
    url: str
    _token: str
    _out: trio.MemorySendChannel[Frame]
    _resume: Callable[[], list[Frame]] = attrs.field(default=list, kw_only=True)
    _retries: int = attrs.field(default=RETRIES, kw_only=True)
    _backoff: float = attrs.field(default=BACKOFF_FIRST, kw_only=True)
    _token_hint: str = attrs.field(default=TOKEN_HINT, kw_only=True)  # for a refused token
    _daemon: DaemonConnection | None = attrs.field(default=None, init=False)

    @property
    def connected(self) -> bool:
        return self._daemon is not None

    async def send(self, frame: Frame) -> None:
        """Send one frame; `DaemonUnreachableError` while the connection is down."""
        daemon = self._daemon
        if daemon is None:
            raise DaemonUnreachableError(
                "not connected to the daemon (reconnecting…); try again shortly"
            )
        try:
            await daemon.send(frame)
        except DaemonUnreachableError:
            raise DaemonUnreachableError(
                "the connection dropped (reconnecting…); try again shortly"
            ) from None

    async def run(self, *, task_status: trio.TaskStatus[Frame] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect and pump frames until cancelled; raises when it gives up."""
        started = False
        failures = 0
        while True:
            try:
                async with open_daemon(
                    self.url,
                    self._token,
                    connect_timeout=CONNECT_TIMEOUT,
                    hello_timeout=WELCOME_TIMEOUT,
                    close_timeout=CLOSE_TIMEOUT,
                ) as daemon:
                    self._daemon = daemon
                    try:
                        failures = 0
                        if not started:
                            started = True
                            task_status.started(daemon.welcome)
                        else:
                            await _paced(daemon, self._resume())
                            await self._out.send(
                                {"type": "_reconnected", "welcome": daemon.welcome}
                            )
                        await self._pump(daemon)
                    finally:
                        self._daemon = None
            except RemoteError as exc:
                raise _refused(exc, self._token_hint) from None
            except DaemonUnreachableError as exc:
                if not started:
                    raise DaemonUnreachableError(
                        f"no navi daemon answers at {self.url} ({exc.reason or exc}); start one "
                        "with `navi serve` or check --url",
                        reason=exc.reason,
                    ) from None
                failures += 1
                if failures > self._retries:
                    raise DaemonUnreachableError(
                        f"lost the daemon at {self.url} and {self._retries} reconnects failed; "
                        "is `navi serve` still running?",
                        reason=exc.reason,
                    ) from None
                delay = backoff_delay(failures, base=self._backoff, cap=BACKOFF_MAX)
                await self._out.send(
                    {
                        "type": "_disconnected",
                        "reason": exc.reason or str(exc),
                        "retry_in": delay,
                        "attempt": failures,
                    }
                )
                await trio.sleep(delay)

    async def _pump(self, daemon: DaemonConnection) -> None:
        while True:
            try:
                frame = await daemon.receive()
            except RemoteError as exc:
                if exc.code != "bad_frame":
                    raise
                frame = {"type": "error", "code": "bad_frame", "message": exc.detail}
            await self._out.send(frame)


async def _paced(daemon: DaemonConnection, frames: list[Frame]) -> None:
    """Send `frames`: `RESUME_BURST` at once, the rest paced (see `RESUME_PER_SEC`)."""
    for n, frame in enumerate(frames):
        if n >= RESUME_BURST:
            await trio.sleep(1 / RESUME_PER_SEC)
        await daemon.send(frame)
