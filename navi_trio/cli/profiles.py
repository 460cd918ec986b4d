"""``navi profiles``: the profiles a run in a folder may name, and where each came from.

The config's profiles, then the agents kept as files in the folder, read as a run there
reads them (never through a link out of it), with why any file is not used.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, TextIO

from navi_trio.cli.common import EXIT_ERROR, EXIT_OK, load_settings, one_line


def add_profiles_parser(sub: Any, endpoint_options: Any) -> None:
    p = sub.add_parser(
        "profiles",
        help="list the profiles: config.json's and the agents kept as files here",
        description="List the profiles a run may use: those of config.json, and the agents "
        "kept as files (.navi/agents, .claude/agents) in the folder, with where each came "
        "from and why a file is not used.",
    )
    endpoint_options(p)
    p.add_argument("--cwd", type=Path, metavar="DIR", help="the folder (default: this one)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def collect_profiles(args: argparse.Namespace) -> dict[str, Any]:
    # Imported here: `navi --help` and the other commands need none of it.
    from navi_trio.errors import RootChangedError
    from navi_trio.profiles import load_config
    from navi_trio.project import FileAgents, config_models, find_agents
    from navi_trio.tools.private import private_paths
    from navi_trio.tools.roots import CWD, Root
    from navi_trio.tools.runas import run_as

    settings = load_settings(args)
    path = settings.config_path
    cfg = load_config(path)
    folder = Path(os.path.realpath((args.cwd or Path.cwd()).expanduser()))
    profiles: list[dict[str, Any]] = [
        {
            "id": p.id,
            "description": p.description,
            "model": p.model_or(settings.default_model),
            "tools": list(p.get_agent_tools()),
            "source": str(path),
            "default": p.id == cfg.default_profile,
        }
        for p in cfg.profiles.values()
    ]
    try:
        with Root.open(folder, CWD, given=args.cwd or folder) as root:
            found = find_agents(
                [root],
                folder,
                private_paths(settings),
                run_as(settings.tool_user),
                models=config_models(cfg.profiles.values(), settings.default_model),
                profiles=cfg.profiles,
            )
    except RootChangedError as exc:
        found = FileAgents(problems=[str(exc)])
    for agent in found.agents.values():
        profiles.append(
            {
                "id": agent.name,
                "description": agent.description,
                "model": agent.model or "the spawning run's",
                "tools": None if agent.tools is None else list(agent.tools),
                "source": str(agent.source),
                "default": False,
            }
        )
    return {"profiles": profiles, "problems": found.problems}


def print_profiles(report: dict[str, Any], out: TextIO) -> None:
    for p in report["profiles"]:
        default = " (default)" if p["default"] else ""
        tools = "the spawning run's" if p["tools"] is None else ", ".join(p["tools"]) or "none"
        print(f"{p['id']}{default}  — {one_line(p['description'])}", file=out)
        print(f"    from {p['source']}; model {p['model']}; tools {tools}", file=out)
    for problem in report["problems"]:
        print(f"not used: {one_line(problem)}", file=out)


def cmd_profiles(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    report = collect_profiles(args)
    if args.json:
        print(json.dumps(report), file=out)
    else:
        print_profiles(report, out)
    if report["problems"]:
        print(f"navi: warning: {len(report['problems'])} agent file(s) not used", file=err)
    return EXIT_OK if report["profiles"] else EXIT_ERROR
