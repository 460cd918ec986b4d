"""``navi mcp``: the MCP subcommand group.

    navi mcp list [--config PATH]    each configured server, its state and its tools

`list` starts every enabled server briefly (initialize + list of tools, at most its
timeout_sec), prints one line per server and its tools, and stops them. Exit 1 when
an enabled server did not start. `add_mcp_parser` creates the group; each subcommand
is one entry of `COMMANDS` (``mcp serve`` joins them).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import trio

from navi_trio.cli_common import EXIT_OK, load_settings
from navi_trio.errors import NaviError
from navi_trio.profiles import load_config


def add_mcp_parser(sub: Any) -> None:
    mcp = sub.add_parser(
        "mcp",
        help="tools from MCP servers: list the configured servers",
        description="MCP (Model Context Protocol) servers give the agent their tools as "
        "mcp__<server>__<tool> (README \"MCP servers\").",
    )
    group = mcp.add_subparsers(dest="mcp_command", metavar="SUBCOMMAND", required=True)
    lister = group.add_parser(
        "list",
        help="start each enabled server briefly; show its state and tools",
        description="Start each enabled MCP server of the config briefly and show its "
        "state and tools. Exit 1 when one did not start.",
    )
    lister.add_argument("--config", type=Path, metavar="PATH", help="config.json (env NAVI_CONFIG)")


def cmd_mcp(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return COMMANDS[args.mcp_command](args, out, err)


def cmd_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from navi_trio.tools.mcp import probe

    settings = load_settings(args)
    cfg = load_config(settings.config_path)
    if not cfg.mcp_servers:
        print(f"no MCP servers in {settings.config_path} (see README \"MCP servers\")", file=out)
        return EXIT_OK
    status = trio.run(probe, cfg)
    for s in status:
        users = [p.id for p in cfg.profiles.values() if s["name"] in p.mcp_servers]
        print(f"{s['name']:<16} {s['transport']:<6} {s['state']:<10} "
              f"profiles: {', '.join(users) or '-'}", file=out)  # fmt: skip
        if s["error"] and not s["ok"]:
            print(f"    error: {s['error']}", file=out)
        for tool in s["tools"]:
            print(f"    mcp__{s['name']}__{tool}", file=out)
        for note in s["notes"]:
            print(f"    warning: {note}", file=out)
    failed = [s["name"] for s in status if not s["ok"]]
    if failed:
        raise NaviError(f"MCP server(s) {', '.join(failed)} did not start")
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace, TextIO, TextIO], int]] = {
    "list": cmd_list,
}
