"""Which daemon a command speaks to: the one asked for, the local one, or a private one.

`RunTarget` names the daemon asked for (``--url``, with ``--token``, ``NAVI_TOKEN`` or the
local token file), else the local one when it answers and a token is at hand; when none
is, `open_endpoint` opens a private one through the opener it is given (the runtime and
the server in this process, on loopback with a one-time token), which keeps this layer
free of the runtime. Every client of the protocol decides here, the same way.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from navi_trio.api.remote import DEFAULT_URL, daemon_answers

if TYPE_CHECKING:
    from navi_trio.api.daemon_client import DaemonConnection

PROBE_TIMEOUT = 1.0  # is the local daemon there? (a refused connection answers at once)
CONNECT_TIMEOUT = 5.0
MAX_FRAME = 64 * 1024 * 1024


@attrs.frozen
class Endpoint:
    """A daemon to speak to: its URL, the token for the hello, and whether it is this
    process's own (`serve_privately`), which ends with the command."""

    url: str
    token: str = attrs.field(repr=False)
    private: bool = False


# Opens a private daemon for the length of its block (the wiring's, e.g. cli/serve.py
# `serve_privately` with the settings of the command that needs one).
PrivateOpener = Callable[[], AbstractAsyncContextManager[Endpoint]]


@attrs.frozen
class RunTarget:
    """Where a command's requests go: the daemon asked for (`url`), else the local one
    when it answers and a token is at hand, else a private one (`daemon()` is None)."""

    url: str | None  # --url: that daemon, none answering is an error
    token: str | None  # --token
    data_dir: Path
    embedded: bool  # an option configures a runtime in this process

    async def daemon(self) -> tuple[str, str] | None:
        """(url, token) of the daemon to speak to, or None for a private one."""
        from navi_trio.api.auth import read_local_token, resolve_token

        if self.url is not None:
            return self.url, resolve_token(self.token, self.data_dir, dict(os.environ))
        if self.embedded:
            return None
        token = self.token or os.environ.get("NAVI_TOKEN") or read_local_token(self.data_dir)
        if not token:
            return None  # no local daemon ever wrote its token here: do not even look
        if not await daemon_answers(DEFAULT_URL, PROBE_TIMEOUT):
            return None
        return DEFAULT_URL, token


@asynccontextmanager
async def open_endpoint(target: RunTarget, private: PrivateOpener) -> AsyncIterator[Endpoint]:
    """The daemon `target` names or finds, else a private one `private` opens (and closes
    at the end of the block). The caller speaks to either through `open_daemon`."""
    found = await target.daemon()
    if found is not None:
        yield Endpoint(*found)
        return
    async with private() as endpoint:
        yield endpoint


def connect(endpoint: Endpoint) -> AbstractAsyncContextManager[DaemonConnection]:
    """`open_daemon` to `endpoint`, with the bounds every command uses."""
    from navi_trio.api.daemon_client import open_daemon

    return open_daemon(
        endpoint.url,
        endpoint.token,
        connect_timeout=CONNECT_TIMEOUT,
        max_frame=MAX_FRAME,
        own_listener=endpoint.private,
    )
