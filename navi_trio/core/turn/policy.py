"""Tool policy: which mode a run gets, and whether one tool call runs, asks or is denied.

Three modes (docs/pages/tools.md, "Safety"): ``read-only`` (reads run, a sandbox with
nothing writable, a write asks), ``workspace`` (writes to the session folder and cwd
only, in a sandbox without network) and ``full`` (admins in their own session; no
sandbox, so terminal and code_exec ask). ``ssh_exec`` and ``peer`` act where no sandbox
of ours reaches: denied in ``read-only`` and asking otherwise, unless a rule decides;
their "action" is the host alias or the peer's name. An MCP tool asks in every mode
unless a rule decides. A profile's rules come first (the first match decides); nothing
a client sends reaches them, and a requested mode is clamped to the role (`effective_mode`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os.path
import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from navi_trio.core.turn.commands import (
    WRAPPERS,
    SimpleCommand,
    moved_to,
    outside_paths,
    parse_command,
    path_words,
)
from navi_trio.events import CommandPart, PathArg
from navi_trio.profiles import (
    COMMAND_KEYS,
    MCP_PREFIX,
    MODES,
    AgentProfile,
    CallPattern,
    PolicyConfig,
    PolicyRule,
)
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.sandbox import TMP_MAX_BYTES, SandboxSpec

DEFAULT_MODE = "workspace"
# Tools that run code: sandboxed in read-only and workspace, unsandboxed in full.
EXEC_TOOLS = ("terminal", "code_exec")
# Their actions that start something (terminal read / write / kill / list touch only
# what an earlier run or open started).
EXEC_ACTIONS = ("run", "open", "")
FILE_WRITES = ("write", "append", "edit", "mkdir", "delete")
REMOTE_TOOL = "ssh_exec"  # runs on another machine: no sandbox applies
PEER_TOOL = "peer"  # runs a turn on another navi daemon, as the config's one identity
SUMMARY_MAX = 300


def effective_mode(
    policy: PolicyConfig, role: str, requested: str | None, *, own_session: bool = True
) -> str:
    """The mode a run gets: the role's, or the one asked for when the role allows it.

    In another user's session (`own_session` False) it is never ``full``: the unsandboxed
    run's context would be a history that other user wrote."""
    configured = policy.modes.get(role, DEFAULT_MODE)
    ceiling = "full" if role == "admin" else configured
    if not own_session:
        ceiling = min(ceiling, DEFAULT_MODE, key=MODES.index)
    wanted = requested if requested in MODES else configured
    return min(wanted, ceiling, key=MODES.index)


def sandbox_for(
    mode: str,
    session_dir: Path,
    cwd: Path | None,
    private: PrivatePaths | None = None,
    *,
    tmp_max_bytes: int = TMP_MAX_BYTES,
) -> SandboxSpec | None:
    """The sandbox terminal and code_exec run in: None (no sandbox) in `full` mode. `private`:
    the daemon's own data, masked inside."""
    if mode == "full":
        return None
    masks = private or PrivatePaths(hidden=())
    writable = () if mode == "read-only" else (session_dir,) if cwd is None else (session_dir, cwd)
    return SandboxSpec(writable=writable, network=False, private=masks, tmp_max_bytes=tmp_max_bytes)


@attrs.frozen
class CallFacts:
    """What the policy looks at in one call."""

    tool: str
    action: str
    target: str  # terminal: the command; code_exec: the code; filesystem: the path
    # Where a terminal command runs, and the run's folders (the workspace its path
    # arguments are checked against); empty: unknown, so every path is outside.
    cwd: str = ""
    roots: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        tool: str,
        args: dict[str, Any],
        roots: Sequence[Path] = (),
        cwd: Path | None = None,
    ) -> CallFacts:
        """The facts of a call of `tool` with `args`, run with the folders `roots` and the
        working directory `cwd` (None: the first root)."""
        if not roots:
            return cls._of(tool, args)
        base = str(cwd if cwd is not None else roots[0])
        asked = args.get("cwd") if tool == "terminal" else None
        here = os.path.normpath(os.path.join(base, asked)) if isinstance(asked, str) else base
        return cls._of(tool, args, here, tuple(str(r) for r in roots))

    @classmethod
    def _of(
        cls, tool: str, args: dict[str, Any], cwd: str = "", roots: tuple[str, ...] = ()
    ) -> CallFacts:
        action = args.get("action")
        action = action if isinstance(action, str) else ""
        if tool == "code_exec":
            action = action or "run"
        if tool == REMOTE_TOOL:
            host = args.get("host")
            action = host if isinstance(host, str) else ""
        if tool == PEER_TOOL:
            peer = args.get("peer")
            action = peer if isinstance(peer, str) else ""
        key = {"terminal": "command", "code_exec": "code", "filesystem": "path"}.get(tool)
        key = {REMOTE_TOOL: "command", PEER_TOOL: "message"}.get(tool, key)
        target = args.get(key) if key else None
        return cls(tool, action, target if isinstance(target, str) else "", cwd, roots)

    @property
    def runs_code(self) -> bool:
        return self.tool in EXEC_TOOLS and self.action in EXEC_ACTIONS

    @property
    def writes_files(self) -> bool:
        return self.tool == "filesystem" and self.action in FILE_WRITES

    @property
    def is_command(self) -> bool:
        """A terminal command line: rules may match its parsed parts."""
        return self.tool == "terminal" and self.action in ("run", "open")

    def matches(self, pattern: CallPattern) -> bool:
        return self.matches_call(pattern) and fnmatch.fnmatchcase(self.target, pattern.match)

    def matches_call(self, pattern: CallPattern) -> bool:
        """The pattern's tool and action, whatever the target."""
        return fnmatch.fnmatchcase(self.tool, pattern.tool) and fnmatch.fnmatchcase(
            self.action, pattern.action
        )


@attrs.frozen
class Verdict:
    decision: str  # allow | ask | deny
    rule: str  # which rule decided, readable
    key: str  # what a "session" or "always" answer grants: this rule
    network: bool = False  # the rule opens the sandbox's network for this call
    # A terminal line's parts, each decided alone; a "session" answer grants the keys
    # of those that asked (`keys`), described in `grant`.
    parts: tuple[CommandPart, ...] = ()
    part_keys: tuple[str, ...] = ()
    grant: str = ""

    @property
    def keys(self) -> tuple[str, ...]:
        """What a "session" or "always" answer grants: every key must be granted."""
        return self.part_keys or (self.key,)


def _describe(pattern: CallPattern) -> str:
    action = "" if pattern.action == "*" else f" {pattern.action}"
    match = "" if pattern.match == "*" else f" {pattern.match!r}"
    parsed = ""
    if isinstance(pattern, PolicyRule):
        keys = [k for k in COMMAND_KEYS if getattr(pattern, k) is not None]
        parsed = "".join(f" {k}={_shown(getattr(pattern, k))}" for k in keys)
    return f"{pattern.tool}{action}{match}{parsed}"


def _shown(value: Any) -> str:
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def decide(profile: AgentProfile, role: str, mode: str, facts: CallFacts) -> Verdict:
    """The profile's first matching rule, else the mode's default; a terminal command
    line is decided part by part (`_decide_command`)."""
    if facts.tool == REMOTE_TOOL and mode == "read-only":
        key = f"mode|{mode}|{facts.tool}"
        return Verdict("deny", "mode read-only: ssh_exec runs on another machine", key)
    if facts.is_command:
        return _decide_command(profile, role, mode, facts)
    for i, rule in _rules_for(profile, role, facts):
        if not rule.on_commands and facts.matches(rule):
            return _by_rule(profile, i, rule)
    return _by_mode(mode, facts)


def _rules_for(profile: AgentProfile, role: str, facts: CallFacts) -> list[tuple[int, PolicyRule]]:
    """The profile's rules (with their index) for `role` and the call's tool and action."""
    return [
        (i, rule)
        for i, rule in enumerate(profile.policy.rules)
        if (not rule.roles or role in rule.roles) and facts.matches_call(rule)
    ]


def _rule_key(profile: AgentProfile, rule: PolicyRule) -> str:
    parsed = [f"{k}={getattr(rule, k)!r}" for k in COMMAND_KEYS if getattr(rule, k) is not None]
    tail = "|" + "|".join(parsed) if parsed else ""
    return f"rule|{profile.id}|{rule.tool}|{rule.action}|{rule.match}|{rule.decision}{tail}"


def _rule_words(profile: AgentProfile, i: int, rule: PolicyRule) -> str:
    return f"profile {profile.id!r} rule {i + 1}: {_describe(rule)} -> {rule.decision}"


def _by_rule(profile: AgentProfile, i: int, rule: PolicyRule) -> Verdict:
    return Verdict(
        rule.decision, _rule_words(profile, i, rule), _rule_key(profile, rule), rule.network
    )


def _by_mode(mode: str, facts: CallFacts) -> Verdict:
    """The mode's default for a call no rule decides."""
    key = f"mode|{mode}|{facts.tool}|{facts.action}"
    if facts.tool.startswith(MCP_PREFIX):
        return Verdict("ask", f"mode {mode}: {facts.tool} runs in an MCP server, unsandboxed", key)
    if mode == "full" and facts.runs_code:
        return Verdict("ask", f"mode full: {facts.tool} runs without a sandbox", key)
    if facts.tool == REMOTE_TOOL:
        return Verdict("ask", f"mode {mode}: ssh_exec runs on {facts.action!r}, unsandboxed", key)
    if facts.tool == PEER_TOOL:
        if mode == "read-only":
            return Verdict("deny", "mode read-only: peer runs a turn on another daemon", key)
        return Verdict("ask", f"mode {mode}: peer runs a turn on the daemon {facts.action!r}", key)
    if mode == "read-only" and facts.writes_files:
        return Verdict("ask", f"mode read-only: filesystem {facts.action} writes", key)
    return Verdict("allow", f"mode {mode}", key)


def denied_outright(profile: AgentProfile, role: str, tool: str, action: str) -> bool:
    """Whether the profile's rules deny every call of `tool` `action`, whatever its
    target: such an action is left out of the tools the model is offered (a small model
    picks what it is shown), and `decide` denies it if asked anyway."""
    for rule in profile.policy.rules:
        if rule.roles and role not in rule.roles:
            continue
        if not (fnmatch.fnmatchcase(tool, rule.tool) and fnmatch.fnmatchcase(action, rule.action)):
            continue
        if rule.match == "*" and not rule.on_commands:
            return rule.decision == "deny"  # this rule decides every target
        if rule.decision != "deny":
            return False  # some targets are allowed or asked
    return False


def with_network(sandbox: SandboxSpec | None) -> SandboxSpec | None:
    """The call's sandbox with the network on (None, no sandbox, stays None)."""
    return None if sandbox is None else attrs.evolve(sandbox, network=True)


def headless_allows(policy: PolicyConfig, facts: CallFacts) -> bool:
    """With no client attached: only calls on the profile's headless allow-list run. A
    terminal line only when each of its parts is on it (a pattern matches a part's words,
    or the whole line when it is one part), and never one the grammar cannot follow."""
    if not facts.is_command:
        return any(facts.matches(p) for p in policy.headless_allow)
    patterns = [p for p in policy.headless_allow if facts.matches_call(p)]
    parsed = parse_command(facts.target)
    if parsed.problem is not None:
        return False
    whole = facts.target.strip() if len(parsed.parts) == 1 else None
    return all(
        any(
            fnmatch.fnmatchcase(part.text, p.match)
            or (whole is not None and fnmatch.fnmatchcase(whole, p.match))
            for p in patterns
        )
        for part in parsed.parts
    )


def summary(tool: str, args: dict[str, Any]) -> str:
    """The arguments, readable in one line for an approval card."""
    facts = CallFacts.of(tool, args)
    if facts.target:
        head = f"{tool} {facts.action}".strip()
        session = args.get("session") if tool == PEER_TOOL else None
        head += f" (session {session})" if isinstance(session, str) else ""
        text = f"{head}: {facts.target}"
    else:
        text = f"{tool} {json.dumps(args, ensure_ascii=False, sort_keys=True)}"
    return text if len(text) <= SUMMARY_MAX else text[: SUMMARY_MAX - 1] + "…"


def _decide_command(profile: AgentProfile, role: str, mode: str, facts: CallFacts) -> Verdict:
    """A terminal line, part by part: each simple command gets the first rule that
    matches it (a text rule its text, a command rule its parsed parts), else the mode's
    default; a deny of any part denies, an ask of any part asks, and the line runs only
    when every part is allowed. It gets the network only when every part's rule grants
    it. A line the grammar cannot follow is never allowed by a rule (`_unparsed`)."""
    rules = _rules_for(profile, role, facts)
    parsed = parse_command(facts.target)
    if parsed.problem is not None:
        return _unparsed(profile, mode, facts, rules, parsed.problem)
    single = len(parsed.parts) == 1
    decided = []
    here = facts
    for part in parsed.parts:
        decided.append(_decide_part(profile, mode, here, rules, part, single))
        here = attrs.evolve(here, cwd=moved_to(part, here.cwd))
    parts = tuple(v for v, _ in decided)
    for decision in ("deny", "ask"):
        hits = [(n, v, k) for n, (v, k) in enumerate(decided, 1) if v.decision == decision]
        if hits:
            break
    else:
        network = all(k.network for _, k in decided)
        return Verdict("allow", _parts_words(parts), _parts_key(decided), network, parts)
    if decision == "deny" or single:
        n, verdict, key = hits[0]
        rule = verdict.rule if single else f"part {n} ({verdict.text}): {verdict.rule}"
        network = all(k.network for _, k in decided)
        return Verdict(decision, rule, key.key, network, parts, (), verdict.grant)
    keys = tuple(dict.fromkeys(k.key for _, _, k in hits))
    rule = "; ".join(f"part {n} ({v.text}): {v.rule}" for n, v, _ in hits)
    grant = "; ".join(dict.fromkeys(v.grant for _, v, _ in hits))
    network = all(k.network for _, k in decided)
    return Verdict("ask", rule, keys[0], network, parts, keys, grant)


def _parts_words(parts: tuple[CommandPart, ...]) -> str:
    return "; ".join(dict.fromkeys(p.rule for p in parts))


def _parts_key(decided: list[tuple[CommandPart, Verdict]]) -> str:
    return "|".join(dict.fromkeys(k.key for _, k in decided))


def _decide_part(
    profile: AgentProfile,
    mode: str,
    facts: CallFacts,
    rules: list[tuple[int, PolicyRule]],
    part: SimpleCommand,
    single: bool,
) -> tuple[CommandPart, Verdict]:
    outside = outside_paths(part, facts.cwd, facts.roots)
    paths = tuple(PathArg(p, p not in outside) for p in path_words(part))
    for i, rule in rules:
        if _rule_covers(rule, part, facts, outside, single):
            verdict = _by_rule(profile, i, rule)
            grant = f"what {verdict.rule.split(':', 1)[0]} covers ({_describe(rule)})"
            if rule.network:
                grant += ", with the network"
            break
    else:
        verdict = _by_mode(mode, facts)
        where = "anywhere" if outside else "workspace"
        verdict = attrs.evolve(verdict, key=f"cmd|{profile.id}|{facts.tool}|{part.program}|{where}")
        scope = "in this workspace" if not outside else "on any path, outside this workspace too"
        grant = f"`{part.program}` with any arguments {scope}"
        grant += ", no network" if mode != "full" else ", unsandboxed"
    shown = CommandPart(
        part.text,
        part.program,
        part.args,
        paths,
        verdict.decision,
        verdict.rule,
        grant if verdict.decision == "ask" else "",
    )
    return shown, verdict


def _rule_covers(
    rule: PolicyRule, part: SimpleCommand, facts: CallFacts, outside: tuple[str, ...], single: bool
) -> bool:
    """Whether `rule` decides `part`. An allow rule must cover all of it: the program as
    written, the first argument as its subcommand, every further argument, every path.
    A deny or ask rule matches more: the program's base name too, the subcommand and the
    argument patterns anywhere among the arguments (options before them dodge nothing)."""
    allow = rule.decision == "allow"
    if not rule.on_commands:
        if fnmatch.fnmatchcase(part.text, rule.match):
            return True
        # the whole line, as written: an allow only when it is this one part
        return (single or not allow) and fnmatch.fnmatchcase(facts.target.strip(), rule.match)
    if rule.program is not None:
        names = {part.program} if allow else _run_names(part)
        if not any(fnmatch.fnmatchcase(n, rule.program) for n in names):
            return False
    rest = part.args
    if rule.subcommand is not None:
        if allow:
            if not rest or not fnmatch.fnmatchcase(rest[0], rule.subcommand):
                return False
            rest = rest[1:]
        elif not any(fnmatch.fnmatchcase(a, rule.subcommand) for a in rest):
            return False
    if rule.args is not None:
        hit = [any(fnmatch.fnmatchcase(a, p) for p in rule.args) for a in rest]
        if not (all(hit) if allow else any(hit)):
            return False
    if rule.paths == "inside" and outside:
        return False
    return not (rule.paths == "outside" and not outside)


def _run_names(part: SimpleCommand) -> set[str]:
    """What a part may run, for a deny or ask rule: its program (as written and its base
    name), and for a wrapper (env, sudo, xargs, find …) each argument too."""
    names = {part.program, posixpath.basename(part.program)}
    if posixpath.basename(part.program) in WRAPPERS:
        names |= set(part.args) | {posixpath.basename(a) for a in part.args}
    return names


def _unparsed(
    profile: AgentProfile,
    mode: str,
    facts: CallFacts,
    rules: list[tuple[int, PolicyRule]],
    problem: str,
) -> Verdict:
    """A line the grammar cannot follow: a text rule's deny or ask stands, an allow asks
    instead (what the line runs cannot be checked against it), unless its match is `*`
    (it allows any line whatever it runs, and says so); with no text rule, a
    profile with rules on commands asks, else the mode decides as for any call. A
    "session" answer grants this exact line."""
    why = f"the command cannot be parsed: {problem}"
    key = f"line|{profile.id}|{facts.tool}|" + hashlib.sha256(facts.target.encode()).hexdigest()
    grant = "this exact command line"
    for i, rule in rules:
        if not rule.on_commands and fnmatch.fnmatchcase(facts.target, rule.match):
            verdict = _by_rule(profile, i, rule)
            if rule.decision == "allow" and rule.match != "*":
                return Verdict("ask", f"{why} ({verdict.rule})", key, rule.network, grant=grant)
            if rule.decision == "allow":  # any line at all: nothing to check it against
                return verdict
            return attrs.evolve(verdict, rule=f"{verdict.rule} ({why})")
    if any(rule.on_commands for _, rule in rules):
        return Verdict(
            "ask", f"{why}; the profile's rules on commands cannot check it", key, grant=grant
        )
    verdict = _by_mode(mode, facts)
    return attrs.evolve(verdict, key=key, grant=grant) if verdict.decision == "ask" else verdict
