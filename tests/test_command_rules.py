"""Command-aware policy rules: the command-line grammar (core/turn/commands.py), rules on
a parsed command's program, subcommand, arguments and paths, a line decided part by
part, its strict config checks, and a generated property: an allowed line is made only
of parts that an allow rule covers, and a line with a construct the grammar does not
know is never allowed.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quick_run import examples

from navi_trio.core.turn.commands import SimpleCommand, parse_command
from navi_trio.core.turn.policy import CallFacts, decide, denied_outright, headless_allows
from navi_trio.errors import ConfigError
from navi_trio.profiles import AgentProfile, PolicyConfig, PolicyRule, check_config, parse_config
from navi_trio.settings import default_config_path

ROOTS = (Path("/w/s"),)  # the run's folder: paths resolve against it
CWD = Path("/w/s")


_CONFIG = default_config_path().read_text(encoding="utf-8")


def _profile(*rules: dict[str, Any]) -> AgentProfile:
    data = json.loads(_CONFIG)
    data["profiles"]["general"]["policy"] = {"rules": list(rules)}
    cfg = parse_config(data, default_config_path())
    check_config(cfg, default_config_path())
    return cfg.profiles["general"]


def _facts(command: str, **args: Any) -> CallFacts:
    return CallFacts.of("terminal", {"action": "run", "command": command, **args}, ROOTS, CWD)


def _rule(decision: str = "allow", **keys: Any) -> dict[str, Any]:
    return {"tool": "terminal", "decision": decision, **keys}


# ------------------------------------------------------------------ the grammar


@pytest.mark.parametrize(
    ("line", "parts"),
    [
        ("git status", [["git", "status"]]),
        ("git status && rm -rf /", [["git", "status"], ["rm", "-rf", "/"]]),
        ("a | b || c ; d & e |& f", [["a"], ["b"], ["c"], ["d"], ["e"], ["f"]]),
        ("ls\nrm x", [["ls"], ["rm", "x"]]),
        ("echo 'a && b' \"c; d\" e\\ f", [["echo", "a && b", "c; d", "e f"]]),
        ("echo '&&' '$(x)' '`y`'", [["echo", "&&", "$(x)", "`y`"]]),
        ('echo "say \\"hi\\""', [["echo", 'say "hi"']]),
        ("ls;", [["ls"]]),
        ("sleep 1 &", [["sleep", "1"]]),
        ("git log # a comment; rm x", [["git", "log", "#", "a", "comment"], ["rm", "x"]]),
    ],
)
def test_a_line_splits_into_its_simple_commands(line: str, parts: list[list[str]]) -> None:
    parsed = parse_command(line)
    assert parsed.problem is None
    assert [list(p.words) for p in parsed.parts] == parts


@pytest.mark.parametrize(
    ("line", "redirects", "words"),
    [
        ("ls > out.txt 2>&1", ["out.txt"], ["ls"]),
        ("ls 2>/dev/null", ["/dev/null"], ["ls"]),
        ("cat < in >> out", ["in", "out"], ["cat"]),
        ("make &> log", ["log"], ["make"]),
        ("echo hi >&2", [], ["echo", "hi"]),
        # digits apart from the operator, or quoted, are an argument, not a descriptor
        ("kill 1 > /dev/null", ["/dev/null"], ["kill", "1"]),
        ('echo "2">out', ["out"], ["echo", "2"]),
        ("2>x b", ["x"], ["b"]),
    ],
)
def test_a_redirection_target_is_a_path_of_its_command(
    line: str, redirects: list[str], words: list[str]
) -> None:
    (part,) = parse_command(line).parts
    assert list(part.redirects) == redirects and list(part.words) == words


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("echo $HOME", "variable"),
        ('echo "$HOME"', "variable"),
        ("echo $(rm -rf ~)", "substitution"),
        ("echo `rm -rf ~`", "backticks"),
        ("(cd /; rm -rf x)", "subshell"),
        ("diff <(ls a) <(ls b)", "process substitution"),
        ("cat <<EOF\nx\nEOF", "here-doc"),
        ("cat <<< hi", "here-doc"),
        ("{ ls; }", "brace"),
        ("echo {a,b}", "brace"),
        ("eval 'rm -rf ~'", "eval"),
        ("source ./x.sh", "source"),
        (". ./x.sh", "."),
        ("exec rm x", "exec"),
        ("LD_PRELOAD=x.so ls", "assignment"),
        ("if true; then rm x; fi", "keyword"),
        ("for f in *; do rm $f; done", "variable"),
        ("echo 'unclosed", "unclosed"),
        ('echo "unclosed', "unclosed"),
        ("ls \\\n -la", "continuation"),
        ("ls &&", "nothing after"),
        ("&& ls", "empty command"),
        ("a | | b", "empty command"),
        ("a ;; b", "operator ;;"),
        ("ls >", "no target"),
        ('echo "a\\$b"', "escape in double quotes"),
        ("x" * 20_000, "longer than"),
        (" ; ".join(["ls"] * 65), "more than 64"),
    ],
)
def test_what_the_grammar_does_not_follow_is_a_problem_not_a_guess(line: str, why: str) -> None:
    parsed = parse_command(line)
    assert parsed.parts == () and parsed.problem is not None and why in parsed.problem


# ------------------------------------------------------------------ rules on commands


def test_a_rule_matches_the_program_subcommand_and_each_argument() -> None:
    p = _profile(_rule(program="git", subcommand="status", args=["-s", "--short"]))
    full = "full"
    assert decide(p, "admin", full, _facts("git status")).decision == "allow"
    assert decide(p, "admin", full, _facts("git status -s --short")).decision == "allow"
    # an argument no pattern covers, another subcommand, another program: not this rule
    assert decide(p, "admin", full, _facts("git status --porcelain")).decision == "ask"
    assert decide(p, "admin", full, _facts("git push")).decision == "ask"
    assert decide(p, "admin", full, _facts("/tmp/x/git status")).decision == "ask"
    # an option before the subcommand: the allow rule does not cover it
    assert decide(p, "admin", full, _facts("git -C /etc status")).decision == "ask"
    # the subcommand is the first argument, not any argument
    sub = _profile(_rule(program="git", subcommand="status"))
    assert decide(sub, "admin", full, _facts("git status x")).decision == "allow"
    assert decide(sub, "admin", full, _facts("git push status")).decision == "ask"


def test_a_deny_rule_is_not_dodged_by_options_or_a_path_to_the_program() -> None:
    p = _profile(_rule("deny", program="git", subcommand="push"))
    for line in ("git push", "git -C x push origin", "/usr/bin/git push"):
        verdict = decide(p, "user", "workspace", _facts(line))
        assert verdict.decision == "deny", line
    assert decide(p, "user", "workspace", _facts("git status")).decision == "allow"


def test_a_deny_rule_is_not_dodged_by_a_wrapper_or_a_shell() -> None:
    p = _profile(_rule("deny", program="rm"))
    for line in ("env rm -rf x", "sudo /bin/rm x", "timeout 5 rm x", "find . -exec rm '{}' \\;",
                 "ls | xargs rm"):  # fmt: skip
        assert decide(p, "user", "workspace", _facts(line)).decision == "deny", line
    for line in ("bash -c 'rm -rf x'", "sh -ec 'rm x'", "/bin/bash -c 'rm x'"):
        verdict = decide(p, "user", "workspace", _facts(line))
        assert verdict.decision == "ask" and "runs its argument as shell code" in verdict.rule
    assert decide(p, "user", "workspace", _facts("env ls")).decision == "allow"
    assert decide(p, "user", "workspace", _facts("bash script.sh")).decision == "allow"


def test_paths_inside_or_outside_the_workspace() -> None:
    p = _profile(_rule(program="cat", paths="inside"))
    assert decide(p, "admin", "full", _facts("cat a.txt sub/b ./c")).decision == "allow"
    for line in ("cat /etc/passwd", "cat ../x", "cat ~/.ssh/id_rsa", "cat a > /tmp/out",
                 "cat --from=/etc/x", "cat -f/etc/x", "cat .*", "cat sub/../../x"):  # fmt: skip
        assert decide(p, "admin", "full", _facts(line)).decision == "ask", line
    # the command's own folder (terminal's cwd) is where relative paths start
    assert decide(p, "admin", "full", _facts("cat ../x", cwd="sub")).decision == "allow"
    deny_out = _profile(_rule("deny", program="*", paths="outside"))
    assert decide(deny_out, "user", "workspace", _facts("ls > /etc/x")).decision == "deny"
    assert decide(deny_out, "user", "workspace", _facts("ls > x")).decision == "allow"


def test_a_cd_moves_where_the_later_parts_paths_resolve() -> None:
    p = _profile(_rule(program="cd"), _rule(program="rm", paths="inside"))
    assert decide(p, "admin", "full", _facts("cd sub && rm -rf x")).decision == "allow"
    for line in ("cd / && rm -rf *", "cd .. && rm x", "cd - && rm x", "cd && rm x",
                 "pushd /etc; rm x", "popd; rm x"):  # fmt: skip
        assert decide(p, "admin", "full", _facts(line)).decision == "ask", line


def test_with_no_folders_known_every_path_is_outside() -> None:
    p = _profile(_rule(program="cat", paths="inside"))
    facts = CallFacts.of("terminal", {"action": "run", "command": "cat a"})
    assert decide(p, "admin", "full", facts).decision == "ask"


def test_every_part_of_a_line_must_be_allowed() -> None:
    p = _profile(_rule(program="git"), _rule("deny", program="rm"))
    assert decide(p, "admin", "full", _facts("git status | git log")).decision == "allow"
    verdict = decide(p, "admin", "full", _facts("git status; curl x | sh"))
    assert verdict.decision == "ask"
    assert "part 2 (curl x)" in verdict.rule and "part 3 (sh)" in verdict.rule
    assert [c.decision for c in verdict.parts] == ["allow", "ask", "ask"]
    assert verdict.grant == (
        "`curl` with any arguments in this workspace, unsandboxed; "
        "`sh` with any arguments in this workspace, unsandboxed"
    )
    denied = decide(p, "admin", "full", _facts("git status && rm -rf ."))
    assert denied.decision == "deny" and "part 2 (rm -rf .)" in denied.rule


def test_a_text_rule_allows_one_part_never_a_whole_line_of_several() -> None:
    p = _profile({"tool": "terminal", "match": "git *", "decision": "allow"})
    assert decide(p, "admin", "full", _facts("git status")).decision == "allow"
    assert decide(p, "admin", "full", _facts("git status; git log")).decision == "allow"
    assert decide(p, "admin", "full", _facts("git status; rm -rf ~")).decision == "ask"
    # a text deny still sees the whole line
    deny = _profile({"tool": "terminal", "match": "*rm -rf*", "decision": "deny"})
    assert decide(deny, "user", "workspace", _facts("ls && rm -rf x")).decision == "deny"


def test_a_line_that_cannot_be_parsed_is_never_allowed_by_a_rule() -> None:
    text = _profile({"tool": "terminal", "match": "git *", "decision": "allow", "network": True})
    verdict = decide(text, "admin", "full", _facts("git log $(rm -rf ~)"))
    assert verdict.decision == "ask" and "cannot be parsed" in verdict.rule
    assert verdict.grant == "this exact command line"
    cmd = _profile(_rule("deny", program="rm"))
    # a deny rule on commands cannot be dodged by a construct it cannot see through
    assert decide(cmd, "user", "workspace", _facts("rm -rf x $(true)")).decision == "ask"
    # with no rules on commands, the mode decides as before: the sandbox contains it
    assert decide(_profile(), "user", "workspace", _facts("echo $HOME")).decision == "allow"


def test_the_network_is_granted_only_when_every_part_has_it() -> None:
    p = _profile(_rule(program="curl", network=True), _rule(program="jq"))
    assert decide(p, "user", "workspace", _facts("curl x")).network is True
    mixed = decide(p, "user", "workspace", _facts("curl x | jq ."))
    assert mixed.decision == "allow" and mixed.network is False
    both = _profile(_rule(program="curl", network=True), _rule(program="jq", network=True))
    assert decide(both, "user", "workspace", _facts("curl x | jq .")).network is True


def test_the_headless_allow_list_covers_a_line_only_part_by_part() -> None:
    data = json.loads(_CONFIG)
    data["profiles"]["general"]["policy"] = {
        "headless_allow": [{"tool": "terminal", "action": "run", "match": "pytest *"},
                           {"tool": "terminal", "match": "ls"}]
    }  # fmt: skip
    policy = parse_config(data, default_config_path()).profiles["general"].policy
    assert headless_allows(policy, _facts("pytest -q tests"))
    assert headless_allows(policy, _facts("pytest -q tests && ls"))
    assert not headless_allows(policy, _facts("pytest -q; rm -rf ~"))
    assert not headless_allows(policy, _facts("pytest -q $(rm -rf ~)"))
    assert not headless_allows(policy, _facts("pytest -q `rm -rf ~`"))


def test_a_deny_rule_on_commands_does_not_hide_the_terminal_tool() -> None:
    p = _profile(_rule("deny", program="rm"))
    assert not denied_outright(p, "user", "terminal", "run")


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        (_rule(program="git", args="x"), "rules[0].args"),
        (_rule(program="git", args=[""]), "rules[0].args: a pattern must not be empty"),
        (_rule(program=""), "program must not be empty"),
        (_rule(program="git", paths="in"), "rules[0].paths"),
        (_rule(program="git", match="git *"), "rules[0].match: a rule matches either"),
        (_rule(subcommand="push") | {"tool": "filesystem"}, "rules[0].subcommand: matches a"),
        (_rule(program="git", action="write"), "rules[0].program: matches a command of"),
        (_rule(program="git", argz=["x"]), "rules[0]"),
    ],
)
def test_a_bad_rule_on_commands_names_the_key(rule: dict[str, Any], words: str) -> None:
    path = default_config_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    data["profiles"]["coder"]["policy"] = {"rules": [rule]}
    with pytest.raises(ConfigError) as err:
        check_config(parse_config(data, path), path)
    assert str(path) in str(err.value) and "$.profiles['coder']" in str(err.value)
    assert words in str(err.value)


# ------------------------------------------------------------------ the property

# Argument values, each with whether it names a path outside /w/s (cwd /w/s).
ARGS: list[tuple[str, bool]] = [
    ("status", False), ("push", False), ("-rf", False), ("x.txt", False), ("sub/dir", False),
    ("a b", False), ("&&", False), ("; rm -rf /", False), ("*.py", False), ("it's", False),
    ("/etc", True), ("..", True), ("../x", True), ("~/y", True), ("--out=/tmp/z", True),
    ("-o/etc/x", True), (".*", True), ("sub/../../x", True), ("/", True),
]  # fmt: skip
PROGRAMS = ["git", "rm", "ls", "curl", "echo", "/usr/bin/git", "./git", "sh"]
# (text, target value or None, outside)
REDIRECTS: list[tuple[str, str | None, bool]] = [
    ("> out.txt", "out.txt", False), (">> /tmp/log", "/tmp/log", True),
    ("< ../in", "../in", True), ("2>&1", None, False), ("2> /dev/null", "/dev/null", True),
    ("> 'a b'", "a b", False),
]  # fmt: skip
UNKNOWN = ["$X", '"$X"', "$(ls)", "`ls`", "<(ls)", "{a,b}", "<<EOF", "${X}"]
UNKNOWN_PARTS = ["(ls)", "{ ls; }", "eval ls", "X=1 ls", "source x", "if true; then ls; fi"]
OPERATORS = ["|", "&&", "||", ";", "&", "\n", "|&"]


@attrs.frozen
class Truth:
    """What a generated part really runs."""

    words: tuple[str, ...]
    redirects: tuple[str, ...]
    outside: bool


@st.composite
def _quoted(draw: st.DrawFn, value: str) -> str:
    ways = [shlex.quote(value), '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"']
    if all(c.isalnum() or c in "_./=~*-" for c in value):
        ways.append(value)
    if "'" not in value:
        ways.append("'" + value + "'")
    ways.append("".join("\\" + c if not c.isalnum() else c for c in value))
    return draw(st.sampled_from(ways))


@st.composite
def _part(draw: st.DrawFn) -> tuple[str, Truth | None]:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(UNKNOWN_PARTS)), None
    program = draw(st.sampled_from(PROGRAMS))
    args = draw(st.lists(st.sampled_from(ARGS), max_size=3))
    redirects = draw(st.lists(st.sampled_from(REDIRECTS), max_size=2))
    unknown = draw(st.integers(0, 7)) == 0
    text = [draw(_quoted(program))] + [draw(_quoted(v)) for v, _ in args]
    if unknown:
        text.insert(draw(st.integers(1, len(text))), draw(st.sampled_from(UNKNOWN)))
    text += [r for r, _, _ in redirects]
    outside = any(o for _, o in args) or any(o for _, _, o in redirects)
    truth = Truth((program, *(v for v, _ in args)), tuple(t for _, t, _ in redirects if t), outside)
    return " ".join(text), None if unknown else truth


@st.composite
def _line(draw: st.DrawFn) -> tuple[str, list[Truth | None]]:
    parts = draw(st.lists(_part(), min_size=1, max_size=3))
    text = parts[0][0]
    for part, _ in parts[1:]:
        text += f" {draw(st.sampled_from(OPERATORS))} {part}"
    return text, [t for _, t in parts]


_rule_dicts = st.builds(
    lambda program, sub, args, paths, decision, network: {
        k: v
        for k, v in {
            "tool": "terminal",
            "program": program,
            "subcommand": sub,
            "args": args,
            "paths": paths,
            "decision": decision,
            "network": network,
        }.items()  # fmt: skip
        if v is not None
    },
    st.sampled_from(["git", "rm", "ls", "*", "g*", "curl", "echo", "*git"]),
    st.sampled_from([None, None, "status", "push", "*"]),
    st.sampled_from(
        [
            None,
            None,
            ["*"],
            ["status"],
            ["-*"],
            ["x.txt", "sub/*"],
            ["*.py", "*"],
            ["status", "-rf"],
            ["s*", "-*"],
            ["push"],
        ]
    ),  # fmt: skip
    st.sampled_from([None, None, "inside", "outside"]),
    st.sampled_from(["allow", "allow", "allow", "allow", "ask", "deny"]),
    st.booleans(),
)
_text_rules = st.builds(
    lambda match, decision: {"tool": "terminal", "match": match, "decision": decision},
    st.sampled_from(["ls *", "git status", "echo*", "*", "git *", "*x*"]),
    st.sampled_from(["allow", "allow", "deny"]),
)


def _covers(rule: dict[str, Any], truth: Truth, single: bool, line: str) -> bool:
    """The oracle, written from the documented meaning of an allow rule: every word of
    the part is accounted for."""
    if "match" in rule:
        text = " ".join(truth.words + tuple(f"> {r}" for r in truth.redirects))
        whole = single and fnmatch.fnmatchcase(line.strip(), rule["match"])
        return fnmatch.fnmatchcase(text, rule["match"]) or whole
    program, *args = truth.words
    if "program" in rule and not fnmatch.fnmatchcase(program, rule["program"]):
        return False
    if "subcommand" in rule:
        if not args or not fnmatch.fnmatchcase(args[0], rule["subcommand"]):
            return False
        args = args[1:]
    patterns = rule.get("args")
    if patterns is not None and not all(
        any(fnmatch.fnmatchcase(a, p) for p in patterns) for a in args
    ):
        return False
    if rule.get("paths") == "inside" and truth.outside:
        return False
    return not (rule.get("paths") == "outside" and not truth.outside)


_BASE = _profile()


def _quick_profile(rules: list[dict[str, Any]]) -> AgentProfile:
    """`_profile` without parsing the whole config again (the generated rules are valid:
    one case of each shape goes through the strict parse in the tests above)."""
    fields: list[dict[str, Any]] = [
        {k: tuple(v) if k == "args" else v for k, v in r.items()} for r in rules
    ]
    made = tuple(PolicyRule(**f) for f in fields)
    return attrs.evolve(_BASE, policy=PolicyConfig(rules=made))


_RULES = st.lists(st.one_of(_rule_dicts, _rule_dicts, _text_rules), min_size=1, max_size=6)


# Ten different cases to an example: hypothesis's own work for an example was most of the
# test's time, and is paid once for ten (1000 cases, as before).
@settings(
    max_examples=examples(100), deadline=None, database=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
@given(st.lists(st.tuples(_line(), _RULES), min_size=10, max_size=10, unique_by=repr))
def test_an_allowed_line_is_made_only_of_parts_an_allow_rule_covers(
    cases: list[tuple[tuple[str, list[Truth | None]], list[dict[str, Any]]]],
) -> None:
    for line, rules in cases:
        _only_covered_parts_allowed(line, rules)


def _only_covered_parts_allowed(
    line: tuple[str, list[Truth | None]], rules: list[dict[str, Any]]
) -> None:
    text, truths = line
    profile = _quick_profile(rules)
    verdict = decide(profile, "admin", "full", _facts(text))
    if verdict.decision != "allow":
        return
    if None in truths:  # a construct the grammar does not know: only a blanket allows it
        text_rules = [r for r in rules if "match" in r and fnmatch.fnmatchcase(text, r["match"])]
        first = text_rules[0] if text_rules else {}
        assert first.get("match") == "*" and first["decision"] == "allow", (
            f"{text!r}: a construct the grammar does not know was allowed by {first}"
        )
        return
    allows = [r for r in rules if r["decision"] == "allow"]
    for truth in truths:
        assert truth is not None
        covering = [r for r in allows if _covers(r, truth, len(truths) == 1, text)]
        assert covering, f"{text!r}: part {truth.words} allowed with no allow rule covering it"
        if verdict.network:
            assert any(r.get("network") for r in covering), f"{text!r}: network ungranted"


@settings(max_examples=examples(200), deadline=None, database=None, derandomize=True)
@given(line=_line())
def test_the_parsed_parts_are_the_generated_ones(line: tuple[str, list[Truth | None]]) -> None:
    text, truths = line
    parsed = parse_command(text)
    if None in truths:
        assert parsed.problem is not None, text
        return
    assert parsed.problem is None, (text, parsed.problem)
    got = [SimpleCommand(p.words, p.redirects) for p in parsed.parts]
    assert [(g.words, g.redirects) for g in got] == [(t.words, t.redirects) for t in truths]  # type: ignore[union-attr]
