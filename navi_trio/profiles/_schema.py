"""The shape of the config file (`config/config.json`): every class a key becomes.

Field validators check what one value can say; `_load` checks the rest. Also here: the
names of the tools navi ships, the prompt files a config folder holds, and which
environment variables hold navi's own secrets (`is_secret`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from navi_trio.errors import ConfigError
from navi_trio.profiles._control import BudgetConfig, OnBusy
from navi_trio.profiles._hooks import HookConfig, HookFilesConfig
from navi_trio.profiles._policy import PolicyConfig

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
        "skill",
    }
)

# Files every config folder holds, relative to the folder of config.json: the three
# planning phases (core/turn/planning.py) and the default compression prompt
# (core/turn/compression.py); a test keeps this list equal to the names those modules read.
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


# SSH hosts for the ssh_exec tool (docs/pages/tools.md, "Remote hosts over SSH"). Paths are relative
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


# An MCP server's name is part of its tools' names (`mcp__<server>__<tool>`), which
# OpenAI-style function names limit to letters, digits, _ and - (64 at most).
MCP_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$")
MCP_PREFIX = "mcp__"


def _whole_from(low: int, high: int) -> Any:
    def check(_inst: Any, attr: attrs.Attribute[Any], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(
                f"{attr.name}: expected a whole number from {low} to {high}, got {value!r}"
            )

    return check


def _cores(_inst: Any, attr: attrs.Attribute[Any], value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.01 <= value <= 1024:
        raise ValueError(
            f"{attr.name}: expected a number of cores from 0.01 to 1024, got {value!r}"
        )


@attrs.frozen(kw_only=True)
class ProcessLimits:
    """The kernel limits on one session's tool processes together, where cgroups can be
    used: memory in MiB, processes and threads, CPU cores (None: no CPU limit)."""

    memory_mb: int = attrs.field(default=2048, validator=_whole_from(16, 1 << 22))
    pids: int = attrs.field(default=512, validator=_whole_from(8, 1 << 22))
    cpu_cores: float | None = attrs.field(default=None, validator=_cores)


@attrs.frozen(kw_only=True)
class McpServerConfig:
    """One MCP server (docs/pages/mcp.md, "MCP servers"): a command run over stdio, or a URL
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
    # true: its tools change no local files, so no checkpoint is taken before them.
    read_only: bool = False
    # Kernel limits on a stdio server's processes (cgroups, where they can be used): the
    # server is the daemon's, shared by the sessions that use it, so its limits are its own.
    limits: ProcessLimits = ProcessLimits()

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
    # beyond the allow-list every one gets (tools/procs `child_env`).
    env: tuple[str, ...] = ()
    # Control of a running agent: what a message does while the session is busy; what a
    # run may spend; whether a background job that ends while the session is idle starts
    # a turn with its note.
    on_busy: OnBusy = "enqueue"
    budgets: BudgetConfig = BudgetConfig()
    wake_on_task_done: bool = False
    # Kernel limits on the session's tool processes (cgroups, where they can be used).
    limits: ProcessLimits = ProcessLimits()

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


def _price(instance: Any, attribute: Any, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a price of zero or more, not {value!r}")


@attrs.frozen(kw_only=True)
class ModelConfig:
    """What navi knows of a model beyond its name: its price per million tokens, in the
    currency the admin reads (`navi usage` shows cost where both are set)."""

    price_in: float | None = attrs.field(default=None, validator=_price)
    price_out: float | None = attrs.field(default=None, validator=_price)

    def cost(self, tokens_in: int, tokens_out: int) -> float | None:
        if self.price_in is None or self.price_out is None:
            return None
        return (tokens_in * self.price_in + tokens_out * self.price_out) / 1_000_000


@attrs.frozen(kw_only=True)
class PeerConfig:
    """Another navi daemon the `peer` tool may ask: its URL and its token, inline (`token`)
    or, better, named by an environment variable (`token_env`): exactly one of the two.
    Kept out of repr and error texts.
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
    # model name -> its price (`navi usage`); a model not named has no known cost.
    models: dict[str, ModelConfig] = attrs.Factory(dict)
    # role -> the folders (and below) a client of that role may send as a run's cwd,
    # besides their own session folders (core/turn/workspace.py); a role without an entry:
    # users none, admins anything but navi's own data.
    workspace_roots: dict[str, tuple[str, ...]] = attrs.Factory(dict)
    # role -> the budgets of every run of a user with that role (the profile's apply
    # too: the lower limit wins).
    role_budgets: dict[str, BudgetConfig] = attrs.Factory(dict)
    # role -> the profiles a run of that role may use (a message's, a session's, a
    # schedule's, switch_profile's, spawn_agent's); a role without an entry: any.
    role_profiles: dict[str, tuple[str, ...]] = attrs.Factory(dict)
    # event -> the commands run at it (docs/pages/hooks.md); and which hook files of a
    # run's folder are read, and trusted.
    hooks: dict[str, tuple[HookConfig, ...]] = attrs.Factory(dict)
    hook_files: HookFilesConfig = HookFilesConfig()
    base_dir: Path = Path(".")  # folder of the file: prompt files resolve against it

    def profile(self, profile_id: str | None) -> AgentProfile:
        """The named profile, or the default one when `profile_id` is None or unknown."""
        if profile_id and profile_id in self.profiles:
            return self.profiles[profile_id]
        return self.profiles[self.default_profile]

    def may_use(self, role: str, profile_id: str) -> bool:
        """Whether a run of `role` may use the profile (`role_profiles`)."""
        allowed = self.role_profiles.get(role)
        return allowed is None or profile_id in allowed

    def profiles_for(self, role: str) -> list[str]:
        """The profiles a run of `role` may use, sorted."""
        return sorted(p for p in self.profiles if self.may_use(role, p))

    def default_for(self, role: str) -> str:
        """The profile a run of `role` gets when it names none: the default profile, or
        the role's first one when the default is not among its `role_profiles`."""
        if self.may_use(role, self.default_profile):
            return self.default_profile
        return self.role_profiles[role][0]

    def refuse_profile(self, role: str, profile_id: str) -> str | None:
        """Why a run of `role` may not use the profile, or None when it may."""
        if self.may_use(role, profile_id):
            return None
        return (
            f"profile {profile_id!r} is not one a {role} may use (role_profiles): "
            f"{', '.join(self.profiles_for(role))}"
        )

    def resolve_path(self, name: str) -> Path:
        p = Path(name)
        return p if p.is_absolute() else self.base_dir / p


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Environment variables navi reads that hold secrets; also any NAVI_* variable with a
# word in its name that says it holds one (NAVI_WS_TOKEN, NAVI_SIGNING_KEY, ...), but
# not a setting that merely counts tokens (NAVI_COMPRESSION_MAX_TOKENS). NAVI_DB may
# hold the PostgreSQL password (an admin of every daemon on it). A profile's `env` may
# not pass them on to tool processes; nor the variables the config names as holding a
# secret (`config_secrets`).
SECRET_VARS = frozenset({"NAVI_LLM_API_KEY", "NAVI_TOKEN", "OPENAI_API_KEY", "NAVI_DB"})
_SECRET_WORDS = frozenset({"TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD"})


def _says_secret(upper: str) -> bool:
    return not _SECRET_WORDS.isdisjoint(upper.split("_"))


def config_secrets(config: NaviConfig) -> dict[str, str]:
    """The variables `config` names as holding a secret (upper case) -> what they hold: a
    peer's ``token_env``, and an MCP server's ``env`` keys whose name says secret (the
    daemon's own value of such a name is the server's credential as well)."""
    found: dict[str, str] = {}
    for name, peer in config.peers.items():
        if peer.token_env:
            found[peer.token_env.upper()] = f"the token of peers.{name}"
    for name, server in config.mcp_servers.items():
        for key in server.env:
            if _says_secret(key.upper()):
                found.setdefault(key.upper(), f"a secret of mcp_servers.{name}")
    return found


def is_secret(name: str, config: NaviConfig | None = None) -> bool:
    """True for an environment variable of navi's that holds a secret, or (with
    `config`) one the config names as holding one."""
    upper = name.upper()
    if upper in SECRET_VARS:
        return True
    if upper.startswith("NAVI_") and _says_secret(upper):
        return True
    return config is not None and upper in config_secrets(config)
