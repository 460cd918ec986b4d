"""Sub-agents kept as files (``.navi/agents``, ``.claude/agents``): spawn_agent names
them, they run with their file's prompt, and never with more than their spawner has.

- the model is told the agents in its folder, with their descriptions;
- a file agent in Claude Code's format runs with its body after the persona, and with
  only the tools its spawner's profile gives sub-agents (what the model was sent);
- a tool the spawner withholds, or its policy denies outright, stays out whatever the
  file lists;
- a bad file (no name, an unknown key, a bad tools value, a model the config does not
  use) is named with its key in spawn_agent's refusal, and the others still work;
- a file or folder that is a symlink out of the run's folders is not read;
- `navi profiles` lists config.json's profiles and the files', with where each came
  from, and the files not used with why.

Rules: real HTTP to the fake LLM on 127.0.0.1 through `open_harness`, a real SQLite
file under tmp_path, the fixture repository tests/fixtures/project-b copied there;
every test has an absolute time limit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from bg_tools import call, calls, of_type, profile, system_texts, tool_names
from project_repo import repo

from navi_trio.cli import main
from navi_trio.errors import ConfigError
from navi_trio.project.agents import collect_agents, find_agents, parse_agent
from navi_trio.project.files import Found, MdFile
from navi_trio.settings import default_config_path
from navi_trio.testing import open_harness
from navi_trio.tools.private import PrivatePaths
from navi_trio.tools.roots import Root

TIMEOUT = 30


def spawner(subagent: list[str], **flags: Any) -> dict[str, Any]:
    return profile(
        ["spawn_agent"], subagent, model="model-pa", planning_first_message=False, **flags
    )


async def spawn_turn(
    tmp_path: Path, work: Path, name: str, profiles: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A turn of profile "pa" in `work` (an admin's) spawning `name`: (frames, requests)."""
    replies = [calls(call("spawn_agent", task="Review it", profile_id=name))]
    replies += [{"text": "the sub-agent's report"}, {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=profiles) as h:
            frames = await h.turn("s1", "go", profile_id="pa", cwd=work, user_role="admin")
            return frames, h.chat_requests


async def test_a_claude_code_agent_file_runs_with_its_prompt_and_allowed_tools(
    tmp_path: Path,
) -> None:
    work = repo(tmp_path)
    profiles = {"pa": spawner(["filesystem", "todo"])}
    frames, requests = await spawn_turn(tmp_path, work, "code-reviewer", profiles)
    # The parent model was told which agents it may spawn, with their descriptions.
    (note,) = [t for t in system_texts(requests[0]) if t.startswith("[Agents kept as files")]
    assert note.splitlines()[1:] == [
        "- note-taker: Keeps the todo list of a task up to date.",
        "- code-reviewer: Expert code review specialist. Proactively reviews code for quality, "
        "security, and maintainability. Use immediately after writing or modifying code.",
    ]
    assert not any(t.startswith("[Agents") for t in system_texts(requests[1]))  # no spawn_agent
    (started,) = of_type(frames, "subagent_started")
    assert started["profile_id"] == "code-reviewer"
    (result,) = of_type(frames, "tool_result", name="spawn_agent")
    assert result["ok"] is True, result
    child = requests[1]
    system = system_texts(child)[0]
    assert "\n\n---\n\nYou are a senior" in system  # after the persona
    assert system.endswith("You are a senior code reviewer ensuring high standards of code "
                           "quality and security.\n\nWhen invoked:\n1. Run git diff to see "
                           "recent changes\n2. Focus on modified files\n3. Begin review "
                           "immediately")  # fmt: skip
    # Read, Grep, Glob are the filesystem tool; Bash (terminal) is not the spawner's.
    assert tool_names(child) == ["filesystem"]
    assert child["model"] == "model-pa"  # model: inherit
    (left,) = of_type(frames, "warning", code="agent_tools_left_out")
    assert left["message"] == (
        "agent 'code-reviewer' runs without terminal: not among the tools profile 'pa' "
        "gives sub-agents"
    )


async def test_a_tool_the_spawner_withholds_or_its_policy_denies_stays_out(
    tmp_path: Path,
) -> None:
    work = repo(tmp_path)
    deny = {"rules": [{"tool": "terminal", "decision": "deny"}]}
    profiles = {"pa": spawner(["todo", "terminal", "filesystem"], policy=deny)}
    frames, requests = await spawn_turn(tmp_path, work, "note-taker", profiles)
    (result,) = of_type(frames, "tool_result", name="spawn_agent")
    assert result["ok"] is True, result
    # note-taker lists todo and terminal: the policy denies terminal outright.
    assert tool_names(requests[1]) == ["todo"]
    assert system_texts(requests[1])[0].endswith("You keep the todo list. You never run commands.")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("bad-tools", "bad-tools.md: $.tools: expected tool names, comma-separated or a list"),
        ("unknown-key", "unknown-key.md: $.permissionMode: unknown key"),
        ("nobody", "no-name.md: $.name: missing"),
    ],
)
async def test_a_bad_agent_file_is_named_with_its_key_and_never_runs(
    tmp_path: Path, name: str, says: str
) -> None:
    work = repo(tmp_path)
    frames, requests = await spawn_turn(tmp_path, work, name, {"pa": spawner(["filesystem"])})
    (result,) = of_type(frames, "tool_result", name="spawn_agent")
    assert result["ok"] is False
    assert f"unknown profile_id {name!r}" in result["error"]
    assert says in result["error"], result["error"]
    # The good files are offered instead; the parent's next call is the last request.
    assert "code-reviewer" in result["error"] and "note-taker" in result["error"]
    assert len(requests) == 2


async def test_an_agent_file_linked_out_of_the_run_folders_is_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "spy.md").write_text("---\nname: spy\ndescription: x\n---\nSpy.\n")
    work = repo(tmp_path)
    (work / ".claude" / "agents" / "spy.md").symlink_to(outside / "spy.md")
    frames, requests = await spawn_turn(tmp_path, work, "spy", {"pa": spawner(["filesystem"])})
    (result,) = of_type(frames, "tool_result", name="spawn_agent")
    assert result["ok"] is False
    link = f"spy.md: a symlink to {outside / 'spy.md'}, outside the folders this run may read"
    assert link + "; not read" in result["error"], result["error"]
    assert len(requests) == 2


def test_an_agent_file_names_only_a_model_the_config_uses() -> None:
    text = "---\nname: fast\ndescription: d\nmodel: sonnet\n---\nGo.\n"
    with pytest.raises(ConfigError, match=r"a\.md: \$\.model: 'sonnet' is not a model"):
        parse_agent(text, Path("a.md"), models={"qwen3"})
    ok = parse_agent(text.replace("sonnet", "qwen3"), Path("a.md"), models={"qwen3"})
    assert ok.model == "qwen3"


def test_claude_code_tool_names_map_to_navis_and_its_own_are_dropped() -> None:
    text = "---\nname: a\ndescription: d\ntools: Read, Edit, WebFetch, Bash, todo\n---\nGo.\n"
    agent = parse_agent(text, Path("a.md"), models=set())
    assert agent.tools == ("filesystem", "terminal", "todo")
    assert agent.dropped == ("WebFetch",)
    with pytest.raises(ConfigError, match=r"\$\.tools: unknown tool 'rm_rf'"):
        parse_agent(text.replace("todo", "rm_rf"), Path("a.md"), models=set())


def test_navi_profiles_lists_the_configs_and_the_files_with_where_each_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = repo(tmp_path)
    config = default_config_path()
    assert main(["profiles", "--config", str(config), "--cwd", str(work), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    sources = {p["id"]: p["source"] for p in report["profiles"]}
    assert sources["general"] == str(config)
    assert sources["code-reviewer"] == str(work / ".claude" / "agents" / "code-reviewer.md")
    assert sources["note-taker"] == str(work / ".navi" / "agents" / "note-taker.md")
    (reviewer,) = [p for p in report["profiles"] if p["id"] == "code-reviewer"]
    assert reviewer["tools"] == ["filesystem", "terminal"]
    problems = "\n".join(report["problems"])
    for says in ("bad-tools.md: $.tools:", "no-name.md: $.name: missing",
                 "unknown-key.md: $.permissionMode: unknown key"):  # fmt: skip
        assert says in problems
    assert main(["profiles", "--config", str(config), "--cwd", str(work)]) == 0
    shown = capsys.readouterr()
    assert "code-reviewer  — Expert code review specialist." in shown.out
    assert f"    from {work}/.claude/agents/code-reviewer.md; model the spawning run's" in shown.out
    assert "3 agent file(s) not used" in shown.err


def _found(*files: tuple[str, str]) -> Found:
    return Found(files=[MdFile(Path(p), text) for p, text in files])


def test_a_config_profiles_name_and_an_earlier_files_name_win() -> None:
    agent = "---\nname: {}\ndescription: d\n---\nPrompt of {}.\n"
    found = _found(
        ("/r/.navi/agents/a.md", agent.format("helper", "navi")),
        ("/r/.claude/agents/a.md", agent.format("helper", "claude")),
        ("/r/.claude/agents/g.md", agent.format("general", "claude")),
    )
    got = collect_agents(found, models=set(), profiles={"general"})
    assert list(got.agents) == ["helper"]
    assert got.agents["helper"].prompt == "Prompt of navi."
    assert got.problems == [
        "/r/.claude/agents/a.md: $.name: 'helper' is taken by /r/.navi/agents/a.md; skipped",
        "/r/.claude/agents/g.md: $.name: 'general' is a profile of config.json, which wins; "
        "skipped",
    ]


def test_the_agents_of_a_repository_root_above_the_cwd_are_not_read(tmp_path: Path) -> None:
    work = repo(tmp_path)
    below = work / "src"
    below.mkdir()
    with Root.open(below, "the working folder (cwd)") as root:
        got = find_agents([root], below, PrivatePaths(hidden=()), None, models=set(), profiles=())
    assert got.agents == {}
    assert got.problems == [
        f"{work}: the repository's root is above the run's working folder, outside the "
        "folders this run may read: its agents are not read"
    ]


def test_front_matter_aliases_nesting_billions_of_items_are_refused_at_once() -> None:
    # Inside one value, each anchor nests the one before nine times: 9**10 strings.
    levels = ["&a [" + ", ".join(["x"] * 9) + "]"]
    for prev, name in zip("abcdefghi", "bcdefghij", strict=True):
        levels.append(f"&{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    text = f"---\nname: bomb\ndescription: d\ntools: [{', '.join(levels)}]\n---\nGo.\n"
    with pytest.raises(ConfigError, match=r"\$\.tools: expected tool names") as caught:
        parse_agent(text, Path("b.md"), models=set())
    assert len(str(caught.value)) < 300  # shown short, never walked whole


def test_front_matter_nested_too_deeply_is_an_error_naming_the_file() -> None:
    # PyYAML composes a level in a frame or more: as many levels as Python allows frames.
    depth = sys.getrecursionlimit()
    text = "---\nname: " + "[" * depth + "]" * depth + "\n---\nGo.\n"
    with pytest.raises(ConfigError, match=r"^deep\.md: the front matter nests too deeply"):
        parse_agent(text, Path("deep.md"), models=set())
