"""The tool policy's part of a profile: the mode each role's runs get, the rules that
allow, ask or deny a call, and the calls allowed when no client is attached to answer
an ask; with the checks their shape cannot say (known roles, ``full`` for admins only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import attrs

from navi_trio.errors import ConfigError

# Tool policy (docs/pages/tools.md, "Safety"): modes from least to most power; the roles a user has.
MODES = ("read-only", "workspace", "full")
ROLES = ("admin", "user")
Mode = Literal["read-only", "workspace", "full"]
Decision = Literal["allow", "ask", "deny"]
Paths = Literal["inside", "outside"]
# The keys of a rule that match a parsed terminal command instead of its text.
COMMAND_KEYS = ("program", "subcommand", "args", "paths")


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
    # Match one simple command of a parsed terminal line (core/turn/commands.py): its
    # program, first argument, arguments (fnmatch each) and path arguments' place.
    program: str | None = attrs.field(default=None, validator=attrs.validators.optional(_pattern))
    subcommand: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(_pattern)
    )
    args: tuple[str, ...] | None = None
    paths: Paths | None = None

    @property
    def on_commands(self) -> bool:
        """Whether the rule matches parsed commands (else the call's text)."""
        return any(getattr(self, key) is not None for key in COMMAND_KEYS)


@attrs.frozen(kw_only=True)
class PolicyConfig:
    # role -> the mode its runs get (for a user, also the most it may ask for).
    modes: dict[str, Mode] = attrs.Factory(dict)
    rules: tuple[PolicyRule, ...] = ()
    # With no client attached, a call that would ask runs only when it matches one of
    # these; every other such call is denied.
    headless_allow: tuple[CallPattern, ...] = ()


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
        if rule.on_commands:
            _check_command_rule(rule, path, f"{where}.rules[{i}]")


def _check_command_rule(rule: PolicyRule, path: Path, where: str) -> None:
    """A rule on parsed commands is for terminal run / open, and not on the text too."""
    keys = [k for k in COMMAND_KEYS if getattr(rule, k) is not None]
    if rule.tool != "terminal":
        raise ConfigError(
            f"{path}: {where}.{keys[0]}: matches a parsed terminal command: the rule's "
            f'tool must be "terminal", not {rule.tool!r}'
        )
    if rule.action not in ("*", "run", "open"):
        raise ConfigError(
            f"{path}: {where}.{keys[0]}: matches a command of terminal run or open: the "
            f"rule's action must be run, open or *, not {rule.action!r}"
        )
    if rule.match != "*":
        raise ConfigError(
            f"{path}: {where}.match: a rule matches either the command's text (match) or "
            f"its parsed parts ({', '.join(keys)}), not both"
        )
    if rule.args is not None and not all(a.strip() for a in rule.args):
        raise ConfigError(f"{path}: {where}.args: a pattern must not be empty")


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
