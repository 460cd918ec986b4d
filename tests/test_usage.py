"""The accounts: what each run spent, kept in the store and reported by `usage`.

A daemon on a real SQLite file with the fake LLM over real HTTP and real WebSocket
clients on 127.0.0.1: a turn that calls a sub-agent, whose usage is billed to the
parent session on a line of its own; the totals equal what the fake LLM reported; cost
from the configured prices; a user sees only their own; the figures outlive a restart;
`navi usage` prints them as a table. Every test has an absolute time limit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import call, toolset, with_tools
from api_ws import Client, Daemon, open_daemon
from test_client_app import Chat, QueueReader, Screen

from navi_trio.api.usage_commands import since_epoch
from navi_trio.client.app import ChatApp, ChatOptions
from navi_trio.client.render import Renderer
from navi_trio.errors import ProtocolError
from navi_trio.testing.harness import test_config as config_with
from navi_trio.text import usage_table
from navi_trio.tools.spawn_agent import SpawnAgentTool

TIMEOUT = 30
PRICES = {"qwen3:8b": {"price_in": 2.0, "price_out": 10.0}}
REPLIES: list[dict[str, Any]] = [
    # The parent asks a sub-agent (its one answer below), then answers itself.
    {**call("spawn_agent", task="look it up"), "prompt_tokens": 1000, "completion_tokens": 20},
    {"text": "the sub-agent's finding", "prompt_tokens": 300, "completion_tokens": 30},
    {"text": "done, with the finding", "prompt_tokens": 1500, "completion_tokens": 40},
]


@asynccontextmanager
async def daemon(tmp_path: Path, replies: list[dict[str, Any]]) -> AsyncIterator[Daemon]:
    profiles = {"general": with_tools(["spawn_agent"], planning_first_message=False)}
    async with open_daemon(
        tmp_path, replies=replies, tools=toolset(SpawnAgentTool()), profiles=profiles,
        config=config_with(profiles, models=PRICES),
    ) as d:  # fmt: skip
        yield d


async def run_turn(d: Daemon, c: Client, text: str) -> str:
    """Send `text` in a new session; its id once its stream_end came (the accounts are
    written before it is sent: nothing more to wait for)."""
    created = await c.request({"type": "message", "content": text})
    sid = str(created["session_id"])
    await c.until_end(sid)
    return sid


async def test_a_turn_and_its_sub_agent_are_billed_to_the_session_apart(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, REPLIES) as d, d.connect("alice") as alice:
            sid = await run_turn(d, alice, "find it")
            report = await alice.request({"type": "usage", "by": "session"})
    assert report["type"] == "usage", report
    lines = {line["kind"]: line for line in report["lines"]}
    assert set(lines) == {"turn", "subagent"} and {ln["key"] for ln in lines.values()} == {sid}
    # Each line is its run's own calls: the parent's two, the sub-agent's one.
    assert (lines["turn"]["tokens_in"], lines["turn"]["tokens_out"]) == (2500, 60)
    assert (lines["subagent"]["tokens_in"], lines["subagent"]["tokens_out"]) == (300, 30)
    assert lines["turn"]["runs"] == lines["subagent"]["runs"] == 1
    # The totals are the sums of what the fake LLM reported for every call.
    totals = report["totals"]
    assert (totals["tokens_in"], totals["tokens_out"]) == (2800, 90)
    assert totals["cost"] == pytest.approx((2800 * 2.0 + 90 * 10.0) / 1e6)
    assert lines["subagent"]["cost"] == pytest.approx((300 * 2.0 + 30 * 10.0) / 1e6)
    assert lines["turn"]["llm_sec"] >= 0 and lines["turn"]["tool_sec"] >= 0


async def test_each_user_sees_their_own_and_an_admin_everyones(tmp_path: Path) -> None:
    replies = [{"text": "hi alice", "prompt_tokens": 11, "completion_tokens": 1},
               {"text": "hi bob", "prompt_tokens": 22, "completion_tokens": 2}]  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, replies) as d:
            async with d.connect("alice") as alice, d.connect("bob") as bob:
                sid = await run_turn(d, alice, "hello")
                await run_turn(d, bob, "hello")
                mine = await bob.request({"type": "usage"})
                theirs = await bob.request({"type": "usage", "session_id": sid})
                spy = await bob.request({"type": "usage", "user": "alice"})
            async with d.connect("root") as root:
                every = await root.request({"type": "usage", "by": "user"})
                one = await root.request({"type": "usage", "user": "alice"})
                bad = await root.request({"type": "usage", "since": "last tuesday"})
    assert mine["totals"]["tokens_in"] == 22
    assert theirs["type"] == "error" and theirs["code"] == "forbidden", theirs
    assert spy["type"] == "error" and spy["code"] == "forbidden", spy
    assert {line["key"] for line in every["lines"]} == {d.ids["alice"], d.ids["bob"]}
    assert one["totals"]["tokens_in"] == 11
    assert bad["type"] == "error" and "since 'last tuesday'" in bad["message"], bad


async def test_the_accounts_outlive_a_restart_and_print_as_a_table(tmp_path: Path) -> None:
    replies = [{"text": "kept", "prompt_tokens": 5, "completion_tokens": 7}]
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, replies) as d, d.connect("alice") as alice:
            await run_turn(d, alice, "remember this")
        async with daemon(tmp_path, []) as d, d.connect("root") as root:
            report = await root.request({"type": "usage", "by": "model", "since": "1d"})
    assert report["totals"]["tokens_in"] == 5 and report["totals"]["tokens_out"] == 7
    table = usage_table(report)
    assert table[0].split() == ["model", "model", "kind", "runs", "in", "out", "llm", "s",
                                "tools", "s", "cost"]  # fmt: skip
    assert table[1].split()[:6] == ["qwen3:8b", "qwen3:8b", "turn", "1", "5", "7"]
    assert table[-1].split()[0] == "total" and table[-1].endswith(f"{(5 * 2 + 7 * 10) / 1e6:.4f}")
    assert usage_table({"lines": [], "since": 1.0}) == ["no usage recorded since then"]


def test_since_takes_a_span_a_date_or_epoch_seconds() -> None:
    assert since_epoch("7d", 1_000_000.0) == 1_000_000.0 - 7 * 86400
    assert since_epoch("12h", 100_000.0) == 100_000.0 - 12 * 3600
    assert since_epoch("1700000000", 0) == 1700000000.0
    assert since_epoch("2026-12-01T00:00:00+00:00", 0) == 1796083200.0
    with pytest.raises(ProtocolError, match="give a span"):
        since_epoch("soon", 0)


async def test_slash_usage_in_the_chat_shows_the_sessions_lines(tmp_path: Path) -> None:
    replies = [{"text": "counted", "prompt_tokens": 64, "completion_tokens": 8}]
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path, replies) as d, trio.open_nursery() as nursery:
            reader, screen = QueueReader(), Screen()
            opts = ChatOptions(url=d.url, token=d.tokens["alice"], backoff=0)
            chat = Chat(ChatApp(opts, Renderer(screen.console), reader), reader, screen)
            nursery.start_soon(chat.run)
            reader.type("count me")
            await screen.wait_for("counted")
            reader.type("/usage")
            await screen.wait_for("total")
            reader.type("/quit")
            await chat.done.wait()
    row = next(line for line in screen.text.splitlines() if " turn " in line)
    assert row.split()[:6] == ["qwen3:8b", "qwen3:8b", "turn", "1", "64", "8"], row
