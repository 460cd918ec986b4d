"""Tool arguments declared once (navi_trio/tools/args.py): the schema the model sees,
the parsing, and the words of every refusal.

`tool_schemas.json` holds the schemas the model saw when the tools wrote them by hand:
each tool must still show exactly those. The refusals in `SAME_AS_BEFORE` are the
messages the hand-written checks gave; they run through each tool's `execute`, so the
same cases pass on the code before and after a conversion.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import attrs
import pytest
import trio
from kvfake import make_ctx

from navi_trio.errors import ToolInputError
from navi_trio.project import skill_tool
from navi_trio.project.skill_tool import SkillTool
from navi_trio.settings import Settings
from navi_trio.tools import (
    code_exec,
    filesystem,
    memory,
    peer,
    scratchpad,
    spawn_agent,
    ssh_exec,
    switch_profile,
    tasks,
    terminal,
    todo,
)
from navi_trio.tools.args import (
    NoArgs,
    Strings,
    action_schema,
    arg,
    parse,
    parse_action,
    schema,
)
from navi_trio.tools.base import Tool
from navi_trio.tools.builtin import builtin_tools
from navi_trio.tools.peer import PeerTool
from navi_trio.tools.services import SUBAGENT_MAX_ITERATIONS
from navi_trio.tools.spawn_agent import SpawnAgentTool
from navi_trio.tools.tasks import TasksTool

SCHEMAS = json.loads((Path(__file__).parent / "tool_schemas.json").read_text())


def declared() -> dict[str, Any]:
    """Each converted tool and what declares its arguments: a class, or a dict
    action -> class."""
    return {
        "todo": todo.ACTIONS,
        "scratchpad": scratchpad.ACTIONS,
        "memory": memory.ACTIONS,
        "switch_profile": switch_profile.SwitchArgs,
        "filesystem": filesystem.ACTIONS,
        "terminal": terminal.ACTIONS,
        "code_exec": code_exec.CodeArgs,
        "ssh_exec": ssh_exec.SshArgs,
        "tasks": tasks.ACTIONS,
        "spawn_agent": spawn_agent.SpawnArgs,
        "peer": {"ask": peer.AskArgs},
        "skill": skill_tool.SkillArgs,
    }


def all_tools() -> dict[str, Any]:
    tools: list[Any] = [
        *builtin_tools(Settings()),
        SpawnAgentTool(),
        TasksTool(),
        PeerTool,
        SkillTool(),
    ]
    return {t.name: t for t in tools}


def declared_schema(declared: Any) -> dict[str, Any]:
    return action_schema(declared) if isinstance(declared, dict) else schema(declared)


# -- the schema the model sees ------------------------------------------------------------


# What a declaration may add to a hand-written property: the bounds it checks.
ADDED_KEYS = {"minimum", "maximum", "maxLength"}


def test_every_tool_shows_the_model_the_schema_it_showed_before() -> None:
    tools = all_tools()
    assert sorted(tools) == sorted(SCHEMAS)
    for name, tool in tools.items():
        before, now = SCHEMAS[name], tool.parameters
        # The same properties (their order means nothing to a JSON schema), the same
        # required list, the same words and choices.
        assert sorted(now["properties"]) == sorted(before["properties"]), name
        assert now["required"] == before["required"], name
        for key, prop in now["properties"].items():
            old = before["properties"][key]
            kept = {k: v for k, v in prop.items() if k not in ADDED_KEYS - set(old)}
            assert kept == old, (name, key)


def test_the_bounds_a_tool_checks_are_shown_to_the_model() -> None:
    terminal = all_tools()["terminal"].parameters["properties"]
    assert terminal["wait"]["minimum"] == 0 and terminal["wait"]["maximum"] == 30
    assert terminal["max_chars"]["minimum"] == 1


def test_a_converted_tools_schema_is_made_from_its_classes() -> None:
    tools = all_tools()
    for name, declaration in declared().items():
        assert tools[name].parameters == declared_schema(declaration), name


@attrs.frozen
class PathArgs:
    path: str = arg("the path")


@attrs.frozen
class FolderArgs:
    path: str = arg("the folder")


@attrs.frozen
class PathModeArgs:
    path: str = arg("the path")
    mode: int = arg("the mode")


def test_a_property_two_actions_declare_differently_is_refused() -> None:
    with pytest.raises(TypeError, match="'path' is declared two ways"):
        action_schema({"one": PathArgs, "two": FolderArgs})


def test_required_is_what_every_action_requires() -> None:
    both = action_schema({"one": PathArgs, "two": PathModeArgs})
    assert both["required"] == ["action", "path"]
    assert both["properties"]["mode"] == {"type": "integer", "description": "the mode"}
    assert action_schema({"one": PathArgs, "none": NoArgs})["required"] == ["action"]


# -- parsing ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Sample:
    name: str = arg("a name")
    mode: str = arg(default="fast", choices=("fast", "slow"))
    count: int | None = arg("how many", default=None, minimum=1)
    wait: float = arg("seconds", default=0.0, minimum=0, maximum=30, unit="seconds")
    timeout: float | None = arg(default=None, above=0, unit="seconds")
    after: float | None = arg(default=None, minimum=0, unit="seconds")
    tags: Strings = arg(default=(), expected="a list of tag names")
    note: str | None = arg(default=None, max_chars=5)
    eof: bool = arg(default=False)


def test_sample_schema_carries_choices_and_bounds() -> None:
    props = schema(Sample)["properties"]
    assert schema(Sample)["required"] == ["name"]
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"]}
    assert props["count"] == {"type": "integer", "description": "how many", "minimum": 1}
    assert props["wait"] == {
        "type": "number",
        "description": "seconds",
        "minimum": 0,
        "maximum": 30,
    }
    assert props["timeout"] == {"type": "number"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["note"] == {"type": "string", "maxLength": 5}


@pytest.mark.parametrize(
    "instance",
    [
        Sample(name="a"),
        Sample(
            name="b",
            mode="slow",
            count=3,
            wait=2.5,
            timeout=1.0,
            after=0.0,
            tags=("x", "y"),
            note="short",
            eof=True,
        ),
    ],
)
def test_parsing_round_trips(instance: Sample) -> None:
    as_json = json.loads(json.dumps(attrs.asdict(instance)))
    assert parse(Sample, as_json) == instance


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "argument 'name' is required and must be a non-empty string"),
        ({"name": ""}, "argument 'name' is required and must be a non-empty string"),
        ({"name": 5}, "argument 'name' is required and must be a non-empty string"),
        (
            {"name": "a", "mode": "quick"},
            "argument 'mode' must be one of fast, slow (got \"quick\")",
        ),
        ({"name": "a", "mode": 2}, "argument 'mode' must be one of fast, slow (got 2)"),
        ({"name": "a", "count": True}, "argument 'count' must be a whole number"),
        ({"name": "a", "count": 1.5}, "argument 'count' must be a whole number"),
        ({"name": "a", "count": 0}, "argument 'count' must be a whole number of 1 or more"),
        ({"name": "a", "wait": "2"}, "argument 'wait' must be a number"),
        ({"name": "a", "wait": 31}, "argument 'wait' must be between 0 and 30 seconds"),
        ({"name": "a", "timeout": 0}, "argument 'timeout' must be a positive number of seconds"),
        ({"name": "a", "after": -1}, "argument 'after' must be zero or more seconds"),
        ({"name": "a", "tags": "x"}, "argument 'tags' must be a list of tag names"),
        ({"name": "a", "tags": ["x", 1]}, "argument 'tags' must be a list of tag names"),
        ({"name": "a", "note": "toolong"}, "argument 'note' is longer than 5 characters"),
        ({"name": "a", "eof": "yes"}, "argument 'eof' must be true or false"),
    ],
)
def test_a_bad_argument_is_named_in_the_models_terms(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ToolInputError) as caught:
        parse(Sample, args)
    assert str(caught.value) == message


def test_a_huge_value_where_a_choice_belongs_is_quoted_cut() -> None:
    with pytest.raises(ToolInputError) as caught:
        parse(Sample, {"name": "a", "mode": "x" * 100_000})
    message = str(caught.value)
    assert message.startswith("argument 'mode' must be one of fast, slow (got \"xxx")
    assert len(message) < 200


def test_the_first_bad_argument_in_declaration_order_is_the_one_named() -> None:
    with pytest.raises(ToolInputError, match="'name'"):
        parse(Sample, {"eof": 1, "name": 2})


def test_null_is_left_out_and_unknown_keys_are_ignored() -> None:
    parsed = parse(Sample, {"name": "a", "count": None, "background": True, "zz": [1]})
    assert parsed == Sample(name="a")
    with pytest.raises(ToolInputError, match="'name' is required"):
        parse(Sample, {"name": None})


def test_a_whole_float_is_a_whole_number() -> None:
    assert parse(Sample, {"name": "a", "count": 2.0}).count == 2


def test_parse_action_picks_the_class_of_the_action() -> None:
    actions: dict[str, type] = {"go": Sample, "stop": NoArgs}
    assert parse_action(actions, {"action": "stop", "name": 5}) == ("stop", NoArgs())
    assert parse_action(actions, {"action": "go", "name": "x"}) == ("go", Sample(name="x"))
    for bad, got in (({}, "null"), ({"action": "run"}, '"run"'), ({"action": 1}, "1")):
        with pytest.raises(ToolInputError) as caught:
            parse_action(actions, bad)
        assert str(caught.value) == f"argument 'action' must be one of go, stop (got {got})"


# -- each converted tool refuses as it did ------------------------------------------------

# (tool, calls made first, the bad call, the message the hand-written check gave)
SAME_AS_BEFORE: list[tuple[str, list[dict[str, Any]], dict[str, Any], str]] = [
    (
        "todo",
        [],
        {"action": "tick"},
        "argument 'action' must be one of list, add, update, remove, clear, replace (got \"tick\")",
    ),
    (
        "todo",
        [{"action": "add", "text": "a step"}],
        {"action": "update", "index": "1", "status": "done"},
        "argument 'index' is required and must be a step number (1, 2 …)",
    ),
    (
        "todo",
        [{"action": "add", "text": "a step"}],
        {"action": "update", "index": 1, "status": "finished"},
        "argument 'status' must be one of pending, in_progress, done, failed (got \"finished\")",
    ),
    (
        "todo",
        [{"action": "add", "text": "a step"}],
        {"action": "update", "index": 1, "validation": 7},
        "argument 'validation' must be a string",
    ),
    ("todo", [], {"action": "add", "text": "   "}, "argument 'text' must be a non-empty string"),
    (
        "todo",
        [],
        {"action": "replace", "texts": ["a", "   "]},
        "argument 'texts' must be a non-empty string",
    ),
    (
        "scratchpad",
        [],
        {"action": "erase"},
        "argument 'action' must be one of read, write, append, clear (got \"erase\")",
    ),
    (
        "memory",
        [],
        {"action": "remember"},
        "argument 'fact' is required and must be a non-empty string",
    ),
    (
        "memory",
        [],
        {"action": "remember", "fact": "  \n "},
        "argument 'fact' is required and must be a non-empty string",
    ),
    (
        "memory",
        [],
        {"action": "forget"},
        "forget needs argument 'id' (e.g. \"m3\") or the exact 'fact'",
    ),
    (
        "switch_profile",
        [],
        {"reason": "x"},
        "argument 'profile_id' is required and must be a non-empty string",
    ),
    (
        "switch_profile",
        [],
        {"profile_id": "coder", "reason": 5},
        "argument 'reason' must be a string",
    ),
    (
        "filesystem",
        [],
        {"action": "shred", "path": "x"},
        "argument 'action' must be one of read, write, append, list, edit, mkdir, delete "
        '(got "shred")',
    ),
    (
        "filesystem",
        [],
        {"action": "write", "path": "x", "content": 5},
        "argument 'content' is required and must be a string",
    ),
    (
        "filesystem",
        [],
        {"action": "edit", "path": "x", "old": "", "new": "y"},
        "argument 'old' is required and must be a non-empty string",
    ),
    (
        "filesystem",
        [],
        {"action": "edit", "path": "x", "old": "a"},
        "argument 'new' is required and must be a string",
    ),
    (
        "filesystem",
        [],
        {"action": "read", "path": "x", "offset": 0},
        "argument 'offset' must be a whole number of 1 or more",
    ),
    (
        "filesystem",
        [],
        {"action": "read", "path": "x", "limit": -1},
        "argument 'limit' must be a whole number of 0 or more",
    ),
    (
        "filesystem",
        [],
        {"action": "list", "recursive": "yes"},
        "argument 'recursive' must be true or false",
    ),
    (
        "terminal",
        [],
        {"action": "run", "command": ""},
        "argument 'command' is required and must be a non-empty string",
    ),
    (
        "terminal",
        [],
        {"action": "run", "command": "true", "timeout": "soon"},
        "argument 'timeout' must be a number",
    ),
    (
        "terminal",
        [],
        {"action": "run", "command": "true", "timeout": 0},
        "argument 'timeout' must be a positive number of seconds",
    ),
    (
        "terminal",
        [],
        {"action": "kill"},
        "argument 'handle' is required and must be a non-empty string",
    ),
    (
        "terminal",
        [],
        {"action": "read", "handle": "p1", "wait": 31},
        "argument 'wait' must be between 0 and 30 seconds",
    ),
    (
        "terminal",
        [],
        {"action": "read", "handle": "p1", "max_chars": 0},
        "argument 'max_chars' must be a whole number of 1 or more",
    ),
    (
        "terminal",
        [],
        {"action": "write", "handle": "p1", "text": 5},
        "argument 'text' must be a string",
    ),
    (
        "terminal",
        [],
        {"action": "write", "handle": "p1", "text": "x", "eof": "yes"},
        "argument 'eof' must be true or false",
    ),
    (
        "terminal",
        [],
        {"action": "write", "handle": "p1"},
        "argument 'text' is required (or set 'eof': true)",
    ),
    (
        "code_exec",
        [],
        {"timeout": 5},
        "argument 'code' is required and must be a non-empty string",
    ),
    (
        "code_exec",
        [],
        {"code": "pass", "timeout": True},
        "argument 'timeout' must be a number",
    ),
    (
        "code_exec",
        [],
        {"code": "pass", "timeout": -2},
        "argument 'timeout' must be a positive number of seconds",
    ),
    (
        "tasks",
        [],
        {"action": "nap"},
        "argument 'action' must be one of list, check, wait, cancel (got \"nap\")",
    ),
    (
        "tasks",
        [],
        {"action": "wait", "timeout": 5},
        "argument 'task_id' is required and must be a non-empty string",
    ),
    (
        "spawn_agent",
        [],
        {"briefing": "b"},
        "argument 'task' is required and must be a non-empty string",
    ),
    (
        "spawn_agent",
        [],
        {"task": "t", "exclude_tools": "terminal"},
        "argument 'exclude_tools' must be a list of tool names",
    ),
    (
        "spawn_agent",
        [],
        {"task": "t", "inherit_system_prompt": "yes"},
        "argument 'inherit_system_prompt' must be true or false",
    ),
    (
        "spawn_agent",
        [],
        {"task": "t", "max_iterations": SUBAGENT_MAX_ITERATIONS + 1},
        f"argument 'max_iterations' must be between 1 and {SUBAGENT_MAX_ITERATIONS}",
    ),
    ("spawn_agent", [], {"task": "t", "briefing": 3}, "argument 'briefing' must be a string"),
    (
        "peer",
        [],
        {"action": "tell", "peer": "a", "message": "m"},
        "argument 'action' must be one of ask (got \"tell\")",
    ),
    (
        "peer",
        [],
        {"action": "ask", "message": "m"},
        "argument 'peer' is required and must be a non-empty string",
    ),
    (
        "peer",
        [],
        {"action": "ask", "peer": "a", "message": "m", "session": 5},
        "argument 'session' must be a string",
    ),
]


@pytest.mark.parametrize(
    ("name", "before", "args", "message"),
    SAME_AS_BEFORE,
    ids=[f"{case[0]}-{n}" for n, case in enumerate(SAME_AS_BEFORE)],
)
async def test_a_converted_tool_refuses_with_the_same_message(
    tmp_path: Path, name: str, before: list[dict[str, Any]], args: dict[str, Any], message: str
) -> None:
    unused = cast(Any, object())  # every refusal here comes before these are used
    tools: list[Any] = [*builtin_tools(Settings()), SpawnAgentTool(), TasksTool(), PeerTool(unused)]
    tool: Tool = {t.name: t for t in tools}[name]
    services = SimpleNamespace(processes=unused, tasks=unused, spawn=unused)
    ctx = make_ctx(tmp_path, services=services)
    with trio.fail_after(20):
        for earlier in before:
            assert (await tool.execute(earlier, ctx)).ok
        result = await tool.execute(args, ctx)
    assert not result.ok and result.error == message
