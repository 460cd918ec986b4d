"""Sub-agents kept as files: ``.navi/agents/*.md`` and ``.claude/agents/*.md``.

The format is Claude Code's: YAML front matter (``name``, ``description``, ``tools``,
``model``) and the body as the system prompt. A file is checked as strictly as a profile
of config.json; a bad one is an error naming the file and the key, and is skipped.

A repository is untrusted input, so a file never widens anything: its profile is the
spawning run's own narrowed (`narrowed`), its model only one the config already uses.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import attrs

from navi_trio.errors import ConfigError
from navi_trio.profiles import BUILTIN_TOOL_NAMES, MCP_PREFIX, AgentProfile, ToolsConfig
from navi_trio.project.files import Found, read_md_folders
from navi_trio.project.frontmatter import check_keys, shown, split_front_matter, text_value
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.roots import Root
from navi_trio.tools.runas import RunAs

AGENT_FOLDERS = (".navi/agents", ".claude/agents")  # the first one's name wins a clash
KEYS = ("name", "description", "tools", "model", "color")  # color: Claude Code's, shown only
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
DESCRIPTION_MAX = 1024
INHERIT = "inherit"  # Claude Code's model: the parent's

# Claude Code's tool names, as navi's tools that do the same; its tools navi has no
# twin of are dropped (named in `FileAgent.dropped`), never an error.
CLAUDE_TOOLS = {
    "Read": "filesystem",
    "Write": "filesystem",
    "Edit": "filesystem",
    "MultiEdit": "filesystem",
    "Glob": "filesystem",
    "Grep": "filesystem",
    "LS": "filesystem",
    "Bash": "terminal",
    "TodoWrite": "todo",
    "Task": "spawn_agent",
}
CLAUDE_ONLY = frozenset(
    {"WebFetch", "WebSearch", "NotebookRead", "NotebookEdit", "BashOutput", "KillShell"}
)


@attrs.frozen(kw_only=True)
class FileAgent:
    """One agent file, checked. `tools` None: the spawning profile's own."""

    name: str
    description: str
    tools: tuple[str, ...] | None
    model: str | None  # None: the parent's
    prompt: str
    source: Path
    dropped: tuple[str, ...] = ()  # Claude Code tools navi has no twin of


@attrs.frozen
class FileAgents:
    """The agents found (by name), and why other files were skipped."""

    agents: dict[str, FileAgent] = attrs.Factory(dict)
    problems: list[str] = attrs.Factory(list)


def _tool_names(
    value: Any, path: Path, known: Collection[str]
) -> tuple[tuple[str, ...], list[str]]:
    if isinstance(value, str):
        names = [n.strip() for n in value.split(",") if n.strip()]
    elif isinstance(value, list) and all(isinstance(n, str) for n in value):
        names = [n.strip() for n in value]
    else:
        raise ConfigError(
            f"{path}: $.tools: expected tool names, comma-separated or a list, got {shown(value)}"
        )
    tools: list[str] = []
    dropped: list[str] = []
    for name in names:
        if name in CLAUDE_ONLY:
            dropped.append(name)
            continue
        tool = CLAUDE_TOOLS.get(name, name)
        if tool not in known and not tool.startswith(MCP_PREFIX):
            raise ConfigError(
                f"{path}: $.tools: unknown tool {name!r} (navi's tools: "
                f"{', '.join(sorted(known))}; Claude Code's names are taken too)"
            )
        if tool not in tools:
            tools.append(tool)
    return tuple(tools), dropped


def parse_agent(
    text: str,
    path: Path,
    *,
    models: Collection[str],
    known_tools: Collection[str] = BUILTIN_TOOL_NAMES,
) -> FileAgent:
    """One agent file's text, checked; a `ConfigError` naming the file and key."""
    data, body = split_front_matter(text, path, required=True)
    check_keys(data, path, KEYS)
    name = text_value(data, "name", path, max_chars=64)
    if name is None:
        raise ConfigError(f"{path}: $.name: missing (the name spawn_agent calls it by)")
    if not NAME.fullmatch(name):
        raise ConfigError(
            f"{path}: $.name: expected lowercase letters, digits, - and _ (1-64), got {name!r}"
        )
    description = text_value(data, "description", path, max_chars=DESCRIPTION_MAX)
    if not description:
        raise ConfigError(f"{path}: $.description: missing (when to use this agent)")
    text_value(data, "color", path, max_chars=32)
    tools: tuple[str, ...] | None = None
    dropped: list[str] = []
    if data.get("tools") is not None:
        tools, dropped = _tool_names(data["tools"], path, known_tools)
    model = text_value(data, "model", path, max_chars=200)
    if model == INHERIT:
        model = None
    if model is not None and model not in models:
        raise ConfigError(
            f"{path}: $.model: {model!r} is not a model this config uses "
            f"({', '.join(sorted(models))}, or inherit)"
        )
    prompt = body.strip()
    if not prompt:
        raise ConfigError(f"{path}: the body (the agent's system prompt) is empty")
    return FileAgent(
        name=name,
        description=description,
        tools=tools,
        model=model,
        prompt=prompt,
        source=path,
        dropped=tuple(dropped),
    )


def agent_folders(cwd: Path) -> list[Path]:
    """Where a run in `cwd` finds its agents."""
    return [cwd / sub for sub in AGENT_FOLDERS]


def collect_agents(
    found: Found,
    *,
    models: Collection[str],
    profiles: Collection[str],
    known_tools: Collection[str] = BUILTIN_TOOL_NAMES,
) -> FileAgents:
    """The agents of the files `found`; a bad file, a name a config profile has, or a
    name an earlier file took, is a problem and skipped."""
    result = FileAgents(problems=list(found.problems))
    for md in found.files:
        try:
            agent = parse_agent(md.text, md.path, models=models, known_tools=known_tools)
        except ConfigError as exc:
            result.problems.append(f"{exc}; skipped")
            continue
        if agent.name in profiles:
            result.problems.append(
                f"{md.path}: $.name: {agent.name!r} is a profile of config.json, which "
                "wins; skipped"
            )
            continue
        first = result.agents.get(agent.name)
        if first is not None:
            result.problems.append(
                f"{md.path}: $.name: {agent.name!r} is taken by {first.source}; skipped"
            )
            continue
        result.agents[agent.name] = agent
    return result


def find_agents(
    roots: Sequence[Root],
    cwd: Path,
    private: PrivatePaths,
    who: RunAs | None,
    *,
    models: Collection[str],
    profiles: Collection[str],
    known_tools: Collection[str] = BUILTIN_TOOL_NAMES,
) -> FileAgents:
    """The agent files of a run in `cwd` (held among `roots`), read through the roots.
    Blocking: run it in a worker thread."""
    found = read_md_folders(roots, agent_folders(cwd), private, who)
    above = repository_above(cwd)
    if above is not None:
        found.problems.append(
            f"{above}: the repository's root is above the run's working folder, outside "
            "the folders this run may read: its agents are not read"
        )
    return collect_agents(found, models=models, profiles=profiles, known_tools=known_tools)


def repository_above(cwd: Path) -> Path | None:
    """The folder holding ``.git`` above `cwd` (not `cwd` itself), if any: named in a
    notice, never read. Blocking (a stat per parent)."""
    if os.path.lexists(cwd / ".git"):
        return None
    for parent in cwd.parents:
        if os.path.lexists(parent / ".git"):
            return parent
    return None


def config_models(profiles: Collection[AgentProfile], default_model: str) -> set[str]:
    """The models a config already uses: the default and each profile's own."""
    return {default_model, *(p.model for p in profiles if p.model)}


def narrowed(agent: FileAgent, base: AgentProfile) -> tuple[AgentProfile, tuple[str, ...]]:
    """The profile a file agent runs with: `base` (the spawning run's profile) with the
    file's prompt, description and model, and of the file's tools only those `base` gives
    its sub-agents; also the tools left out. Everything else stays `base`'s."""
    allowed = base.get_subagent_tools()
    asked = allowed if agent.tools is None else agent.tools
    tools = tuple(t for t in asked if t in allowed)
    left_out = tuple(t for t in asked if t not in allowed)
    profile = attrs.evolve(
        base,
        id=agent.name,
        description=agent.description,
        model=agent.model or base.model,
        system_prompt=agent.prompt,
        system_prompt_file=None,
        subagent_system_prompt=agent.prompt,
        tools=ToolsConfig(agent=tools, subagent=tools),
    )
    return profile, left_out
