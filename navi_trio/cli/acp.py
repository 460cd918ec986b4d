"""`navi acp`: the Agent Client Protocol agent on stdio (navi_trio/acp/), for editors."""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TextIO

from navi_trio.cli.mcp import add_target_options

if TYPE_CHECKING:
    from navi_trio.api.endpoint import Endpoint
    from navi_trio.settings import Settings

log = logging.getLogger(__name__)


def add_acp_parser(sub: Any, endpoint_options: Callable[[argparse.ArgumentParser], None]) -> None:
    acp = sub.add_parser(
        "acp",
        help="serve navi to an editor over the Agent Client Protocol on stdio",
        description="An ACP agent on stdin/stdout for Zed, the JetBrains IDEs, Neovim and "
        "other ACP clients (the editor starts it). Sessions are the daemon's when one "
        "answers (--url, default the local one), else a daemon of this process. Logs go "
        "to stderr.",
    )
    add_target_options(acp, "safety mode new sessions start in, within what your role allows")
    endpoint_options(acp)


def cmd_acp(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import os

    import trio

    from navi_trio.cli.common import EXIT_OK, llm_given, load_settings, run_target
    from navi_trio.llm.factory import backend_configured

    try:
        from navi_trio.acp.backend import BackendOptions
        from navi_trio.acp.serve import serve
    except ImportError as exc:
        from navi_trio.errors import ConfigError

        raise ConfigError(
            f"navi acp needs the ACP SDK: pip install 'navi-trio[acp]' ({exc})"
        ) from None
    settings = load_settings(args)
    configured = backend_configured(os.environ, given=llm_given(args))
    options = BackendOptions(
        target=run_target(args, settings),
        private=lambda: _private(settings, configured),
        settings=settings,
    )
    trio.run(serve, options, args.mode, args.profile)
    return EXIT_OK


@asynccontextmanager
async def _private(settings: Settings, llm_configured: bool) -> AsyncIterator[Endpoint]:
    """The command's private daemon (`private_endpoint`, as every verb opens one), with
    the backend chosen as `navi run` chooses it when none is configured."""
    import os

    from navi_trio.cli.common import config_source
    from navi_trio.cli.runner import private_endpoint
    from navi_trio.llm.factory import choose_backend

    choice = await choose_backend(settings, os.environ, configured=llm_configured)
    if choice.note:
        log.warning("%s", choice.note)
    chosen = choice.settings
    async with private_endpoint(chosen, config_source(chosen)) as endpoint:
        log.info("a private daemon serves %s (db %s)", endpoint.url, chosen.db_path)
        yield endpoint
