"""``navi mcp``: navi_trio and the Model Context Protocol.

    navi mcp serve [--url URL] [--token T] [--profile P] [--mode M] [--db PATH] ...

`serve` is navi_trio as an MCP server on stdio (mcp_serve.py): another agent calls its
`ask` and `sessions` tools. The MCP SDK is imported only when a subcommand runs, so
`navi run` does not pay for it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, TextIO

from navi_trio.api.remote import DEFAULT_URL


def add_mcp_parser(
    sub: Any, endpoint_options: Callable[[argparse.ArgumentParser], None] | None = None
) -> None:
    """The `mcp` group of subcommands; `endpoint_options` adds --db, --config, --llm-url …"""
    mcp = sub.add_parser("mcp", help="Model Context Protocol: navi as an MCP server")
    group = mcp.add_subparsers(dest="mcp_command", metavar="SUBCOMMAND", required=True)
    serve = group.add_parser(
        "serve",
        help="serve navi's `ask` and `sessions` tools over MCP on stdio",
        description="Serve MCP on stdin/stdout for another agent (e.g. `claude mcp add navi "
        "-- navi mcp serve`). Each `ask` runs like `navi run`: in the daemon when one "
        "answers (--url, default the local one), else in this process. Tool calls that "
        "need approval are denied (nobody can approve them over MCP). Logs go to stderr.",
    )
    serve.add_argument("--url", help=f"run in this daemon (default: {DEFAULT_URL} if it answers)")
    serve.add_argument("--token", metavar="T", help="token (env NAVI_TOKEN, else local-token)")
    serve.add_argument("--profile", metavar="P", help="profile for new sessions")
    serve.add_argument(
        "--mode",
        choices=("read-only", "workspace", "full"),
        help="safety mode for every run, within what your role allows (default: the profile's)",
    )
    if endpoint_options is not None:
        endpoint_options(serve)


def cmd_mcp(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.mcp_command == "serve":
        return cmd_mcp_serve(args, out, err)
    raise AssertionError(f"unknown mcp subcommand {args.mcp_command!r}")  # argparse checks


def cmd_mcp_serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import trio

    from navi_trio.cli_common import EXIT_OK, llm_given, load_settings
    from navi_trio.cli_run import run_target
    from navi_trio.llm.factory import backend_configured
    from navi_trio.mcp_serve import ServeOptions, serve

    settings = load_settings(args)
    options = ServeOptions(
        target=run_target(args, settings),
        settings=settings,
        llm_configured=backend_configured(os.environ, given=llm_given(args)),
        profile=args.profile,
        mode=args.mode,
    )
    trio.run(serve, options)
    return EXIT_OK
