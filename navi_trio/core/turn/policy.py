"""Tool policy: which mode a run gets, and whether one tool call runs, asks or is denied.

Three modes, from least to most power (docs/pages/tools.md, "Safety"):

- ``read-only``: reads run; terminal and code_exec run in a sandbox with nothing
  writable; a filesystem write asks.
- ``workspace`` (the default for every role): writes go to the session folder and the
  run's cwd only (the filesystem tool's confinement), terminal and code_exec run in a
  sandbox where those two folders are writable and the network is off. What the
  sandbox contains runs without asking.
- ``full`` (admins only, and only in a session of their own): no sandbox; a terminal
  or code_exec call asks.

``ssh_exec`` runs a command on another machine, where no sandbox of ours reaches: it is
denied in ``read-only`` (whatever the rules say: nothing could keep the promise that
nothing changes) and asks in ``workspace`` and ``full`` unless a rule allows it. Its
"action", for rules and approvals, is the host alias: ``{"tool": "ssh_exec", "action":
"web1", "match": "uptime*", "decision": "allow"}``; a "session" approval covers one host.

``peer`` runs a turn, with that daemon's tools, on another navi daemon, as the one
identity the config gives it for every user of this daemon: it asks in ``workspace`` and
``full`` and is denied in ``read-only``, unless a rule decides (a rule may allow it even
in ``read-only``: a peer whose own policy is read-only keeps the promise). Its "action"
is the peer's name and its "match" the message: ``{"tool": "peer", "action": "lab",
"decision": "allow"}``; a "session" approval covers one peer.

A profile's rules (``policy.rules`` in config.json) come first: the first rule that
matches the call's tool, action and command or path (fnmatch) decides allow, ask or
deny. A call of an MCP server's tool (``mcp__<server>__<tool>``) asks in every mode unless
a rule decides: another program acts, outside our sandbox. Nothing a client sends
reaches the rules, and a requested mode is clamped to what
the sender's role allows (`effective_mode`).
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import attrs

from navi_trio.profiles import MCP_PREFIX, MODES, AgentProfile, CallPattern, PolicyConfig
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
    """The mode a run gets: the role's configured mode, or the requested one when it is
    not more than the role allows (an admin may ask for anything; a user never above
    the mode configured for users).

    `own_session`: the run's sender owns its session. In another user's session
    (an admin's run there) it is never ``full``: that session's history, which its owner
    wrote, is the unsandboxed run's context (the api layer refuses an explicit ask)."""
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
    """The sandbox terminal and code_exec run in: None (no sandbox) in `full` mode.

    `private`: the daemon's own data, masked inside (tools/private.py); `tmp_max_bytes`:
    the size of its private /tmp."""
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

    @classmethod
    def of(cls, tool: str, args: dict[str, Any]) -> CallFacts:
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
        return cls(tool, action, target if isinstance(target, str) else "")

    @property
    def runs_code(self) -> bool:
        return self.tool in EXEC_TOOLS and self.action in EXEC_ACTIONS

    @property
    def writes_files(self) -> bool:
        return self.tool == "filesystem" and self.action in FILE_WRITES

    def matches(self, pattern: CallPattern) -> bool:
        return (
            fnmatch.fnmatchcase(self.tool, pattern.tool)
            and fnmatch.fnmatchcase(self.action, pattern.action)
            and fnmatch.fnmatchcase(self.target, pattern.match)
        )


@attrs.frozen
class Verdict:
    decision: str  # allow | ask | deny
    rule: str  # which rule decided, readable
    key: str  # what a "session" or "always" answer grants: this rule
    network: bool = False  # the rule opens the sandbox's network for this call


def _describe(pattern: CallPattern) -> str:
    action = "" if pattern.action == "*" else f" {pattern.action}"
    match = "" if pattern.match == "*" else f" {pattern.match!r}"
    return f"{pattern.tool}{action}{match}"


def decide(profile: AgentProfile, role: str, mode: str, facts: CallFacts) -> Verdict:
    """The profile's first matching rule, else the mode's default."""
    if facts.tool == REMOTE_TOOL and mode == "read-only":
        key = f"mode|{mode}|{facts.tool}"
        return Verdict("deny", "mode read-only: ssh_exec runs on another machine", key)
    for i, rule in enumerate(profile.policy.rules):
        if rule.roles and role not in rule.roles:
            continue
        if facts.matches(rule):
            where = f"profile {profile.id!r} rule {i + 1}"
            return Verdict(
                rule.decision,
                f"{where}: {_describe(rule)} -> {rule.decision}",
                f"rule|{profile.id}|{rule.tool}|{rule.action}|{rule.match}|{rule.decision}",
                network=rule.network,
            )
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
        if rule.match == "*":
            return rule.decision == "deny"  # this rule decides every target
        if rule.decision != "deny":
            return False  # some targets are allowed or asked
    return False


def with_network(sandbox: SandboxSpec | None) -> SandboxSpec | None:
    """The call's sandbox with the network on (None, no sandbox, stays None)."""
    return None if sandbox is None else attrs.evolve(sandbox, network=True)


def headless_allows(policy: PolicyConfig, facts: CallFacts) -> bool:
    """With no client attached: only calls on the profile's headless allow-list run."""
    return any(facts.matches(p) for p in policy.headless_allow)


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
