"""Which daemon `navi acp` talks to: `open_backend`, the one place that decides.

The daemon asked for (--url), else the local one when it answers (`RunTarget`, as for
`navi run`), else a daemon of this process: a runtime opened here, as `navi mcp serve`
opens one when no daemon answers, with the daemon's WebSocket server on a loopback
port of its own and the data folder's local admin token. The agent speaks to all three
the same way, through `open_daemon`; the editor's sessions of a private daemon are in
the same store as any other, so `navi chat` and the browser see them once a daemon runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

import attrs
import trio

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
        """A connection to the daemon (every one the agent opens comes from here)."""
        from navi_trio.api.daemon_client import open_daemon

        return open_daemon(self.url, self.token)


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
    """A runtime of this process serving the WebSocket protocol on 127.0.0.1 (a free port)."""
    from navi_trio.api.auth import ensure_local_token, read_local_token
    from navi_trio.api.server import ApiServer
    from navi_trio.cli.common import config_source
    from navi_trio.llm.factory import choose_backend
    from navi_trio.runtime import open_runtime

    choice = await choose_backend(options.settings, os.environ, configured=options.llm_configured)
    if choice.note:
        log.warning("%s", choice.note)
    settings = choice.settings
    async with open_runtime(settings, config=config_source(settings)) as rt:
        await ensure_local_token(rt.store, settings.data_dir)
        token = read_local_token(settings.data_dir) or ""
        async with trio.open_nursery() as nursery:
            port = await nursery.start(ApiServer(rt, host="127.0.0.1", port=0).run)
            log.info("a daemon of this process serves on port %s (db %s)", port, settings.db_path)
            yield f"ws://127.0.0.1:{port}/", token
            nursery.cancel_scope.cancel()
