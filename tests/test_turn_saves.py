"""The store work of a tool round: the call message saved before its calls run but
without an fsync, the todo list read only when progress is tracked, one tool context.

The loop talks real HTTP to the fake LLM on 127.0.0.1 through `open_harness`; the store
is a real SQLite file under tmp_path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import EchoTool, call, seed, system_notes, toolset, with_tools

from navi_trio.store.methods import SessionStore
from navi_trio.testing import open_harness
from navi_trio.tools.base import ToolContext, ToolResult
from navi_trio.tools.todo import SCOPE as TODO_SCOPE

TIMEOUT = 30


class PeekTool:
    """Notes which messages the store holds while it runs."""

    name = "peek"
    description = "look at the stored history"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.store: SessionStore | None = None
        self.seen: list[list[str]] = []
        self.contexts: list[ToolContext] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.contexts.append(ctx)
        assert self.store is not None
        stored = await self.store.load_messages("s1")
        self.seen.append([m["role"] for m in stored])
        return ToolResult.success("ok")


async def test_the_call_message_is_saved_before_its_calls_run_without_an_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(TIMEOUT):
        tool = PeekTool()
        replies = [call("peek"), call("peek"), {"text": "done"}]
        async with open_harness(
            tmp_path, replies=replies, tools=toolset(tool),
            profiles={"general": with_tools(["peek"])},
        ) as h:  # fmt: skip
            store = h.runtime.store
            tool.store = store
            durable: list[bool] = []
            append = store.append

            async def recording_append(session_id: str, **kw: Any) -> None:
                durable.append(kw.get("durable", True))
                await append(session_id, **kw)

            monkeypatch.setattr(store, "append", recording_append)
            frames = await h.turn("s1", "hi")
            assert frames[-1]["reason"] == "complete"
            roles = [m["role"] for m in await store.load_messages("s1")]
            assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        # A crash during a call keeps the call (the load pairs it with a result).
        assert tool.seen == [["user", "assistant"], ["user", "assistant", "tool", "assistant"]]
        # The user message; per round the call (committed, not flushed) and the results
        # (flushed: both reach the disk); the answer.
        assert durable == [True, False, True, False, True, True]
        # The tool context is made once per turn.
        assert tool.contexts[0].services is tool.contexts[1].services


async def _todo_reads(tmp_path: Path, **flags: bool) -> int:
    replies = [call("peek"), call("peek"), call("peek"), {"text": "done"}]
    tool = PeekTool()
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

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(store, "kv_get", counting_kv_get)
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
        peek = PeekTool()
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
