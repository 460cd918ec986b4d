"""The daemon's client tools (api/client_tools.py): a call goes to the declaring
connection and waits for its answer, bounded in time and size; the connection gone, the
call fails naming the tool; only the declaring user's runs in that session get them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing
from api_ws import open_daemon
from test_mcp_client import mcp_config, stdio_entry

from navi_trio.api import command_frames
from navi_trio.api.client_tools import CALL_TIMEOUT_SEC, ClientTools
from navi_trio.core.turn import runvars
from navi_trio.profiles import AgentProfile
from navi_trio.settings import Settings
from navi_trio.tools.base import ToolContext


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


ECHO = ("mcp__editor-demo__echo", "echo", {"type": "object"})


class Ctx:
    def __init__(self) -> None:
        self.settings = Settings(tool_output_max_chars=100)


def ctx() -> ToolContext:
    return cast(ToolContext, Ctx())


async def test_a_call_goes_to_the_declaring_client_and_its_answer_comes_back() -> None:
    hub, conn, sent = ClientTools(), object(), trio.Event()
    frames: list[dict[str, Any]] = []

    async def send(frame: dict[str, Any]) -> None:
        frames.append(frame)
        sent.set()

    hub.declare("s-1", "u-ann", conn, send, [ECHO])
    with runvars.bound(session_id="s-1", user_id="u-ann"):
        assert await hub.prepare(AgentProfile(), lambda e: None) == ["mcp__editor-demo__echo"]
        tool = hub.get("mcp__editor-demo__echo")
    assert tool is not None
    async with trio.open_nursery() as nursery:

        async def answer() -> None:
            await sent.wait()
            assert not hub.answer(object(), frames[0]["call_id"], True, "x")  # not its call
            assert hub.answer(conn, frames[0]["call_id"], True, "y" * 1000)

        nursery.start_soon(answer)
        result = await tool.execute({"text": "hi"}, ctx())
    assert frames[0]["type"] == "client_tool_call" and frames[0]["arguments"] == {"text": "hi"}
    assert result.ok and len(result.output) < 200  # cut at the tool output limit


async def test_others_get_nothing_another_session_another_user() -> None:
    hub = ClientTools()

    async def send(frame: dict[str, Any]) -> None:
        pass

    hub.declare("s-1", "u-ann", object(), send, [ECHO])
    for sid, uid in (("s-2", "u-ann"), ("s-1", "u-admin")):
        with runvars.bound(session_id=sid, user_id=uid):
            assert await hub.prepare(AgentProfile(), lambda e: None) == []
            assert hub.get("mcp__editor-demo__echo") is None


async def test_the_client_gone_mid_call_fails_it_naming_the_tool() -> None:
    hub, conn, sent = ClientTools(), object(), trio.Event()

    async def send(frame: dict[str, Any]) -> None:
        sent.set()

    hub.declare("s-1", "u-ann", conn, send, [ECHO])
    with runvars.bound(session_id="s-1", user_id="u-ann"):
        tool = hub.get("mcp__editor-demo__echo")
    assert tool is not None
    async with trio.open_nursery() as nursery:

        async def go_away() -> None:
            await sent.wait()
            hub.drop(conn)

        nursery.start_soon(go_away)
        result = await tool.execute({}, ctx())
    assert not result.ok
    assert (
        result.error
        == "mcp__editor-demo__echo: the client that offered it went away during the call"
    )
    again = await tool.execute({}, ctx())
    assert again.error == "mcp__editor-demo__echo: the client that offered it went away"


async def test_a_client_that_does_not_answer_fails_the_call_in_time(
    mock_clock: trio.testing.MockClock,
) -> None:
    hub = ClientTools()

    async def send(frame: dict[str, Any]) -> None:
        pass

    hub.declare("s-1", "u-ann", object(), send, [ECHO])
    with runvars.bound(session_id="s-1", user_id="u-ann"):
        tool = hub.get("mcp__editor-demo__echo")
    assert tool is not None
    start = trio.current_time()
    result = await tool.execute({}, ctx())
    assert trio.current_time() - start == CALL_TIMEOUT_SEC
    assert (
        result.error
        == f"mcp__editor-demo__echo: the client did not answer within {CALL_TIMEOUT_SEC:g} s"
    )


async def test_the_frames_are_the_session_owners_alone_and_keep_off_the_daemons_servers(
    tmp_path: Path,
) -> None:
    config = mcp_config({"github": stdio_entry()}, policy={})
    spec = {"name": "mcp__editor-demo__echo", "description": "echo", "parameters": {}}
    with trio.fail_after(60):
        async with open_daemon(tmp_path, config=config) as d:
            await d.harness.runtime.store.create_session(
                "s-alice", profile_id="general", user_id=d.ids["alice"]
            )
            declare = {"type": "client_tools", "session_id": "s-alice", "tools": [spec]}
            async with d.connect("alice") as alice:
                ok = await alice.request(declare)
                assert ok["type"] == "ok" and ok["tools"] == [spec["name"]], ok
                clash = {**spec, "name": "mcp__github__create_issue"}
                err = await alice.request({**declare, "tools": [clash]})
                assert err["code"] == "bad_frame", err
                assert "the daemon has an MCP server named 'github'" in err["message"]
                err = await alice.request(
                    {"type": "client_tool_result", "call_id": "ct-9", "ok": True}
                )
                assert err["code"] == "not_found" and "ct-9" in err["message"], err
            for who, why in (("bob", "belongs to another user"), ("root", "another user's")):
                async with d.connect(who) as other:
                    err = await other.request(declare)
                    assert err["code"] == "forbidden" and why in err["message"], (who, err)


def test_at_most_64_tools_of_at_most_64_kib_of_schema_each() -> None:
    def spec(i: int, schema: dict[str, Any] | None = None) -> command_frames.ClientToolSpec:
        return command_frames.ClientToolSpec(f"mcp__ed__t{i}", "d", schema or {"type": "object"})

    most = command_frames.CLIENT_TOOLS_MAX
    assert most == 64
    command_frames.ClientTools("s-alice", tuple(spec(i) for i in range(most)))
    with pytest.raises(ValueError, match="65 tools, more than 64"):
        command_frames.ClientTools("s-alice", tuple(spec(i) for i in range(most + 1)))
    bound = command_frames.CLIENT_TOOL_SCHEMA_MAX_BYTES
    assert bound == 64 * 1024
    empty = len(json.dumps({"type": "object", "description": ""}).encode())
    spec(0, {"type": "object", "description": "x" * (bound - empty)})  # the bound to the byte
    with pytest.raises(ValueError, match=f"{bound + 1} bytes, more than {bound}"):
        spec(0, {"type": "object", "description": "x" * (bound - empty + 1)})
