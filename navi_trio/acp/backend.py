"""Which daemon `navi acp` talks to: `open_backend`, the one place that decides.

The daemon asked for (--url), else the local one when it answers, else the command's
private daemon. The editor's sessions of a private daemon are in the same store as any
other, so `navi chat` and the browser see them once a daemon runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

import attrs

from navi_trio.api.endpoint import Endpoint, PrivateOpener, RunTarget, connect

if TYPE_CHECKING:
    from navi_trio.api.daemon_client import DaemonConnection
    from navi_trio.settings import Settings


@attrs.frozen
class BackendOptions:
    target: RunTarget
    private: PrivateOpener  # the command's own daemon when none answers
    settings: Settings  # for the editor's MCP servers this process runs


@attrs.frozen
class Backend:
    """A daemon to talk to, and what its welcome said of us."""

    url: str
    token: str = attrs.field(repr=False)
    role: str = "user"
    profiles: list[str] = attrs.Factory(list)
    default_profile: str | None = None
    private: bool = False  # the daemon of this process

    def connect(self) -> AbstractAsyncContextManager[DaemonConnection]:
        """A connection to the daemon (every one the agent opens comes from here), with
        the bounds every command uses; our own private daemon's listener is this
        process's, so its owner is not looked up."""
        return connect(Endpoint(self.url, self.token, private=self.private))


@asynccontextmanager
async def open_backend(options: BackendOptions) -> AsyncIterator[Backend]:
    """The daemon for this `navi acp`, open until the block ends (see the module)."""
    found = await options.target.daemon()
    if found is not None:
        yield await _welcome(Backend(*found))
        return
    async with options.private() as endpoint:
        yield await _welcome(Backend(endpoint.url, endpoint.token, private=True))


async def _welcome(backend: Backend) -> Backend:
    """`backend` with what the daemon's welcome says of us (role, profiles)."""
    async with backend.connect() as daemon:
        welcome = daemon.welcome
        role = daemon.role
    profiles = welcome.get("profiles")
    default = welcome.get("default_profile")
    return attrs.evolve(
        backend,
        role=role,
        profiles=[str(p) for p in profiles] if isinstance(profiles, list) else [],
        default_profile=default if isinstance(default, str) else None,
    )
