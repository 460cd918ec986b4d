"""``navi mcp list | serve``: navi_trio and the Model Context Protocol.

`list` starts every enabled server briefly (initialize and list its tools, within its
timeout_sec), prints each with its tools, and exits 1 when an enabled one did not
start. `serve` is navi as an MCP server on stdio. The MCP SDK is imported only when a
subcommand runs, so `navi run` does not pay for it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from navi_trio.api.remote import DEFAULT_URL
from navi_trio.cli.common import add_token_option
from navi_trio.text import terminal_safe


def add_mcp_parser(
    sub: Any, endpoint_options: Callable[[argparse.ArgumentParser], None] | None = None
) -> None:
    """The `mcp` group of subcommands; `endpoint_options` adds --db, --config, --llm-url …"""
    mcp = sub.add_parser(
        "mcp",
        help="Model Context Protocol: list the MCP servers, or serve navi over MCP",
        description="MCP (Model Context Protocol) servers give the agent their tools as "
        "mcp__<server>__<tool> (docs/pages/mcp.md); `navi mcp serve` lets another agent "
        "use navi.",
    )
    group = mcp.add_subparsers(dest="mcp_command", metavar="SUBCOMMAND", required=True)
    lister = group.add_parser(
        "list",
        help="start each enabled server briefly; show its state and tools",
        description="Start each enabled MCP server of the config briefly and show its "
        "state and tools. Exit 1 when one did not start.",
    )
    lister.add_argument("--config", type=Path, metavar="PATH", help="config.json (env NAVI_CONFIG)")
    serve = group.add_parser(
        "serve",
        help="serve navi's `ask` and `sessions` tools over MCP on stdio",
        description="Serve MCP on stdin/stdout for another agent (e.g. `claude mcp add navi "
        "-- navi mcp serve`). Each `ask` runs like `navi run`: in the daemon when one "
        "answers (--url, default the local one), else in this process. Tool calls that "
        "need approval are denied (nobody can approve them over MCP). Logs go to stderr.",
    )
    add_target_options(
        serve, "safety mode for every run, within what your role allows (default: the profile's)"
    )
    if endpoint_options is not None:
        endpoint_options(serve)


def add_target_options(p: argparse.ArgumentParser, mode_help: str) -> None:
    """--url, --token, --profile and --mode of a command that serves navi on stdio."""
    p.add_argument("--url", help=f"run in this daemon (default: {DEFAULT_URL} if it answers)")
    add_token_option(p)
    p.add_argument("--profile", metavar="P", help="profile for new sessions")
    p.add_argument("--mode", choices=("read-only", "workspace", "full"), help=mode_help)


def cmd_mcp(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return COMMANDS[args.mcp_command](args, out, err)


def cmd_mcp_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import trio

    from navi_trio.cli.common import EXIT_OK, load_settings
    from navi_trio.errors import NaviError
    from navi_trio.profiles import load_config
    from navi_trio.tools.mcp import probe

    settings = load_settings(args)
    cfg = load_config(settings.config_path)
    if not cfg.mcp_servers:
        print(f"no MCP servers in {settings.config_path} (see docs/pages/mcp.md)", file=out)
        return EXIT_OK
    status = trio.run(probe, cfg, None, settings.tool_user, settings.bwrap_path)
    for s in status:
        users = [p.id for p in cfg.profiles.values() if s["name"] in p.mcp_servers]
        print(
            f"{s['name']:<16} {s['transport']:<6} {s['state']:<10} "
            f"profiles: {', '.join(users) or '-'}",
            file=out,
        )
        if s["error"] and not s["ok"]:
            print(terminal_safe(f"    error: {s['error']}"), file=out)
        for tool in s["tools"]:
            print(terminal_safe(f"    mcp__{s['name']}__{tool}"), file=out)
        for note in s["notes"]:
            print(terminal_safe(f"    warning: {note}"), file=out)
    failed = [s["name"] for s in status if not s["ok"]]
    if failed:
        raise NaviError(f"MCP server(s) {', '.join(failed)} did not start")
    return EXIT_OK


def cmd_mcp_serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import trio

    from navi_trio.cli.common import EXIT_OK, llm_given, load_settings, run_target
    from navi_trio.cli.mcp_server import ServeOptions, serve
    from navi_trio.llm.factory import backend_configured

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


COMMANDS: dict[str, Callable[[argparse.Namespace, TextIO, TextIO], int]] = {
    "list": cmd_mcp_list,
    "serve": cmd_mcp_serve,
}
