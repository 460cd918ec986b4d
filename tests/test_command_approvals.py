"""Approvals of terminal lines over real WebSocket connections: the request carries the
line's parsed parts and says what a session grant covers; that grant covers the same
program in the workspace later, and nothing outside it. The terminal is a stand-in that
records what it ran (no shell runs here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from agent_tools import call, toolset, with_tools
from api_ws import Client, open_daemon
from test_api_approvals import FakeTerminal

from navi_trio.core.turn.approvals import ALWAYS_SCOPE

TIMEOUT = 30
GIT = {"tool": "terminal", "program": "git", "decision": "allow"}
ASK_GIT = {"tool": "terminal", "program": "git", "decision": "ask"}


def _daemon(tmp_path: Path, term: FakeTerminal, replies: list[Any], rule: Any) -> Any:
    """A daemon whose one profile offers the stand-in terminal under `rule`."""
    profile = with_tools(["terminal"], policy={"rules": [rule]}, planning_first_message=False)
    return open_daemon(
        tmp_path, replies=replies, loop=True, tools=toolset(term), profiles={"general": profile}
    )


async def _deny_next(c: Client, sid: str) -> dict[str, Any]:
    """Deny the next approval request in `sid` and wait for the run's end; the request."""
    request = await c.until_type("approval_request", session_id=sid)
    await c.request({"type": "deny", "session_id": sid, "call_id": request["call_id"]})
    await c.until_end(sid)
    return request


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
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term, replies, GIT) as d, d.connect("root") as c:
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
            outside = await _deny_next(c, sid)
            assert outside["parts"][0]["paths"] == [{"path": "/etc/x", "inside": False}]
            assert "on any path" in outside["grant"]
            assert term.ran == ["git status && curl -s x | sh", "curl y | sh"]


async def test_grants_are_listed_to_their_user_and_an_admin_and_revocable(tmp_path: Path) -> None:
    term = FakeTerminal()
    git = call("terminal", action="run", command="git status")
    replies = [git, {"text": "one"}, git, {"text": "two"}, git, {"text": "three"}]
    with trio.fail_after(TIMEOUT):
        async with (
            _daemon(tmp_path, term, replies, ASK_GIT) as d,
            d.connect("alice") as alice,
            d.connect("bob") as bob,
            d.connect("root") as root,
        ):  # fmt: skip
            sid = str((await alice.request({"type": "message", "content": "go"}))["session_id"])
            req = await alice.until_type("approval_request", session_id=sid)
            frame = {"type": "approve", "session_id": sid, "call_id": req["call_id"]}
            await alice.request(frame | {"scope": "session"})
            await alice.until_end(sid)
            listed = await alice.request({"type": "grants", "action": "list"})
            (grant,) = listed["grants"]
            assert grant["scope"] == "session" and grant["session_id"] == sid
            assert grant["user_id"] == d.ids["alice"] and grant["mode"] == "workspace"
            assert "rule 1 covers" in grant["grants"] and 'program="git"' in grant["grants"]
            # another user sees none of it and cannot revoke it; an admin sees it
            assert (await bob.request({"type": "grants", "action": "list"}))["grants"] == []
            refused = await bob.request(
                {"type": "grants", "action": "revoke", "grant_id": grant["id"]}
            )
            assert refused["type"] == "error" and "no grant" in refused["message"]
            seen = await root.request({"type": "grants", "action": "list"})
            assert [g["id"] for g in seen["grants"]] == [grant["id"]]
            # granted: the next git call runs unasked; revoked: the one after asks again
            more = {"type": "message", "session_id": sid, "content": "again"}
            await alice.request(more)
            await alice.until_end(sid)
            assert term.ran == ["git status", "git status"]
            revoke = {"type": "grants", "action": "revoke", "grant_id": grant["id"]}
            revoked = await alice.request(revoke)
            assert [g["id"] for g in revoked["grants"]] == [grant["id"]]
            assert (await alice.request({"type": "grants", "action": "list"}))["grants"] == []
            await alice.request(more)
            await _deny_next(alice, sid)  # asked again
            assert term.ran == ["git status", "git status"]


async def test_an_always_grant_is_listed_and_revoked_from_the_store(tmp_path: Path) -> None:
    term = FakeTerminal()
    git = call("terminal", action="run", command="git status")
    with trio.fail_after(TIMEOUT):
        async with (
            _daemon(tmp_path, term, [git, {"text": "one"}], ASK_GIT) as d,
            d.connect("alice") as alice,
        ):
            sid = str((await alice.request({"type": "message", "content": "go"}))["session_id"])
            req = await alice.until_type("approval_request", session_id=sid)
            frame = {"type": "approve", "session_id": sid, "call_id": req["call_id"]}
            await alice.request(frame | {"scope": "always"})
            await alice.until_end(sid)
            (grant,) = (await alice.request({"type": "grants", "action": "list"}))["grants"]
            assert grant["scope"] == "always" and grant["session_id"] == ""
            revoke = {"type": "grants", "action": "revoke", "grant_id": grant["id"]}
            await alice.request(revoke)
            assert await d.harness.runtime.store.kv_list(ALWAYS_SCOPE) == []
            bad = await alice.request({"type": "grants", "action": "revoke", "grant_id": "x"})
            assert bad["type"] == "error" and "grant_id" in bad["message"]
