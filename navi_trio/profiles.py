"""Agent profiles and the config file (`config/config.json`) that holds them.

The file is structured strictly through cattrs: an unknown key, a wrong type or a
missing required key is a `ConfigError` naming the file, the key path and what was
expected. Prompt texts may live beside the file (``system_prompt_file``,
``persona_file``); they are read at load time, relative to the config file.

`check_config` adds what the file's shape cannot say: every tool a profile names exists,
and the config folder holds the prompt files the planning phases and compression read
(`REQUIRED_PROMPT_FILES`). Start-up (`open_runtime`) and ``navi doctor`` run it.

`ConfigSource` keeps the last good config and reloads on demand (hot reload): a broken
edit is logged and the last good config keeps running.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import cattrs

from navi_trio.errors import ConfigError
from navi_trio.strict import ExpectedError, describe, strict_converter

log = logging.getLogger(__name__)

# The tools navi ships (tools/builtin.py plus tasks and spawn_agent in runtime.py). The
# vocabulary cannot import the tools, so the names live here and a test keeps them equal
# to `runtime.default_tools`. A runtime given more tools accepts their names too.
BUILTIN_TOOL_NAMES = frozenset(
    {
        "filesystem",
        "terminal",
        "code_exec",
        "todo",
        "scratchpad",
        "memory",
        "switch_profile",
        "spawn_agent",
        "tasks",
        "ssh_exec",
        "peer",
    }
)

# Files every config folder holds, relative to the folder of config.json: the three
# planning phases (core/planning.py) and the default compression prompt
# (core/compression.py); a test keeps this list equal to the names those modules read.
REQUIRED_PROMPT_FILES = (
    "prompts/planning_analysis.md",
    "prompts/planning_review.md",
    "prompts/planning_plan.md",
    "prompts/compression.md",
)


@attrs.frozen(kw_only=True)
class ToolsConfig:
    agent: tuple[str, ...] = ()
    subagent: tuple[str, ...] = ()


# Tool policy (README "Safety"): modes from least to most power; the roles a user has.
MODES = ("read-only", "workspace", "full")
ROLES = ("admin", "user")
Mode = Literal["read-only", "workspace", "full"]
Decision = Literal["allow", "ask", "deny"]


def _pattern(_inst: Any, attr: attrs.Attribute[Any], value: str) -> None:
    if not value.strip():
        raise ValueError(f'{attr.name} must not be empty (use "*" for any)')


@attrs.frozen(kw_only=True)
class CallPattern:
    """Which calls: a tool, its action, and the command or path (fnmatch patterns)."""

    tool: str = attrs.field(validator=_pattern)
    action: str = attrs.field(default="*", validator=_pattern)
    # terminal run / open: the command line; code_exec: the code; filesystem: the path.
    match: str = attrs.field(default="*", validator=_pattern)


@attrs.frozen(kw_only=True)
class PolicyRule(CallPattern):
    decision: Decision
    roles: tuple[str, ...] = ()  # empty: every role
    # true: a matching terminal / code_exec call gets the network in its sandbox (what
    # the sandbox would otherwise block: make such a rule "ask" unless you trust it).
    network: bool = False


@attrs.frozen(kw_only=True)
class PolicyConfig:
    # role -> the mode its runs get (for a user, also the most it may ask for).
    modes: dict[str, Mode] = attrs.Factory(dict)
    rules: tuple[PolicyRule, ...] = ()
    # With no client attached, a call that would ask runs only when it matches one of
    # these; every other such call is denied.
    headless_allow: tuple[CallPattern, ...] = ()


# SSH hosts for the ssh_exec tool (README "Remote hosts over SSH"). Paths are relative
# to the config folder (or absolute, or ~/...); parse_config makes them absolute and
# check_config requires the files to exist.
_PROGRAM = re.compile(r"[A-Za-z0-9_.+/][A-Za-z0-9_.+/-]*\Z")


def _ssh_word(_inst: Any, attr: attrs.Attribute[Any], value: str) -> None:
    # user and host end up in one argv word "user@host": no option, no second '@'.
    if not value or value.startswith("-") or "@" in value or any(c.isspace() for c in value):
        raise ValueError(
            f"{attr.name}: expected a name without spaces, '@' or a leading '-', got {value!r}"
        )


def _port(_inst: Any, attr: attrs.Attribute[Any], value: int) -> None:
    if not 1 <= value <= 65535:
        raise ValueError(f"{attr.name}: expected a port from 1 to 65535, got {value!r}")


def _non_empty(_inst: Any, attr: attrs.Attribute[Any], value: str) -> None:
    if not value.strip():
        raise ValueError(f"{attr.name}: expected a path, got an empty string")


def _commands(_inst: Any, attr: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if value == ("*",):
        return
    bad = [c for c in value if not _PROGRAM.match(c)]
    if not value or bad:
        raise ValueError(
            f'{attr.name}: expected ["*"] or a list of program names (like "ls"), '
            f"got {list(value)!r}"
        )


@attrs.frozen(kw_only=True)
class SshHost:
    user: str = attrs.field(validator=_ssh_word)
    host: str = attrs.field(validator=_ssh_word)
    port: int = attrs.field(default=22, validator=_port)
    identity_file: str = attrs.field(validator=_non_empty)
    # ["*"]: any command line (the remote shell reads it); else the programs allowed.
    commands: tuple[str, ...] = attrs.field(validator=_commands)

    @property
    def any_command(self) -> bool:
        return self.commands == ("*",)


@attrs.frozen(kw_only=True)
class SshConfig:
    known_hosts: str = attrs.field(validator=_non_empty)
    hosts: dict[str, SshHost] = attrs.Factory(dict)


def _absolute(name: str, base: Path) -> str:
    p = Path(name).expanduser()
    return str(p if p.is_absolute() else base / p)


def _resolve_ssh(ssh: SshConfig, base: Path, path: Path) -> SshConfig:
    for alias in ssh.hosts:
        if not _PROGRAM.match(alias):
            raise ConfigError(
                f"{path}: $.ssh.hosts: expected an alias without spaces, got {alias!r}"
            )
    hosts = {
        alias: attrs.evolve(h, identity_file=_absolute(h.identity_file, base))
        for alias, h in ssh.hosts.items()
    }
    return SshConfig(known_hosts=_absolute(ssh.known_hosts, base), hosts=hosts)


def _check_ssh_shape(data: dict[str, Any], path: Path) -> None:
    """cattrs words a string where an object belongs as an "unknown error": say it here."""
    ssh = data.get("ssh", {})
    hosts = ssh.get("hosts", {}) if isinstance(ssh, dict) else {}
    items = [("$.ssh", ssh), ("$.ssh.hosts", hosts)]
    if isinstance(hosts, dict):
        items += [(f"$.ssh.hosts[{a!r}]", h) for a, h in hosts.items()]
    for where, value in items:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: {where}: expected an object, got {value!r}")


def ssh_problems(ssh: SshConfig | None) -> list[str]:
    """The ssh files that are missing: the known_hosts file and each identity file."""
    if ssh is None:
        return []
    files = [("$.ssh.known_hosts", ssh.known_hosts)]
    files += [(f"$.ssh.hosts[{a!r}].identity_file", h.identity_file) for a, h in ssh.hosts.items()]
    return [f"{key}: {name} not found" for key, name in files if not Path(name).is_file()]


# An MCP server's name is part of its tools' names (`mcp__<server>__<tool>`), which
# OpenAI-style function names limit to letters, digits, _ and - (64 at most).
MCP_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$")
MCP_PREFIX = "mcp__"


@attrs.frozen(kw_only=True)
class McpServerConfig:
    """One MCP server (README "MCP servers"): a command run over stdio, or a URL
    (streamable HTTP). Exactly one of `command` and `url`."""

    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = attrs.Factory(dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = attrs.Factory(dict)
    enabled: bool = True
    timeout_sec: float = 60.0  # one call, and the start (initialize + list of tools)
    tools: tuple[str, ...] | None = None  # allow-list of the server's own tool names
    # true: its tools take ``"background": true`` like the backgroundable built-ins.
    background: bool = False

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"


@attrs.frozen(kw_only=True)
class AgentProfile:
    id: str = ""
    description: str = ""
    model: str | None = None  # None -> Settings.default_model
    system_prompt: str = ""
    system_prompt_file: str | None = None
    subagent_system_prompt: str = ""
    max_iterations: int = 25
    planning_enabled: bool = False
    planning_mandatory: bool = False
    # false: no plan on a session's first message either (small local models: a plan
    # costs three calls they cannot afford and rarely follow)
    planning_first_message: bool = True
    # Thinking mechanics (agent-loop.md), with the spec's defaults.
    think_enabled: bool = True
    iteration_budget_enabled: bool = True
    planning_phase2_enabled: bool = False
    goal_anchoring_enabled: bool = True
    goal_anchoring_interval: int = 5
    anti_stall_enabled: bool = True
    anti_stall_threshold: int = 8
    step_validation_enabled: bool = False
    adaptive_replan_enabled: bool = False
    subagent_planning_enabled: bool = False
    tools: ToolsConfig = ToolsConfig()
    parallel_tool_calls: bool | None = None  # None -> Settings.parallel_tool_calls
    compression_keep_recent: int | None = None
    compression_max_tokens: int | None = None
    # Output caps (None -> Settings.plan_max_tokens / answer_max_tokens).
    plan_max_tokens: int | None = None
    answer_max_tokens: int | None = None
    compression_prompt_file: str | None = None
    policy: PolicyConfig = PolicyConfig()
    # Names of `NaviConfig.mcp_servers` whose tools this profile's runs get.
    mcp_servers: tuple[str, ...] = ()
    # Environment variables (by name) the daemon passes on to its runs' tool processes,
    # beyond the allow-list every one gets (tools/procs.py `child_env`).
    env: tuple[str, ...] = ()

    def model_or(self, default: str) -> str:
        """The profile's model, or `default` (Settings.default_model) when it names none."""
        return self.model or default

    def get_agent_tools(self) -> tuple[str, ...]:
        return self.tools.agent

    def get_subagent_tools(self) -> tuple[str, ...]:
        """tools.subagent, falling back to tools.agent when it is empty."""
        return self.tools.subagent or self.tools.agent


def _ws_url(_inst: Any, attr: attrs.Attribute[Any], value: str) -> None:
    if not value.startswith(("ws://", "wss://")):
        raise ValueError(f"{attr.name} {value!r}: expected a ws:// or wss:// URL")


@attrs.frozen(kw_only=True)
class PeerConfig:
    """Another navi daemon the `peer` tool may ask: its URL and where its token is.

    The token is inline (`token`) or, better, named by an environment variable
    (`token_env`): exactly one of the two. It is kept out of repr and error texts.
    """

    url: str = attrs.field(validator=_ws_url)
    token: str | None = attrs.field(default=None, repr=False)
    token_env: str | None = None
    timeout_sec: float = 600.0  # the longest an `ask` may wait for the peer's answer

    def resolve_token(self, name: str, environ: Mapping[str, str]) -> str:
        """The token; a ConfigError naming the variable (never a value) when unset."""
        if self.token is not None:
            return self.token
        value = environ.get(self.token_env or "", "")
        if not value:
            raise ConfigError(
                f"peer {name!r}: the environment variable {self.token_env} (peers.{name}."
                "token_env) is not set in the daemon's environment"
            )
        return value


@attrs.frozen(kw_only=True)
class NaviConfig:
    persona: str = ""
    persona_file: str | None = None
    default_profile: str
    profiles: dict[str, AgentProfile]
    ssh: SshConfig | None = None  # hosts the ssh_exec tool may reach
    peers: dict[str, PeerConfig] = attrs.Factory(dict)
    mcp_servers: dict[str, McpServerConfig] = attrs.Factory(dict)
    # role -> the folders (and below) a client of that role may send as a run's cwd,
    # besides their own session folders (core/workspace.py); a role without an entry:
    # users none, admins anything but navi's own data.
    workspace_roots: dict[str, tuple[str, ...]] = attrs.Factory(dict)
    base_dir: Path = Path(".")  # folder of the file: prompt files resolve against it

    def profile(self, profile_id: str | None) -> AgentProfile:
        """The named profile, or the default one when `profile_id` is None or unknown."""
        if profile_id and profile_id in self.profiles:
            return self.profiles[profile_id]
        return self.profiles[self.default_profile]

    def resolve_path(self, name: str) -> Path:
        p = Path(name)
        return p if p.is_absolute() else self.base_dir / p


_converter = strict_converter()


def _structure_names(value: Any, _: Any) -> tuple[str, ...]:
    # cattrs would turn the string "filesystem" into ('f', 'i', ...): a list is required.
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ExpectedError(f"expected a list of names, got {value!r}")
    return tuple(value)


def _structure_tools(value: Any, _: Any) -> ToolsConfig:
    if not isinstance(value, dict):
        raise ExpectedError(
            f'expected an object like {{"agent": [...], "subagent": [...]}}, got {value!r}'
        )
    extra = set(value) - {"agent", "subagent"}
    if extra:
        raise ExpectedError(f"unknown keys {sorted(extra)}: expected agent and subagent")
    lists = {}
    for key in ("agent", "subagent"):
        try:
            lists[key] = _structure_names(value.get(key, []), None)
        except ExpectedError as exc:
            raise ExpectedError(f"{key}: {exc}") from None
    return ToolsConfig(**lists)


_converter.register_structure_hook_func(lambda t: t == tuple[str, ...], _structure_names)


def _structure_choice(value: Any, typ: Any) -> Any:
    if value not in typ.__args__:
        choices = ", ".join(repr(a) for a in typ.__args__)
        raise ExpectedError(f"expected one of {choices}, got {value!r}")
    return value


_converter.register_structure_hook_func(lambda t: t in (Decision, Mode), _structure_choice)


def _check_policy_lists(data: dict[str, Any], path: Path) -> None:
    """cattrs reads a string as a list of characters: rule lists must be lists of objects."""
    profiles = data.get("profiles")
    for pid, prof in profiles.items() if isinstance(profiles, dict) else ():
        policy = prof.get("policy") if isinstance(prof, dict) else None
        for key in ("rules", "headless_allow"):
            value = policy.get(key, []) if isinstance(policy, dict) else []
            where = f"$.profiles[{pid!r}].policy.{key}"
            if not isinstance(value, list):
                raise ConfigError(f"{path}: {where}: expected a list of objects, got {value!r}")
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    raise ConfigError(f"{path}: {where}[{i}]: expected an object, got {item!r}")


_converter.register_structure_hook(ToolsConfig, _structure_tools)


def parse_config(data: Any, path: Path) -> NaviConfig:
    """Structure already-decoded JSON into a NaviConfig; errors name `path` and the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level")
    _check_policy_lists(data, path)
    _check_ssh_shape(data, path)
    try:
        cfg = _converter.structure({k: v for k, v in data.items()}, NaviConfig)
    except cattrs.BaseValidationError as exc:
        problems = describe(exc)
        raise ConfigError(f"{path}: {problems}") from None
    if not cfg.profiles:
        raise ConfigError(f"{path}: $.profiles: at least one profile is required")
    if cfg.default_profile not in cfg.profiles:
        raise ConfigError(
            f"{path}: $.default_profile: {cfg.default_profile!r} is not one of the profiles "
            f"({', '.join(sorted(cfg.profiles))})"
        )
    _check_peers(cfg.peers, path)
    _check_mcp(cfg, path)
    _check_workspace_roots(cfg.workspace_roots, path)
    base = path.parent
    persona = cfg.persona
    if cfg.persona_file:
        persona = _read_text(base / cfg.persona_file, path, "$.persona_file")
    profiles = {}
    for pid, prof in cfg.profiles.items():
        where = f"$.profiles[{pid!r}]"
        for field in (
            "goal_anchoring_interval",
            "anti_stall_threshold",
            "max_iterations",
            "compression_keep_recent",
            "compression_max_tokens",
        ):
            value = getattr(prof, field)
            if value is not None and value < 1:  # None: the setting of the same name
                raise ConfigError(f"{path}: {where}.{field}: expected a number of 1 or more")
        for field in ("plan_max_tokens", "answer_max_tokens", "compression_max_tokens"):
            value = getattr(prof, field)
            if value is not None and value < 1:
                raise ConfigError(f"{path}: {where}.{field}: expected a number of 1 or more")
        _check_policy(prof.policy, path, f"{where}.policy")
        bad = [n for n in prof.env if not ENV_NAME.fullmatch(n)]
        if bad:
            raise ConfigError(
                f"{path}: {where}.env: expected environment variable names (letters, digits "
                f"and _, not starting with a digit), got {', '.join(map(repr, bad))}"
            )
        own = [n for n in prof.env if is_secret(n)]
        if own:
            raise ConfigError(
                f"{path}: {where}.env: {', '.join(own)} hold navi's own secrets and never "
                "reach a tool process"
            )
        prompt = prof.system_prompt
        if prof.system_prompt_file:
            prompt = _read_text(base / prof.system_prompt_file, path, f"{where}.system_prompt_file")
        if prof.compression_prompt_file:
            _read_text(
                base / prof.compression_prompt_file, path, f"{where}.compression_prompt_file"
            )
        profiles[pid] = attrs.evolve(prof, id=pid, system_prompt=prompt)
    ssh = None if cfg.ssh is None else _resolve_ssh(cfg.ssh, base, path)
    return attrs.evolve(cfg, persona=persona, profiles=profiles, ssh=ssh, base_dir=base)


def _check_peers(peers: Mapping[str, PeerConfig], path: Path) -> None:
    """Each peer names its token exactly one way, and waits a positive time."""
    for name, peer in peers.items():
        where = f"{path}: $.peers[{name!r}]"
        if (peer.token is None) == (peer.token_env is None):
            raise ConfigError(f"{where}: give exactly one of token_env (better) or token")
        if peer.token is not None and not peer.token.strip():
            raise ConfigError(f"{where}.token: must not be empty")
        if peer.token_env is not None and not peer.token_env.strip():
            raise ConfigError(f"{where}.token_env: must name an environment variable")
        if peer.timeout_sec <= 0:
            raise ConfigError(f"{where}.timeout_sec: expected a number above 0")


def _check_mcp(cfg: NaviConfig, path: Path) -> None:
    """What the shape of `mcp_servers` cannot say, and the profiles' server names."""
    for name, server in cfg.mcp_servers.items():
        where = f"{path}: $.mcp_servers[{name!r}]"
        if not MCP_SERVER_NAME.match(name) or len(name) > 24:
            raise ConfigError(
                f"{where}: a server name is 1-24 letters, digits, - or single _ (it becomes "
                f"part of the tool names mcp__<server>__<tool>)"
            )
        if (server.command is None) == (server.url is None):
            raise ConfigError(
                f"{where}: give exactly one of command (a program spoken to over stdio) "
                "and url (streamable HTTP)"
            )
        if server.command is not None and not server.command.strip():
            raise ConfigError(f"{where}.command: must not be empty")
        if server.url is not None and not server.url.startswith(("http://", "https://")):
            raise ConfigError(
                f"{where}.url: expected an http:// or https:// URL, got {server.url!r}"
            )
        if server.command is None and (server.args or server.env or server.cwd):
            raise ConfigError(f"{where}: args, env and cwd are for a command, not a url")
        if server.url is None and server.headers:
            raise ConfigError(f"{where}.headers: headers are for a url, not a command")
        if server.timeout_sec <= 0:
            raise ConfigError(f"{where}.timeout_sec: expected a number above 0")
    for pid, prof in cfg.profiles.items():
        unknown = [n for n in prof.mcp_servers if n not in cfg.mcp_servers]
        if unknown:
            known = ", ".join(sorted(cfg.mcp_servers)) or "none configured"
            raise ConfigError(
                f"{path}: $.profiles[{pid!r}].mcp_servers: unknown MCP server(s) "
                f"{', '.join(unknown)} (servers: {known})"
            )


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Environment variables navi reads that hold secrets; also any NAVI_* variable with a
# word in its name that says it holds one (NAVI_WS_TOKEN, NAVI_SIGNING_KEY, ...), but
# not a setting that merely counts tokens (NAVI_COMPRESSION_MAX_TOKENS). A profile's
# `env` may not pass them on to tool processes.
SECRET_VARS = frozenset({"NAVI_LLM_API_KEY", "NAVI_TOKEN", "OPENAI_API_KEY"})
_SECRET_WORDS = frozenset({"TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD"})


def is_secret(name: str) -> bool:
    """True for an environment variable of navi's that holds a secret."""
    upper = name.upper()
    if upper in SECRET_VARS:
        return True
    return upper.startswith("NAVI_") and not _SECRET_WORDS.isdisjoint(upper.split("_"))


def _check_workspace_roots(roots: Mapping[str, tuple[str, ...]], path: Path) -> None:
    """Known roles; each root an absolute (or ~) folder, never the root folder."""
    for role, folders in roots.items():
        where = f"{path}: $.workspace_roots"
        if role not in ROLES:
            raise ConfigError(f"{where}: unknown role {role!r} (roles: {', '.join(ROLES)})")
        for i, folder in enumerate(folders):
            p = Path(folder).expanduser()
            if not folder.strip() or not p.is_absolute():
                raise ConfigError(
                    f"{where}[{role!r}][{i}]: expected an absolute folder (or ~/...), "
                    f"got {folder!r}"
                )
            if os.path.realpath(p) == "/":
                raise ConfigError(
                    f"{where}[{role!r}][{i}]: '/' would let a {role}'s commands write "
                    "anywhere the daemon can: name the folders instead"
                )


def _check_policy(policy: PolicyConfig, path: Path, where: str) -> None:
    """What the policy's shape cannot say: known roles, and `full` for admins only."""
    for role, mode in policy.modes.items():
        if role not in ROLES:
            raise ConfigError(
                f"{path}: {where}.modes: unknown role {role!r} (roles: {', '.join(ROLES)})"
            )
        if mode == "full" and role != "admin":
            raise ConfigError(
                f"{path}: {where}.modes[{role!r}]: 'full' (no sandbox) is for admins only"
            )
    for i, rule in enumerate(policy.rules):
        unknown = [r for r in rule.roles if r not in ROLES]
        if unknown:
            raise ConfigError(
                f"{path}: {where}.rules[{i}].roles: unknown role(s) {', '.join(unknown)} "
                f"(roles: {', '.join(ROLES)})"
            )


def _read_text(file: Path, cfg_path: Path, key: str) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{cfg_path}: {key}: cannot read {file}: {exc.strerror}") from None


def check_config(
    cfg: NaviConfig, path: Path, known_tools: Collection[str] = BUILTIN_TOOL_NAMES
) -> None:
    """Refuse a config no run can use: a profile naming a tool that is not one of
    `known_tools`, or a config folder without a file of `REQUIRED_PROMPT_FILES`.

    The ConfigError names the file, the key or the missing file, and every problem found.
    """
    known = frozenset(known_tools)
    problems = []
    for pid, prof in cfg.profiles.items():
        for key, names in (("agent", prof.tools.agent), ("subagent", prof.tools.subagent)):
            unknown = [n for n in names if n not in known]
            if unknown:
                problems.append(
                    f"$.profiles[{pid!r}].tools.{key}: unknown tool(s) {', '.join(unknown)} "
                    f"(known tools: {', '.join(sorted(known))})"
                )
        patterns: list[tuple[str, CallPattern]] = [("rules", r) for r in prof.policy.rules]
        patterns += [("headless_allow", r) for r in prof.policy.headless_allow]
        counts = {"rules": 0, "headless_allow": 0}
        for key, pattern in patterns:
            i = counts[key]
            counts[key] += 1
            if pattern.tool.startswith(MCP_PREFIX):
                server = pattern.tool.removeprefix(MCP_PREFIX).split("__")[0]
                if server and not set("*?[") & set(server) and server not in cfg.mcp_servers:
                    problems.append(
                        f"$.profiles[{pid!r}].policy.{key}[{i}].tool: {pattern.tool!r} names "
                        f"no configured MCP server ({', '.join(sorted(cfg.mcp_servers)) or 'none'})"
                    )
            elif pattern.tool != "*" and pattern.tool not in known:
                problems.append(
                    f"$.profiles[{pid!r}].policy.{key}[{i}].tool: unknown tool "
                    f"{pattern.tool!r} (known tools: {', '.join(sorted(known))})"
                )
    problems += ssh_problems(cfg.ssh)
    for name in REQUIRED_PROMPT_FILES:
        if not (cfg.base_dir / name).is_file():
            problems.append(f"the config folder lacks {name} ({cfg.base_dir / name} not found)")
    if problems:
        raise ConfigError(f"{path}: {'; '.join(problems)}")


def load_config(path: Path) -> NaviConfig:
    """Read and validate the config file at `path`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    return parse_config(data, path)


class ConfigSource:
    """The config in force, reloadable at run time.

    `reload()` re-reads the file; when the new file is broken, the error is logged and
    kept in `last_error`, and `current` stays the last good config. `maybe_reload()`
    reloads only when the file's modification time changed (a cheap stat per turn).
    """

    def __init__(
        self, path: Path, initial: NaviConfig | None = None, *, default_profile: str | None = None
    ) -> None:
        self.path = path
        # `navi ... --local`: new sessions get this profile, whatever the file says.
        self.default_profile = default_profile
        cfg = initial if initial is not None else load_config(path)
        self.current: NaviConfig = self._with_default(cfg)
        self.last_error: ConfigError | None = None
        self.generation = 0
        # Set by `require`: a reload must pass `check_config` with these tool names too.
        self.known_tools: frozenset[str] | None = None
        self._mtime = self._stat()

    def require(self, known_tools: Collection[str]) -> None:
        """Check the config in force, and from now on every reload, with `check_config`.

        Raises ConfigError when the current config fails: start-up refuses it.
        """
        check_config(self.current, self.path, known_tools)
        self.known_tools = frozenset(known_tools)

    def _stat(self) -> float | None:
        try:
            return os.stat(self.path).st_mtime_ns / 1e9
        except OSError:
            return None

    def _with_default(self, cfg: NaviConfig) -> NaviConfig:
        if self.default_profile is None or self.default_profile not in cfg.profiles:
            return cfg
        return attrs.evolve(cfg, default_profile=self.default_profile)

    def reload(self) -> bool:
        """Re-read the file. True when a new config took effect."""
        self._mtime = self._stat()
        try:
            cfg = load_config(self.path)
            if self.known_tools is not None:
                check_config(cfg, self.path, self.known_tools)
        except ConfigError as exc:
            self.last_error = exc
            log.error("config reload failed, keeping the last good config: %s", exc)
            return False
        self.current = self._with_default(cfg)
        self.last_error = None
        self.generation += 1
        return True

    def maybe_reload(self) -> bool:
        if self._stat() != self._mtime:
            return self.reload()
        return False
