"""A one-request client of the daemon, for `navi sessions|tasks` and `navi doctor`.

    reply = await request(url, token, wire.sessions_list())

Connects (`open_daemon`), sends one frame and returns the reply carrying its id, all
within `CONNECT_TIMEOUT + REPLY_TIMEOUT`. Every failure is a `NaviError` with one clear
line: `DaemonUnreachableError` when nothing answers at the URL (or not in time),
`RemoteError` (with the wire code) when the daemon refused.
"""

from __future__ import annotations

import trio

from navi_trio.api.daemon_client import CONNECT_TIMEOUT, REPLY_TIMEOUT, open_daemon
from navi_trio.api.daemon_client import daemon_answers as daemon_answers
from navi_trio.errors import DaemonUnreachableError as DaemonUnreachableError
from navi_trio.errors import RemoteError as RemoteError
from navi_trio.wire import Frame

DEFAULT_URL = "ws://127.0.0.1:8765/"


async def request(url: str, token: str, frame: Frame) -> Frame:
    try:
        with trio.fail_after(CONNECT_TIMEOUT + REPLY_TIMEOUT):
            async with open_daemon(url, token, connect_timeout=CONNECT_TIMEOUT) as daemon:
                return await daemon.request(frame, timeout=REPLY_TIMEOUT)
    except trio.TooSlowError:
        raise DaemonUnreachableError(f"the daemon at {url} did not answer in time") from None
