"""Reading config.json strictly: structure it, check it, refuse what no run can use.

An unknown key, a wrong type or a missing required key is a `ConfigError` naming the
file, the key path and what was expected. Prompt texts beside the file are read at load
time. `check_config` adds what needs the world outside the file: the tools exist, the
ssh files and the required prompt files are there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs

from navi_trio.errors import ConfigError
from navi_trio.profiles._control import OnBusy
from navi_trio.profiles._hooks import HookFormat, _check_hooks_shape
from navi_trio.profiles._policy import (
    ROLES,
    Decision,
    Mode,
    Paths,
    _check_policy,
    _check_policy_lists,
)
from navi_trio.profiles._schema import (
    _PROGRAM,
    BUILTIN_TOOL_NAMES,
    ENV_NAME,
    MCP_PREFIX,
    MCP_SERVER_NAME,
    REQUIRED_PROMPT_FILES,
    NaviConfig,
    PeerConfig,
    ProcessLimits,
    SshConfig,
    ToolsConfig,
    config_secrets,
    is_secret,
)
from navi_trio.strict import ExpectedError, QuickFirst, describe, strict_converter


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


_converter.register_structure_hook_func(
    lambda t: t in (Decision, Mode, OnBusy, Paths, HookFormat), _structure_choice
)


_converter.register_structure_hook(ToolsConfig, _structure_tools)
# Every hook is registered above: a valid file is structured by plain generated code.
_structurer = QuickFirst(_converter)


def parse_config(data: Any, path: Path) -> NaviConfig:
    """Structure already-decoded JSON into a NaviConfig; errors name `path` and the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level")
    _check_policy_lists(data, path)
    _check_ssh_shape(data, path)
    _check_hooks_shape(data, path)
    try:
        cfg = _structurer.structure({k: v for k, v in data.items()}, NaviConfig)
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
    for key in ("role_budgets", "role_profiles"):
        unknown_roles = sorted(set(getattr(cfg, key)) - set(ROLES))
        if unknown_roles:
            raise ConfigError(
                f"{path}: $.{key}: unknown role(s) {', '.join(map(repr, unknown_roles))} "
                f"(roles: {', '.join(ROLES)})"
            )
    _check_role_profiles(cfg, path)
    base = path.parent
    persona = cfg.persona
    if cfg.persona_file:
        persona = _read_text(base / cfg.persona_file, path, "$.persona_file")
    profiles = {}
    secrets = config_secrets(cfg)
    for pid, prof in cfg.profiles.items():
        where = f"$.profiles[{pid!r}]"
        for field in (
            "goal_anchoring_interval",
            "anti_stall_threshold",
            "max_iterations",
            "compression_keep_recent",
            "compression_max_tokens",
            "plan_max_tokens",
            "answer_max_tokens",
        ):
            value = getattr(prof, field)
            if value is not None and value < 1:  # None: the setting of the same name
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
        named = [(n, secrets[n.upper()]) for n in prof.env if n.upper() in secrets]
        if named:
            held = "; ".join(f"{n} holds {what}" for n, what in named)
            raise ConfigError(f"{path}: {where}.env: {held}: it never reaches a tool process")
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


def _check_role_profiles(cfg: NaviConfig, path: Path) -> None:
    """Each role's list names at least one profile, and only profiles of the file."""
    for role, names in cfg.role_profiles.items():
        where = f"{path}: $.role_profiles[{role!r}]"
        if not names:
            raise ConfigError(f"{where}: name at least one profile (leave the role out: any)")
        unknown = [n for n in names if n not in cfg.profiles]
        if unknown:
            raise ConfigError(
                f"{where}: unknown profile(s) {', '.join(map(repr, unknown))} "
                f"(profiles: {', '.join(sorted(cfg.profiles))})"
            )


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
        if server.command is None and server.limits != ProcessLimits():
            raise ConfigError(f"{where}.limits: limits are for a command, not a url")
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


def _read_text(file: Path, cfg_path: Path, key: str) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{cfg_path}: {key}: cannot read {file}: {exc.strerror}") from None


def check_config(
    cfg: NaviConfig, path: Path, known_tools: Collection[str] = BUILTIN_TOOL_NAMES
) -> None:
    """Refuse a config no run can use: a profile naming a tool not in `known_tools`, or a
    config folder without a file of `REQUIRED_PROMPT_FILES`. The ConfigError names every
    problem found.
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
        listed = (("rules", prof.policy.rules), ("headless_allow", prof.policy.headless_allow))
        for key, i, pattern in [(k, i, p) for k, ps in listed for i, p in enumerate(ps)]:
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
        raise ConfigError(f"{path}: {json_problem(exc)}") from None
    return parse_config(data, path)


def json_problem(exc: json.JSONDecodeError) -> str:
    """What is wrong with a JSON text, where: a trailing comma by its own line (the
    parser points at the closing bracket after it, often on the next line)."""
    text, at = exc.doc, exc.pos
    if at < len(text) and text[at] in "}]":
        before = text[:at].rstrip()
        if before.endswith(","):
            comma = len(before) - 1
            line = text.count("\n", 0, comma) + 1
            column = comma - (text.rfind("\n", 0, comma) + 1) + 1
            closing = "brace" if text[at] == "}" else "bracket"
            return (
                f"a trailing comma at line {line} column {column} (before the closing "
                f"{closing} on line {exc.lineno}): JSON allows none there, remove it"
            )
    return f"not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
