"""Checkpoints of real runs in real workspaces (issue 22, "Tests"): a git repository keeps
its own `.git` untouched through the runs' checkpoints and a rewind (git status, the
reflog and every byte under `.git` compared), a folder that is no repository works (the
other tests' default); the bounds: a 200 MB file is left out with a warning naming it
and the call runs, a round whose new content is over NAVI_CHECKPOINT_MAX_BYTES is skipped
with a ``checkpoint_skipped`` warning and the call still runs, 10,000 small files are
checkpointed within NAVI_CHECKPOINT_MAX_SEC; which calls take a checkpoint at all.

Rules: as tests/test_rewind.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from rewind_kit import FULL, PROFILES, TIMEOUT, calls, frames_of, say, turn, write
from test_checkpoints_git import git, git_env, repo_view

from navi_trio.core.history import Target
from navi_trio.core.turn.checkpointing import may_write
from navi_trio.llm.base import ToolCall
from navi_trio.settings import Settings
from navi_trio.testing import open_harness
from navi_trio.tools.base import ToolRegistry
from navi_trio.tools.builtin import builtin_tools

SID = "s-ws"


@pytest.mark.slow
async def test_a_git_repository_keeps_its_git_folder_untouched_by_runs_and_a_rewind(
    tmp_path: Path,
) -> None:
    env = git_env(tmp_path)
    repo = (tmp_path / "repo").resolve()
    repo.mkdir()
    git(repo, env, "init", "-q")
    (repo / "tracked.txt").write_text("v1\n")
    git(repo, env, "add", "-A")
    git(repo, env, "commit", "-qm", "first")
    before = repo_view(repo, env)
    replies = [
        calls(write("tracked.txt", "v2 by the agent\n"), write("untracked.txt", "u\n")),
        say("changed"),
    ]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            frames = await turn(h, SID, "change it", cwd=repo, **FULL)
            assert frames_of(frames, "checkpoint_created")
            dirty = repo_view(repo, env)
            assert dirty[0] != before[0] and dirty[1:] == before[1:]  # only the work tree
            (message,) = [
                m for m in await h.runtime.store.load_messages(SID) if m["role"] == "user"
            ]
            target = Target(to=message["id"], restore="files")
            preview = await h.runtime.rewinds.preview(SID, target)
            await h.runtime.rewinds.apply(SID, target, preview.token)
            assert repo_view(repo, env) == before
            assert not (repo / "untracked.txt").exists()


async def test_a_200_mb_file_is_left_out_with_a_warning_and_the_call_runs(tmp_path: Path) -> None:
    work = (tmp_path / "work").resolve()
    work.mkdir()
    os.truncate(_touch(work / "huge.bin"), 200 << 20)  # sparse: 200 MB that cost no disk
    replies = [calls(write("small.txt", "s\n")), say("ok")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            frames = await turn(h, SID, "write", cwd=work, **FULL)
            (created,) = frames_of(frames, "checkpoint_created")
            (warning,) = [f for f in frames if f.get("code") == "checkpoint_left_out"]
            assert "huge.bin" in warning["message"] and str(200 << 20) in warning["message"]
            assert created["bytes"] < 1 << 20  # the big file was not copied
            assert (work / "small.txt").read_text() == "s\n"


async def test_new_content_over_the_byte_bound_skips_the_checkpoint_and_the_call_runs(
    tmp_path: Path,
) -> None:
    work = (tmp_path / "work").resolve()
    work.mkdir()
    (work / "big.txt").write_text("x" * 50_000)
    replies = [calls(write("a.txt", "a\n")), say("ok")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, profiles=PROFILES, checkpoint_max_bytes=10_000
        ) as h:  # fmt: skip
            frames = await turn(h, SID, "write", cwd=work, **FULL)
            assert frames_of(frames, "checkpoint_created") == []
            (warning,) = [f for f in frames if f.get("code") == "checkpoint_skipped"]
            assert "NAVI_CHECKPOINT_MAX_BYTES" in warning["message"]
            assert "cannot be rewound" in warning["message"]
            assert (work / "a.txt").read_text() == "a\n"
            assert await h.runtime.checkpoints.engine.checkpoints(SID) == []


async def test_ten_thousand_small_files_are_checkpointed_within_the_time_bound(
    tmp_path: Path,
) -> None:
    work = (tmp_path / "work").resolve()
    for i in range(100):
        folder = work / f"d{i:03}"
        folder.mkdir(parents=True)
        for j in range(100):
            (folder / f"f{j:03}.txt").write_text(f"{i} {j}\n")
    replies = [calls(write("d000/f000.txt", "changed\n")), say("ok")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            bound = h.runtime.settings.checkpoint_max_sec
            frames = await turn(h, SID, "write", cwd=work, **FULL)
            (created,) = frames_of(frames, "checkpoint_created")
            assert created["files"] == 10_000
            assert created["duration_ms"] < bound * 1000


def _touch(path: Path) -> Path:
    path.touch()
    return path


def test_the_calls_that_may_write_are_the_issues_list() -> None:
    registry = ToolRegistry(builtin_tools(Settings()))
    from navi_trio.tools.spawn_agent import SpawnAgentTool

    registry.register(SpawnAgentTool())
    names = registry.names()

    def writes(name: str, mode: str = "workspace", **args: object) -> bool:
        return may_write(ToolCall(id="c", name=name, arguments=dict(args)), registry, names, mode)

    for action in ("write", "append", "edit", "mkdir", "delete"):
        assert writes("filesystem", action=action)
    assert not writes("filesystem", action="read") and not writes("filesystem", action="list")
    for action in ("run", "open", "write"):
        assert writes("terminal", action=action)
        assert not writes("terminal", "read-only", action=action)  # nothing writable
    for action in ("read", "kill", "list"):
        assert not writes("terminal", action=action)
    assert writes("code_exec") and not writes("code_exec", "read-only")
    assert writes("spawn_agent", task="x")
    assert not writes("todo", action="add") and not writes("memory", action="save")
    # A tool the run may not use, or one the model made up, runs nothing.
    assert not may_write(ToolCall(id="c", name="filesystem", arguments={"action": "write"}),
                         registry, [], "workspace")  # fmt: skip
    assert not writes("nosuchtool")


@pytest.mark.parametrize("read_only", [False, True])
async def test_an_mcp_servers_tools_take_a_checkpoint_unless_it_is_read_only(
    tmp_path: Path, read_only: bool
) -> None:
    from navi_trio.profiles import MCP_PREFIX

    class FakeMcpTool:
        name = f"{MCP_PREFIX}srv__do"
        description = "an MCP server's tool"
        parameters: dict[str, object] = {"type": "object", "properties": {}}

        def __init__(self) -> None:
            self.read_only = read_only

    registry = ToolRegistry([FakeMcpTool()])  # type: ignore[list-item]
    got = may_write(ToolCall(id="c", name=FakeMcpTool.name, arguments={}), registry,
                    [FakeMcpTool.name], "workspace")  # fmt: skip
    assert got is not read_only
