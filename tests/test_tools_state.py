"""todo, scratchpad, memory and switch_profile: state in the kv table, events, bad input.

The in-memory KV fake checkpoints on every call (no threads), so these run on the
autojump clock where timing matters; the one real-SQLite test uses the real clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from kvfake import MemoryKV, Recorder, make_ctx

from navi_trio.errors import ToolInputError
from navi_trio.events import TodoStep, TodoUpdated
from navi_trio.tools.base import Tool, ToolContext, ToolResult
from navi_trio.tools.memory import MemoryTool, load_memories
from navi_trio.tools.scratchpad import ScratchpadTool
from navi_trio.tools.switch_profile import SwitchProfileTool
from navi_trio.tools.todo import (
    TodoTool,
    failed_indexes,
    fill_from_plan,
    format_todo,
    load_todo,
    save_todo,
)


async def call(tool: Tool, ctx: ToolContext, **args: Any) -> ToolResult:
    with trio.fail_after(20):
        return await tool.execute(args, ctx)


# -- todo --------------------------------------------------------------------------------


async def test_todo_actions_change_the_list_and_publish_it(tmp_path: Path) -> None:
    rec = Recorder()
    kv = MemoryKV()
    ctx = make_ctx(tmp_path, kv=kv, recorder=rec)
    todo = TodoTool()
    assert (await call(todo, ctx, action="add", text="write the parser")).ok
    assert (await call(todo, ctx, action="add", text="test the parser")).ok
    updated = await call(todo, ctx, action="update", index=1, status="in_progress")
    assert updated.ok and "1. [~] write the parser (in_progress)" in updated.output
    steps = await load_todo(kv, "s1")
    assert [(s.index, s.text, s.status) for s in steps] == [
        (1, "write the parser", "in_progress"),
        (2, "test the parser", "pending"),
    ]
    assert isinstance(rec.published[-1], TodoUpdated)
    assert rec.published[-1].steps == tuple(steps)
    assert len(rec.published) == 3
    removed = await call(todo, ctx, action="remove", index=1)
    assert removed.ok and "1. [ ] test the parser" in removed.output
    listed = await call(todo, ctx, action="list")
    assert listed.output == "1. [ ] test the parser (pending)"
    assert len(rec.published) == 4  # list does not publish
    replaced = await call(todo, ctx, action="replace", texts=["a", "b", "c"])
    assert replaced.ok and [s.text for s in await load_todo(kv, "s1")] == ["a", "b", "c"]
    assert (await call(todo, ctx, action="clear")).ok
    assert await load_todo(kv, "s1") == []
    assert rec.published[-1] == TodoUpdated(steps=())


async def test_todo_done_needs_validation_when_the_profile_asks(tmp_path: Path) -> None:
    kv = MemoryKV()
    ctx = make_ctx(tmp_path, kv=kv, profile="coder")
    assert ctx.profile.step_validation_enabled
    todo = TodoTool()
    await call(todo, ctx, action="add", text="fix the bug")
    refused = await call(todo, ctx, action="update", index=1, status="done")
    assert not refused.ok and "'validation'" in (refused.error or "")
    assert (await load_todo(kv, "s1"))[0].status == "pending"
    done = await call(
        todo, ctx, action="update", index=1, status="done", validation="pytest: 12 passed"
    )
    assert done.ok and "validated: pytest: 12 passed" in done.output
    assert (await load_todo(kv, "s1"))[0] == TodoStep(1, "fix the bug", "done", "pytest: 12 passed")


async def test_todo_done_without_validation_is_fine_when_not_required(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, profile="general")
    assert not ctx.profile.step_validation_enabled
    todo = TodoTool()
    await call(todo, ctx, action="add", text="say hello")
    assert (await call(todo, ctx, action="update", index=1, status="done")).ok


@pytest.mark.parametrize(
    "args, needle",
    [
        ({}, "'action'"),
        ({"action": "add"}, "'text'"),
        ({"action": "add", "text": "x" * 501}, "'text'"),
        ({"action": "update", "index": 1, "status": "done"}, "todo list is empty"),
        ({"action": "remove", "index": "1"}, "'index'"),
        ({"action": "replace", "texts": "a, b"}, "'texts'"),
        ({"action": "replace", "texts": ["a", ""]}, "'texts'"),
    ],
)
async def test_todo_bad_arguments_name_the_argument(
    tmp_path: Path, args: dict[str, Any], needle: str
) -> None:
    result = await call(TodoTool(), make_ctx(tmp_path), **args)
    assert not result.ok and needle in (result.error or ""), result.error


async def test_todo_update_checks_status_and_index_range(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    todo = TodoTool()
    await call(todo, ctx, action="add", text="one")
    bad_status = await call(todo, ctx, action="update", index=1, status="finished")
    assert not bad_status.ok and "'status'" in (bad_status.error or "")
    out_of_range = await call(todo, ctx, action="update", index=2, status="done")
    assert not out_of_range.ok and "1-1" in (out_of_range.error or "")
    nothing = await call(todo, ctx, action="update", index=1)
    assert not nothing.ok and "at least one" in (nothing.error or "")


async def test_todo_parallel_adds_are_not_lost(tmp_path: Path, autojump_clock: Any) -> None:
    kv = MemoryKV()
    ctx = make_ctx(tmp_path, kv=kv)
    todo = TodoTool()

    async def add(n: int) -> None:
        assert (await call(todo, ctx, action="add", text=f"step {n}")).ok

    async with trio.open_nursery() as nursery:
        for n in range(10):
            nursery.start_soon(add, n)
    assert len(await load_todo(kv, "s1")) == 10


async def test_plan_fills_the_list_and_failed_steps_are_found(tmp_path: Path) -> None:
    kv = MemoryKV()
    steps = await fill_from_plan(kv, "s1", ["read the code", "  ", "change it", "test it"])
    assert [(s.index, s.text, s.status) for s in steps] == [
        (1, "read the code", "pending"),
        (2, "change it", "pending"),
        (3, "test it", "pending"),
    ]
    assert await load_todo(kv, "s1") == steps
    changed = [steps[0], TodoStep(2, "change it", "failed"), steps[2]]
    await save_todo(kv, "s1", changed)
    assert failed_indexes(await load_todo(kv, "s1")) == {2}
    assert "2. [!] change it (failed)" in format_todo(changed)
    assert await load_todo(kv, "other") == []


async def test_todo_lists_are_per_session(tmp_path: Path) -> None:
    kv = MemoryKV()
    todo = TodoTool()
    await call(todo, make_ctx(tmp_path, kv=kv, session_id="a"), action="add", text="mine")
    other = await call(todo, make_ctx(tmp_path, kv=kv, session_id="b"), action="list")
    assert other.output == "(the todo list is empty)"


async def test_todo_tool_works_on_the_real_sqlite_store(tmp_path: Path) -> None:
    from navi_trio.store.sqlite import SQLiteStore

    with trio.fail_after(20):
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            ctx = make_ctx(tmp_path, kv=store, profile="coder")
            todo = TodoTool()
            await call(todo, ctx, action="replace", texts=["plan", "build"])
            await call(todo, ctx, action="update", index=1, status="done", validation="ok")
        async with SQLiteStore.open(tmp_path / "navi.db") as reopened:
            steps = await load_todo(reopened, "s1")
    assert [(s.text, s.status, s.validation) for s in steps] == [
        ("plan", "done", "ok"),
        ("build", "pending", None),
    ]


# -- scratchpad ---------------------------------------------------------------------------


async def test_scratchpad_write_append_read_clear(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    pad = ScratchpadTool()
    assert (await call(pad, ctx, action="read")).output == "(the scratchpad is empty)"
    assert (await call(pad, ctx, action="write", content="facts:\n")).ok
    assert (await call(pad, ctx, action="append", content="- x = 1\n")).ok
    assert (await call(pad, ctx, action="read")).output == "facts:\n- x = 1\n"
    assert (await call(pad, ctx, action="write", content="fresh")).ok
    assert (await call(pad, ctx, action="read")).output == "fresh"
    assert (await call(pad, ctx, action="clear")).ok
    assert (await call(pad, ctx, action="read")).output == "(the scratchpad is empty)"


async def test_scratchpad_is_capped_and_per_session(tmp_path: Path) -> None:
    kv = MemoryKV()
    ctx = make_ctx(tmp_path, kv=kv, tool_output_max_chars=20)
    pad = ScratchpadTool()
    assert (await call(pad, ctx, action="write", content="0123456789")).ok
    over = await call(pad, ctx, action="append", content="0123456789X")
    assert not over.ok and "at most 20 characters" in (over.error or "")
    assert (await call(pad, ctx, action="read")).output == "0123456789"
    other = make_ctx(tmp_path, kv=kv, session_id="s2")
    assert (await call(pad, other, action="read")).output == "(the scratchpad is empty)"
    missing = await call(pad, ctx, action="append")
    assert not missing.ok and "'content'" in (missing.error or "")


# -- memory ---------------------------------------------------------------------------------


async def test_memory_remember_forget_list_with_stable_ids(tmp_path: Path) -> None:
    kv = MemoryKV()
    ctx = make_ctx(tmp_path, kv=kv, user_id="ann")
    mem = MemoryTool()
    first = await call(mem, ctx, action="remember", fact="Prefers metric units")
    second = await call(mem, ctx, action="remember", fact="Works  in\nPython")
    assert first.output.startswith("remembered m1") and second.output.startswith("remembered m2")
    again = await call(mem, ctx, action="remember", fact="Prefers metric units")
    assert again.ok and "already remembered as m1" in again.output
    assert (await call(mem, ctx, action="forget", id="m2")).ok
    third = await call(mem, ctx, action="remember", fact="Lives in Lyon")
    assert third.output.startswith("remembered m3")  # m2 is never reused
    assert (await call(mem, ctx, action="forget", fact="Prefers metric units")).ok
    assert (await call(mem, ctx, action="list")).output == "m3: Lives in Lyon"
    assert await load_memories(kv, "ann") == ["Lives in Lyon"]
    assert await load_memories(kv, "bob") == []
    unknown = await call(mem, ctx, action="forget", id="m9")
    assert not unknown.ok and "m9" in (unknown.error or "")
    empty = await call(mem, ctx, action="remember", fact="  ")
    assert not empty.ok and "'fact'" in (empty.error or "")
    neither = await call(mem, ctx, action="forget")
    assert not neither.ok and "'id'" in (neither.error or "")


async def test_memory_belongs_to_the_user_across_sessions(tmp_path: Path) -> None:
    kv = MemoryKV()
    mem = MemoryTool()
    await call(
        mem,
        make_ctx(tmp_path, kv=kv, user_id="ann", session_id="a"),
        action="remember",
        fact="Likes tea",
    )
    in_b = await call(mem, make_ctx(tmp_path, kv=kv, user_id="ann", session_id="b"), action="list")
    other_user = await call(mem, make_ctx(tmp_path, kv=kv, user_id="bob"), action="list")
    assert in_b.output == "m1: Likes tea"
    assert "nothing remembered" in other_user.output


# -- switch_profile --------------------------------------------------------------------------


class Switcher:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def switch_profile(self, profile_id: str) -> None:
        if profile_id == "coder" and self.calls == ["refuse"]:
            raise ToolInputError("profile 'coder' is disabled for this session")
        self.calls.append(profile_id)


async def test_switch_profile_calls_the_service_for_a_valid_id(tmp_path: Path) -> None:
    switcher = Switcher()
    ctx = make_ctx(tmp_path, services=switcher)
    result = await call(SwitchProfileTool(), ctx, profile_id="coder", reason="code work")
    assert result.ok and "next iteration" in result.output
    assert switcher.calls == ["coder"]


async def test_switch_profile_lists_valid_ids_on_a_bad_one(tmp_path: Path) -> None:
    switcher = Switcher()
    ctx = make_ctx(tmp_path, services=switcher)
    result = await call(SwitchProfileTool(), ctx, profile_id="wizard")
    assert not result.ok
    assert "'wizard'" in (result.error or "") and "coder, general, local, researcher" in (
        result.error or ""
    )
    assert switcher.calls == []
    missing = await call(SwitchProfileTool(), ctx)
    assert not missing.ok and "'profile_id'" in (missing.error or "")


class NoSwitch(Switcher):
    """Services that cannot switch (as a background job's): they say so."""

    def switch_profile(self, profile_id: str) -> None:
        raise ToolInputError("switching profiles is not available here")


async def test_switch_profile_without_the_service_is_a_clear_failure(tmp_path: Path) -> None:
    for services in (None, NoSwitch()):
        ctx = make_ctx(tmp_path, services=services)
        result = await call(SwitchProfileTool(), ctx, profile_id="coder")
        assert not result.ok and "not available here" in (result.error or "")


async def test_switch_profile_service_refusal_becomes_a_failed_result(tmp_path: Path) -> None:
    switcher = Switcher()
    switcher.calls.append("refuse")
    ctx = make_ctx(tmp_path, services=switcher)
    result = await call(SwitchProfileTool(), ctx, profile_id="coder")
    assert not result.ok and "disabled" in (result.error or "")
    same = await call(SwitchProfileTool(), ctx, profile_id="general")
    assert same.ok and "already using" in same.output
