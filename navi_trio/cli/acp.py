"""`navi acp`: the Agent Client Protocol agent on stdio (navi_trio/acp/), for editors."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TextIO

from navi_trio.cli.mcp import add_target_options


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
        from navi_trio.acp import BackendOptions, serve
    except ImportError as exc:
        from navi_trio.errors import ConfigError

        raise ConfigError(
            f"navi acp needs the ACP SDK: pip install 'navi-trio[acp]' ({exc})"
        ) from None
    settings = load_settings(args)
    options = BackendOptions(
        target=run_target(args, settings),
        settings=settings,
        llm_configured=backend_configured(os.environ, given=llm_given(args)),
    )
    trio.run(serve, options, args.mode, args.profile)
    return EXIT_OK
