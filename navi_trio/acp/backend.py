"""Which daemon `navi acp` talks to: `open_backend`, the one place that decides.

The daemon asked for (--url), else the local one when it answers (`RunTarget`, as for
`navi run`), else the command's private daemon (`private_endpoint`, as every verb opens
one when no daemon answers: loopback, port 0, a one-time token kept in memory). The
agent speaks to all three the same way, through `open_daemon`; the editor's sessions of
a private daemon are in the same store as any other, so `navi chat` and the browser see
them once a daemon runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

import attrs

from navi_trio.cli.runner import RunTarget

if TYPE_CHECKING:
    from navi_trio.api.daemon_client import DaemonConnection
    from navi_trio.settings import Settings

log = logging.getLogger(__name__)


@attrs.frozen
class BackendOptions:
    target: RunTarget
    settings: Settings  # for a daemon of this process
    llm_configured: bool  # else `choose_backend` looks for Ollama / the local model


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
        from navi_trio.cli.runner import Endpoint, connect

        return connect(Endpoint(self.url, self.token, private=self.private))


@asynccontextmanager
async def open_backend(options: BackendOptions) -> AsyncIterator[Backend]:
    """The daemon for this `navi acp`, open until the block ends (see the module)."""
    found = await options.target.daemon()
    if found is not None:
        yield await _welcome(Backend(*found))
        return
    async with _private_daemon(options) as (url, token):
        yield await _welcome(Backend(url, token, private=True))


async def _welcome(backend: Backend) -> Backend:
    """`backend` with what the daemon's welcome says of us (role, profiles)."""
    async with backend.connect() as daemon:
        welcome = daemon.welcome
        role = daemon.role
    profiles = welcome.get("profiles")
    default = welcome.get("default_profile")
    return attrs.evolve(
        backend, role=role,
        profiles=[str(p) for p in profiles] if isinstance(profiles, list) else [],
        default_profile=default if isinstance(default, str) else None,
    )  # fmt: skip


@asynccontextmanager
async def _private_daemon(options: BackendOptions) -> AsyncIterator[tuple[str, str]]:
    """The command's private daemon (`private_endpoint`, as every verb opens one), with
    the backend chosen as `navi run` chooses it when none is configured."""
    from navi_trio.cli.common import config_source
    from navi_trio.cli.runner import private_endpoint
    from navi_trio.llm.factory import choose_backend

    choice = await choose_backend(options.settings, os.environ, configured=options.llm_configured)
    if choice.note:
        log.warning("%s", choice.note)
    settings = choice.settings
    async with private_endpoint(settings, config_source(settings)) as endpoint:
        log.info("a private daemon serves %s (db %s)", endpoint.url, settings.db_path)
        yield endpoint.url, endpoint.token
