"""One store write per tool round; a slow call still gets its call message saved early.

The loop talks real HTTP to the fake LLM on 127.0.0.1 through `open_harness`; the store
is a real SQLite file under tmp_path. The slow-tool test runs on the autojump clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import EchoTool, call, seed, system_notes, toolset, with_tools
from realtime import real_time_limit

from navi_trio.core import turn as turn_module
from navi_trio.core.turn import CALL_SAVE_DELAY
from navi_trio.store.base import SessionStore
from navi_trio.testing import open_harness
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.todo import SCOPE as TODO_SCOPE

TIMEOUT = 30


class PeekTool:
    """Waits `wait` seconds (0: not at all), then notes which messages the store holds."""

    name = "peek"
    description = "look at the stored history"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self.store: SessionStore | None = None
        self.seen: list[list[str]] = []
        self.contexts: list[ToolContext] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.contexts.append(ctx)
        if self.wait:
            await trio.sleep(self.wait)
        assert self.store is not None
        stored = await self.store.load_messages("s1")
        self.seen.append([m["role"] for m in stored])
        return ToolResult.success("ok")


async def _run(tmp_path: Path, tool: PeekTool) -> list[str]:
    replies = [call("peek"), call("peek"), {"text": "done"}]
    async with open_harness(
        tmp_path, replies=replies, tools=toolset(tool), profiles={"general": with_tools(["peek"])}
    ) as h:
        store = h.runtime.store
        tool.store = store
        appends: list[str] = []
        append = store.append

        async def counting_append(session_id: str, **kw: Any) -> None:
            appends.append(session_id)
            await append(session_id, **kw)

        store.append = counting_append  # type: ignore[method-assign]
        frames = await h.turn("s1", "hi")
        assert frames[-1]["reason"] == "complete"
        roles = [m["role"] for m in await h.runtime.store.load_messages("s1")]
        assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        return appends


async def test_a_quick_round_is_one_store_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "Quick" is "done before the delay": a long delay keeps a loaded machine's slow
    # store from making this round slow.
    monkeypatch.setattr(turn_module, "CALL_SAVE_DELAY", 3600.0)
    with trio.fail_after(TIMEOUT):
        tool = PeekTool(wait=0)
        appends = await _run(tmp_path, tool)
        # The user message, one write per tool round, the answer.
        assert len(appends) == 4
        # While the quick call ran, its call message was not written yet.
        assert tool.seen == [["user"], ["user", "assistant", "tool"]]
        # The tool context is made once per turn.
        assert tool.contexts[0].services is tool.contexts[1].services


async def test_a_slow_call_has_its_call_message_saved_while_it_runs(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with real_time_limit(TIMEOUT):
        tool = PeekTool(wait=CALL_SAVE_DELAY * 4)
        appends = await _run(tmp_path, tool)
        # A crash during a long call keeps the call (the load pairs it with a result).
        assert tool.seen == [["user", "assistant"], ["user", "assistant", "tool", "assistant"]]
        assert len(appends) == 6


async def _todo_reads(tmp_path: Path, **flags: bool) -> int:
    replies = [call("peek"), call("peek"), call("peek"), {"text": "done"}]
    tool = PeekTool(wait=0)
    profile = with_tools(["peek"], **flags)
    async with open_harness(
        tmp_path, replies=replies, tools=toolset(tool), profiles={"general": profile}
    ) as h:
        store = h.runtime.store
        tool.store = store
        reads: list[str] = []
        kv_get = store.kv_get

        async def counting_kv_get(scope: str, key: str) -> Any:
            if scope == TODO_SCOPE:
                reads.append(key)
            return await kv_get(scope, key)

        store.kv_get = counting_kv_get  # type: ignore[method-assign]
        frames = await h.turn("s1", "hi")
        assert frames[-1]["reason"] == "complete"
        return len(reads)


async def test_the_todo_list_is_read_each_round_only_for_a_profile_that_tracks_progress(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        off = {"anti_stall_enabled": False, "adaptive_replan_enabled": False}
        assert await _todo_reads(tmp_path / "off", **off) == 1  # once, as the turn starts
        on = {"anti_stall_enabled": True, "adaptive_replan_enabled": False}
        assert await _todo_reads(tmp_path / "on", **on) == 1 + 3


async def test_progress_counts_from_a_switch_into_a_profile_that_tracks_it(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [
            call("switch_profile", profile_id="watch"),
            call("peek"),
            *[call("echo", text=f"v{i}") for i in range(1, 3)],
            {"text": "final"},
        ]
        quiet = {"anti_stall_enabled": False, "adaptive_replan_enabled": False}
        watch = {"anti_stall_enabled": True, "anti_stall_threshold": 2}
        profiles = {
            "general": with_tools(["switch_profile", "echo"], **quiet),
            "watch": with_tools(["echo", "peek"], goal_anchoring_enabled=False, **watch),
        }
        peek = PeekTool(wait=0)
        async with open_harness(
            tmp_path, replies=replies, tools=toolset(EchoTool(), peek), profiles=profiles
        ) as h:
            peek.store = h.runtime.store
            await seed(h)
            frames = await h.turn("s1", "Find the answer to the question")
            warned = [
                i for i, body in enumerate(h.chat_requests)
                if any(n.startswith("[Warning]") for n in system_notes(body))
            ]  # fmt: skip
            # Rounds under "watch" only: two echoes without todo progress, then the warning.
            assert warned == [3]
            assert [f["code"] for f in frames if f["type"] == "warning"] == ["anti_stall"]
            # The tool context was made anew for the new profile.
            assert [c.profile.id for c in peek.contexts] == ["watch"]
