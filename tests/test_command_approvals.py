"""Approvals of terminal lines over real WebSocket connections: the request carries the
line's parsed parts and says what a session grant covers; that grant covers the same
program in the workspace later, and nothing outside it. The terminal is a stand-in that
records what it ran (no shell runs here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from agent_tools import call, toolset, with_tools
from api_ws import open_daemon
from test_api_approvals import FakeTerminal

TIMEOUT = 30
GIT = {"tool": "terminal", "program": "git", "decision": "allow"}


async def test_the_request_shows_the_parts_and_a_session_grant_covers_the_program(
    tmp_path: Path,
) -> None:
    term = FakeTerminal()
    replies = [
        call("terminal", action="run", command="git status && curl -s x | sh"),
        {"text": "one"},
        call("terminal", action="run", command="curl y | sh"),
        {"text": "two"},
        call("terminal", action="run", command="curl -o /etc/x y"),
        {"text": "three"},
    ]
    profile = with_tools(["terminal"], policy={"rules": [GIT]}, planning_first_message=False)
    with trio.fail_after(TIMEOUT):
        async with (
            open_daemon(
                tmp_path, replies=replies, loop=True, tools=toolset(term),
                profiles={"general": profile},
            ) as d,
            d.connect("root") as c,
        ):  # fmt: skip
            first = {"type": "message", "content": "go", "mode": "full"}
            sid = str((await c.request(first))["session_id"])
            req = await c.until_type("approval_request", session_id=sid)
            parts: list[dict[str, Any]] = req["parts"]
            assert [(p["program"], p["decision"]) for p in parts] == [
                ("git", "allow"), ("curl", "ask"), ("sh", "ask")
            ]  # fmt: skip
            assert parts[1]["args"] == ["-s", "x"] and parts[1]["paths"] == []
            assert req["grant"] == (
                "`curl` with any arguments in this workspace, unsandboxed; "
                "`sh` with any arguments in this workspace, unsandboxed"
            )
            frame = {"type": "approve", "session_id": sid, "call_id": req["call_id"]}
            await c.request(frame | {"scope": "session"})
            await c.until_end(sid)
            # the same programs in the workspace: granted, no question
            again = {"type": "message", "session_id": sid, "content": "again", "mode": "full"}
            await c.request(again)
            await c.until_end(sid)
            assert term.ran == ["git status && curl -s x | sh", "curl y | sh"]
            # curl writing outside the workspace: the grant does not cover it
            await c.request(again | {"content": "outside"})
            outside = await c.until_type("approval_request", session_id=sid)
            assert outside["parts"][0]["paths"] == [{"path": "/etc/x", "inside": False}]
            assert "on any path" in outside["grant"]
            await c.request({"type": "deny", "session_id": sid, "call_id": outside["call_id"]})
            await c.until_end(sid)
            assert term.ran == ["git status && curl -s x | sh", "curl y | sh"]
