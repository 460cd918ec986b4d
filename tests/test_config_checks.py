"""What start-up and ``navi doctor`` refuse beyond the config file's shape (issue 7, item 12).

A profile naming a tool navi does not have, and a config folder without the prompt files
the planning phases and compression read, are refused by `open_runtime` before anything
opens, by ``navi run`` and by ``navi doctor``, each error naming the file and the key or
the missing file. Files live under tmp_path; the CLI runs as a real subprocess with an
absolute deadline; no LLM is needed (the check comes first) and nothing sleeps.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from navi_trio.core.turn import compression, planning
from navi_trio.errors import ConfigError
from navi_trio.profiles import (
    BUILTIN_TOOL_NAMES,
    REQUIRED_PROMPT_FILES,
    ConfigSource,
    check_config,
    load_config,
)
from navi_trio.runtime import default_tools, open_runtime
from navi_trio.settings import Settings, shipped_dir
from navi_trio.testing.harness import test_config as harness_config
from navi_trio.tools.base import ToolContext, ToolResult

DEADLINE = 60
DOWN_URL = "http://127.0.0.1:9"  # nothing listens: every check here runs before a call


def config_copy(tmp_path: Path) -> Path:
    """A copy of the shipped config folder; returns its config.json."""
    folder = tmp_path / "cfg"
    shutil.copytree(shipped_dir("config"), folder)
    return folder / "config.json"


def edit(path: Path, change: Any) -> Path:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")
    st_ = path.stat()  # a fresh mtime without waiting for the clock (hot reload)
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))
    return path


def add_tool(profile: str, key: str, name: str) -> Any:
    return lambda data: data["profiles"][profile]["tools"][key].append(name)


# ------------------------------------------------------------------- the lists in the vocabulary


def test_the_builtin_tool_names_are_the_tools_navi_ships() -> None:
    assert BUILTIN_TOOL_NAMES == {t.name for t in default_tools(Settings())}


def test_the_required_prompt_files_are_the_ones_the_core_reads() -> None:
    read = {*planning._PROMPT_FILES.values(), compression.DEFAULT_PROMPT_FILE}
    assert set(REQUIRED_PROMPT_FILES) == {f"prompts/{name}" for name in read}


def test_the_shipped_config_passes_the_checks() -> None:
    path = shipped_dir("config") / "config.json"
    check_config(load_config(path), path)


# ------------------------------------------------------------------- check_config


@pytest.mark.parametrize("key", ["agent", "subagent"])
def test_an_unknown_tool_names_the_file_the_profile_and_the_tool(tmp_path: Path, key: str) -> None:
    path = edit(config_copy(tmp_path), add_tool("coder", key, "teleport"))
    cfg = load_config(path)  # the shape is fine: only the check knows the tool names
    with pytest.raises(ConfigError) as info:
        check_config(cfg, path)
    text = str(info.value)
    assert str(path) in text and f"$.profiles['coder'].tools.{key}" in text
    assert "unknown tool(s) teleport" in text and "filesystem" in text  # what is known


@pytest.mark.parametrize("name", REQUIRED_PROMPT_FILES)
def test_a_missing_prompt_file_is_named(tmp_path: Path, name: str) -> None:
    path = config_copy(tmp_path)
    (path.parent / name).unlink()
    with pytest.raises(ConfigError) as info:
        check_config(load_config(path), path)
    assert str(path.parent / name) in str(info.value) and str(path) in str(info.value)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = edit(config_copy(tmp_path), add_tool("general", "agent", "warp"))
    (path.parent / "prompts" / "compression.md").unlink()
    with pytest.raises(ConfigError) as info:
        check_config(load_config(path), path)
    assert "warp" in str(info.value) and "compression.md" in str(info.value)


@pytest.mark.parametrize("closing", ["}", "]"])
def test_a_trailing_comma_is_named_by_its_own_line(tmp_path: Path, closing: str) -> None:
    # The parser points at the closing bracket on the next line; the comma is the fault.
    text = '{\n  "default_profile": "general",\n  "x": [\n    1,\n    2,\n  ]\n}\n'
    if closing == "}":
        text = '{\n  "default_profile": "general",\n  "x": 1,\n}\n'
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    line, column = (3, 9) if closing == "}" else (5, 6)
    name = "brace" if closing == "}" else "bracket"
    assert str(info.value) == (
        f"{path}: a trailing comma at line {line} column {column} (before the closing "
        f"{name} on line {line + 1}): JSON allows none there, remove it"
    )


def test_other_json_faults_say_where_the_parser_stopped(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "a": 1\n  "b": 2\n}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"not valid JSON at line 3 column 3: Expecting ','"):
        load_config(path)


# ------------------------------------------------------------------- start-up


def settings_for(tmp_path: Path, config: Path | None = None) -> Settings:
    extra = {"config_path": config} if config else {}
    return Settings.from_env(
        {}, db_path=tmp_path / "navi.db", data_dir=tmp_path / "data", llm_url=DOWN_URL, **extra
    )


async def test_open_runtime_refuses_an_unknown_tool_before_opening_anything(
    tmp_path: Path,
) -> None:
    path = edit(config_copy(tmp_path), add_tool("researcher", "subagent", "teleport"))
    with trio.fail_after(DEADLINE), pytest.raises(ConfigError, match="teleport"):
        async with open_runtime(settings_for(tmp_path, path)):
            pytest.fail("the runtime opened")
    assert not (tmp_path / "navi.db").exists()  # no store: no message could be saved


async def test_open_runtime_refuses_a_config_folder_without_a_planning_prompt(
    tmp_path: Path,
) -> None:
    path = config_copy(tmp_path)
    (path.parent / "prompts" / "planning_review.md").unlink()
    with trio.fail_after(DEADLINE), pytest.raises(ConfigError, match="planning_review.md"):
        async with open_runtime(settings_for(tmp_path, path)):
            pytest.fail("the runtime opened")


@attrs.define
class WarpTool:
    name: str = "warp"
    description: str = "a tool a harness adds"
    parameters: dict[str, Any] = attrs.field(factory=lambda: {"type": "object"})

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.success("warped")


async def test_a_tool_the_runtime_is_given_may_be_named(tmp_path: Path) -> None:
    source = harness_config({"general": {"tools": {"agent": ["warp", "todo"], "subagent": []}}})
    with trio.fail_after(DEADLINE):
        async with open_runtime(settings_for(tmp_path), config=source, tools=[WarpTool()]) as rt:
            assert "warp" in rt.registry.names()
    assert source.known_tools == BUILTIN_TOOL_NAMES | {"warp"}


def test_after_start_up_a_reload_with_an_unknown_tool_keeps_the_last_good_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = config_copy(tmp_path)
    source = ConfigSource(path)
    source.require(BUILTIN_TOOL_NAMES)
    good = source.current
    edit(path, add_tool("general", "agent", "teleport"))
    with caplog.at_level(logging.ERROR, logger="navi_trio.profiles"):
        assert source.maybe_reload() is False
    assert source.current is good and "teleport" in str(source.last_error)


# ------------------------------------------------------------------- the command line


async def navi(*args: str, tmp_path: Path) -> tuple[int, str, str]:
    names = {f.metadata["env"] for f in attrs.fields(Settings)} | {"NAVI_DEBUG"}
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(NAVI_DB=str(tmp_path / "navi.db"), NAVI_DATA_DIR=str(tmp_path / "data"))
    with trio.fail_after(DEADLINE):
        proc = await trio.run_process(
            [sys.executable, "-m", "navi_trio", *args, "--llm-url", DOWN_URL],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
            cwd=tmp_path,
        )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


@pytest.mark.slow
async def test_navi_doctor_and_run_refuse_an_unknown_tool(tmp_path: Path) -> None:
    path = edit(config_copy(tmp_path), add_tool("coder", "agent", "teleport"))
    outputs = []
    for command in (["doctor"], ["run", "list my files"]):
        code, out, err = await navi(*command, "--config", str(path), tmp_path=tmp_path)
        assert code == 1, (command, out, err)
        line = err.strip().splitlines()[-1]
        assert line.startswith("navi: error: ") and str(path) in line and "teleport" in line
        assert "Traceback" not in err
        outputs.append(out)
    assert "BROKEN" in outputs[0]  # doctor shows the config as broken


@pytest.mark.slow
async def test_navi_doctor_and_run_refuse_a_config_folder_without_compression_md(
    tmp_path: Path,
) -> None:
    path = config_copy(tmp_path)
    missing = path.parent / "prompts" / "compression.md"
    missing.unlink()
    for command in (["doctor"], ["run", "list my files"]):
        code, _, err = await navi(*command, "--config", str(path), tmp_path=tmp_path)
        assert code == 1 and str(missing) in err.strip().splitlines()[-1], (command, err)
