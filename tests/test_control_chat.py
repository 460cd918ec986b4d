"""Control of a running agent from `navi chat` (issue 23): Ctrl+Enter and /steer steer,
/interrupt interrupts, the status line shows the budget, /schedule and /schedules manage
schedules and a scheduled run's notice shows wherever the chat is.

The chat (`ChatApp`, fed by a `QueueReader`, printing to a recording console:
tests/test_client_app.py) talks to a real daemon on 127.0.0.1 (tests/api_ws.py) whose
runs wait in a gate tool the test opens. The keys themselves are read by the real
prompt_toolkit prompt on a pipe input. Nothing sleeps; every test has a deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from agent_tools import BlockTool, GateTool, call, toolset, with_tools
from api_ws import Daemon, open_daemon
from test_budgets import Echo
from test_client_app import Chat, QueueReader, Screen
from test_on_busy_clients import steer_arrives

from navi_trio.client.app import ChatApp, ChatOptions
from navi_trio.client.reader import CTRL_ENTER, InputEvent, PromptReader
from navi_trio.client.render import Renderer
from navi_trio.notices import ScheduleRun

DEADLINE = 20


@asynccontextmanager
async def chatting(d: Daemon, user: str = "alice", **options: Any) -> AsyncIterator[Chat]:
    reader, screen = QueueReader(), Screen()
    opts = ChatOptions(url=d.url, token=d.tokens[user], backoff=0, **options)
    chat = Chat(ChatApp(opts, Renderer(screen.console), reader), reader, screen)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(chat.run)
        yield chat
        chat.reader.type("/quit")
        with trio.move_on_after(5):
            await chat.done.wait()
        nursery.cancel_scope.cancel()


def daemon(tmp_path: Path, tool: Any, *replies: dict[str, Any], **flags: Any) -> Any:
    return open_daemon(
        tmp_path, replies=[call(tool.name), *replies], tools=toolset(tool),
        profiles={"general": with_tools([tool.name], planning_first_message=False, **flags)},
        loop=bool(flags),
    )  # fmt: skip


async def users(d: Daemon, sid: str) -> list[tuple[str, bool]]:
    saved = await d.harness.runtime.store.load_messages(sid)
    return [(m["content"], bool(m.get("steered"))) for m in saved if m["role"] == "user"]


async def test_ctrl_enter_and_slash_steer_steer_the_running_turn(tmp_path: Path) -> None:
    gate = GateTool()
    with trio.fail_after(DEADLINE):
        async with daemon(tmp_path, gate, {"text": "steered answer"}) as d, chatting(d) as chat:
            chat.reader.type("work")
            await gate.entered.wait()
            (sid,) = d.harness.runtime.sessions._actors
            arrived = steer_arrives(d, sid, 2)
            chat.reader.events.put(InputEvent("steer", "in French"))  # Ctrl+Enter
            chat.reader.type("/steer and short")
            await arrived.wait()
            gate.gate.set()
            await chat.screen.wait_for("steered answer")
            await chat.screen.wait_for("↪ steered: and short")
            assert await users(d, sid) == [("work", False), ("in French", True),
                                           ("and short", True)]  # fmt: skip
            assert "↪ steered: in French" in chat.screen.text
            assert "queued #" not in chat.screen.text


async def test_slash_interrupt_stops_the_run_and_runs_the_text_next(tmp_path: Path) -> None:
    block = BlockTool()
    with trio.fail_after(DEADLINE):
        async with daemon(tmp_path, block, {"text": "new answer"}) as d, chatting(d) as chat:
            chat.reader.type("work")
            await block.started.wait()
            chat.reader.type("/interrupt do this instead")
            await chat.screen.wait_for("■ stopped")
            await chat.screen.wait_for("new answer")
            sid = chat.app.session_id
            assert sid is not None
            assert await users(d, sid) == [("work", False), ("do this instead", False)]
            chat.reader.type("/interrupt")
            await chat.screen.wait_for("/interrupt needs the text of the message")


async def test_the_prompt_reads_ctrl_enter_and_alt_enter_as_a_steer() -> None:
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    got = []
    with create_pipe_input() as keys:
        reader = PromptReader(lambda: "", terminal=(keys, DummyOutput()))
        for sequence in (*CTRL_ENTER, "\x1b\r"):  # Ctrl+Enter (two forms), Alt+Enter
            keys.send_text("in French" + sequence)
            got.append(await trio.to_thread.run_sync(reader.read))
        keys.send_text("plain\r")
        got.append(await trio.to_thread.run_sync(reader.read))
    assert got == [InputEvent("steer", "in French")] * 3 + [InputEvent("line", "plain")]


async def test_the_status_line_shows_the_budget_and_its_end_is_said(tmp_path: Path) -> None:
    echo = Echo()
    budgets = {"turn": {"tool_calls": 2}}
    with trio.fail_after(DEADLINE):
        async with daemon(tmp_path, echo, budgets=budgets) as d, chatting(d) as chat:
            chat.reader.type("loop")
            await chat.screen.wait_for("budget spent")
            await chat.screen.wait_for("budget turn tool calls 2/2")
            assert "turn budget of 2 tool calls is spent" in chat.screen.text
            assert chat.app.renderer.status.budget == "turn tool calls 2/2"
            assert echo.calls == 2


async def test_schedules_from_the_chat_and_a_scheduled_runs_notice(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with open_daemon(tmp_path, schedules=True) as d, chatting(d) as chat:
            chat.reader.type('/schedule cron "*/30 * * * *" tidy the inbox')
            await chat.screen.wait_for("schedule add: sch-")
            (row,) = await d.harness.runtime.store.list_schedules()
            assert (row.kind, row.spec, row.message, row.session_id) == (
                "cron", "*/30 * * * *", "tidy the inbox", None
            )  # fmt: skip
            chat.reader.type(f"/schedule pause {row.id}")
            await chat.screen.wait_for("schedule pause:")
            chat.reader.type("/schedules")
            await chat.screen.wait_for("1 schedule(s)")
            assert "paused" in chat.screen.text
            chat.reader.type("/schedule every soon x")
            await chat.screen.wait_for("a duration like")
            # A scheduled run ends: the owner's chat says so, whatever session it is in.
            ended = ScheduleRun(row.id, "s-elsewhere", "complete", "inbox tidied", 0)
            d.harness.runtime.notices.publish(d.ids["alice"], ended)
            await chat.screen.wait_for("⏰ schedule")
            await chat.screen.wait_for("inbox tidied")
            chat.reader.type(f"/schedule remove {row.id}")
            await chat.screen.wait_for(f"schedule {row.id} removed")
            assert await d.harness.runtime.store.list_schedules() == []


async def test_the_chat_shows_a_turn_that_background_results_started(tmp_path: Path) -> None:
    gate = GateTool()
    replies = [call("gate", background=True), {"text": "started it"}, {"text": "it is done"}]
    with trio.fail_after(DEADLINE):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate), backgroundable_tools=("gate",),
            profiles={"general": with_tools(["gate"], planning_first_message=False,
                                            wake_on_task_done=True)},
        ) as d, chatting(d) as chat:  # fmt: skip
            chat.reader.type("start the job")
            await chat.screen.wait_for("started it")
            gate.gate.set()
            await chat.screen.wait_for("background results arrived")
            await chat.screen.wait_for("it is done")
            assert d.harness.fake is not None and len(d.harness.fake.chat_requests) == 3
