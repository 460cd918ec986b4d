"""The tool policy without a daemon: modes, rules, the sandbox per mode, and the strict
validation of ``policy`` in config.json (a bad rule names the file and the key)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from navi_trio.core.turn import effective_mode
from navi_trio.core.turn.policy import CallFacts, decide, denied_outright, sandbox_for, summary
from navi_trio.errors import ConfigError
from navi_trio.profiles import AgentProfile, PolicyConfig, check_config, parse_config
from navi_trio.settings import default_config_path
from navi_trio.testing import open_harness


def _profile(**policy: Any) -> AgentProfile:
    data = json.loads(default_config_path().read_text(encoding="utf-8"))
    data["profiles"]["general"]["policy"] = policy
    cfg = parse_config(data, default_config_path())
    return cfg.profiles["general"]


def _decide(profile: AgentProfile, mode: str, tool: str, role: str = "user", **args: Any) -> str:
    return decide(profile, role, mode, CallFacts.of(tool, args)).decision


@pytest.mark.parametrize(
    ("role", "configured", "requested", "mode"),
    [
        ("user", None, None, "workspace"),
        ("admin", None, None, "workspace"),  # the local admin too
        ("user", None, "full", "workspace"),
        ("user", None, "read-only", "read-only"),
        ("user", "read-only", "workspace", "read-only"),
        ("admin", None, "full", "full"),
        ("admin", "read-only", "full", "full"),
        ("user", None, "nonsense", "workspace"),
    ],
)
def test_a_requested_mode_is_clamped_to_the_role(
    role: str, configured: str | None, requested: str | None, mode: str
) -> None:
    policy = PolicyConfig(modes={role: configured} if configured else {})  # type: ignore[dict-item]
    assert effective_mode(policy, role, requested) == mode


def test_what_the_sandbox_contains_runs_without_asking() -> None:
    p = _profile()
    assert _decide(p, "workspace", "terminal", action="run", command="curl x") == "allow"
    assert _decide(p, "workspace", "filesystem", action="write", path="a.txt") == "allow"
    assert _decide(p, "read-only", "terminal", action="run", command="ls") == "allow"
    assert _decide(p, "read-only", "filesystem", action="read", path="a") == "allow"
    assert _decide(p, "read-only", "filesystem", action="write", path="a") == "ask"
    assert _decide(p, "full", "terminal", action="run", command="ls", role="admin") == "ask"
    assert _decide(p, "full", "code_exec", code="print(1)", role="admin") == "ask"
    assert _decide(p, "full", "terminal", action="list", role="admin") == "allow"


def test_the_first_matching_rule_decides_with_patterns_and_roles() -> None:
    p = _profile(
        rules=[
            {"tool": "terminal", "action": "run", "match": "git status*", "decision": "allow"},
            {"tool": "terminal", "action": "run", "match": "git *", "decision": "ask"},
            {"tool": "filesystem", "action": "delete", "decision": "deny", "roles": ["user"]},
            {"tool": "terminal", "match": "pytest *", "decision": "allow"},
        ]
    )
    run = {"action": "run"}
    assert _decide(p, "full", "terminal", role="admin", command="git status -s", **run) == "allow"
    assert _decide(p, "workspace", "terminal", command="git push", **run) == "ask"
    assert _decide(p, "full", "terminal", role="admin", command="pytest -q", **run) == "allow"
    assert _decide(p, "workspace", "filesystem", action="delete", path="x") == "deny"
    assert _decide(p, "workspace", "filesystem", role="admin", action="delete", path="x") == (
        "allow"
    )
    v = decide(p, "user", "workspace", CallFacts.of("terminal", {**run, "command": "git log"}))
    assert v.rule == "profile 'general' rule 2: terminal run 'git *' -> ask"


def test_the_sandbox_per_mode(tmp_path: Path) -> None:
    sess, cwd = tmp_path / "s", tmp_path / "w"
    ws = sandbox_for("workspace", sess, cwd)
    assert ws is not None and ws.writable == (sess, cwd) and ws.network is False
    ro = sandbox_for("read-only", sess, cwd)
    assert ro is not None and ro.writable == ()
    assert sandbox_for("full", sess, cwd) is None


def test_summary_is_readable_and_short() -> None:
    assert summary("terminal", {"action": "run", "command": "ls -l"}) == "terminal run: ls -l"
    assert summary("memory", {"action": "get"}) == 'memory {"action": "get"}'
    assert len(summary("terminal", {"action": "run", "command": "x" * 1000})) == 300


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        ({"rules": [{"tool": "terminal", "decision": "maybe"}]}, "policy.rules[0].decision"),
        ({"rules": [{"tool": "terminal"}]}, "policy.rules[0].decision"),
        ({"rules": [{"tool": "terminal", "decision": "ask", "when": 1}]}, "policy.rules[0]"),
        ({"rules": [{"tool": "terminal", "match": "", "decision": "ask"}]}, "match"),
        ({"rules": "terminal"}, "policy.rules: expected a list"),
        ({"rules": ["terminal"]}, "policy.rules[0]: expected an object"),
        ({"modes": {"user": "full"}}, "policy.modes['user']: 'full' (no sandbox) is for admins"),
        ({"modes": {"user": "fast"}}, "policy.modes['user']"),
        ({"modes": {"guest": "workspace"}}, "unknown role 'guest'"),
        ({"rules": [{"tool": "ssh", "decision": "ask"}]}, "policy.rules[0].tool: unknown tool"),
        ({"headless_allow": [{"tool": "terminal", "match": 3}]}, "headless_allow[0].match"),
        ({"rules": [{"tool": "terminal", "decision": "ask", "roles": ["x"]}]}, "rules[0].roles"),
    ],
)
def test_a_bad_policy_names_the_file_and_key(policy: dict[str, Any], words: str) -> None:
    path = default_config_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    data["profiles"]["coder"]["policy"] = policy
    with pytest.raises(ConfigError) as err:
        check_config(parse_config(data, path), path)
    assert str(path) in str(err.value) and "$.profiles['coder']" in str(err.value)
    assert words in str(err.value)


def test_the_shipped_config_policy_parses() -> None:
    p = _profile()
    assert attrs.evolve(p.policy) == PolicyConfig()


def test_an_action_is_denied_outright_only_when_no_rule_before_lets_any_target_through() -> None:
    deny = {"tool": "filesystem", "action": "delete", "decision": "deny"}
    p = _profile(rules=[deny])
    assert denied_outright(p, "user", "filesystem", "delete")
    assert not denied_outright(p, "user", "filesystem", "write")
    # A rule before it that allows (or asks for) some paths: not outright.
    some = {"tool": "filesystem", "action": "delete", "match": "*.tmp", "decision": "allow"}
    assert not denied_outright(_profile(rules=[some, deny]), "user", "filesystem", "delete")
    # A deny of some paths first changes nothing; an allow of all first wins.
    part = {**some, "decision": "deny"}
    assert denied_outright(_profile(rules=[part, deny]), "user", "filesystem", "delete")
    allow = {"tool": "filesystem", "action": "*", "decision": "allow"}
    assert not denied_outright(_profile(rules=[allow, deny]), "user", "filesystem", "delete")
    # A rule for other roles does not count.
    admins = {**deny, "roles": ["admin"]}
    assert not denied_outright(_profile(rules=[admins]), "user", "filesystem", "delete")
    assert denied_outright(_profile(rules=[admins]), "admin", "filesystem", "delete")


def _offered_actions(request: dict[str, Any], tool: str) -> list[str]:
    (schema,) = [t for t in request["tools"] if t["function"]["name"] == tool]
    return list(schema["function"]["parameters"]["properties"]["action"]["enum"])


@pytest.mark.parametrize("allowed", [False, True])
async def test_the_local_profile_is_not_offered_filesystem_delete_unless_a_rule_allows_it(
    tmp_path: Path, allowed: bool
) -> None:
    shipped = json.loads(default_config_path().read_text(encoding="utf-8"))["profiles"]["local"]
    rules = list(shipped["policy"]["rules"])
    if allowed:  # the user's own rule, before the shipped one
        rules.insert(0, {"tool": "filesystem", "action": "delete", "decision": "allow"})
    profiles: dict[str, dict[str, Any]] = {
        "local": {"policy": {"rules": rules}},
        "general": {"planning_first_message": False},
    }
    with trio.fail_after(30):
        async with open_harness(tmp_path, replies=[{"text": "ok"}] * 2, profiles=profiles) as h:
            await h.runtime.store.create_session("s-local", profile_id="local")
            await h.turn("s-local", "tell me a story")
            await h.turn("s-general", "tell me a story")
            local, general = h.chat_requests
    assert ("delete" in _offered_actions(local, "filesystem")) is allowed
    assert "delete" in _offered_actions(general, "filesystem")  # only the local profile's rule
    assert _offered_actions(local, "filesystem")[:2] == ["read", "write"]
