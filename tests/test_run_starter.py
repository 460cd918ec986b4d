"""A run belongs to whoever started it (docs/pages/tools.md, "Safety"): its approvals, steering and
interrupts are theirs, and a grant covers the grantor in the mode it was given in.

An admin's run in a user's session: the user sees its approval request but cannot answer
it, steer her text into it or interrupt it; the admin answers. An admin may not run in
``full`` mode (no sandbox) in a session they do not own: its owner's text would be that
run's context. An admin's ``always`` given in ``workspace`` does not cover ``full``.

A real `navi serve` on SQLite on 127.0.0.1 port 0, users made with `navi users add`,
their tokens on real WebSocket clients, the fake LLM over real HTTP, the real terminal
tool under a rule that asks. Every wait is for a frame, under an absolute limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import call
from api_ws import Client
from daemons import add_user, connect_as, no_plan_config
from reliability import clean_env, navi_serve

from navi_trio.testing import open_fake_llm

pytestmark = pytest.mark.slow
LIMIT = 120  # real seconds: a daemon and CLI processes on 2 busy cores
ASK_ECHO = {"tool": "terminal", "action": "run", "match": "echo *", "decision": "ask"}


async def sent(c: Client, content: str, **fields: Any) -> dict[str, Any]:
    """A message's reply (past a new session's `session` frame)."""
    reply = await c.request({"type": "message", "content": content, **fields})
    if reply["type"] == "session":
        reply = await c.until(lambda f: f.get("id") == reply["id"] and f["type"] != "session")
    return reply


async def answered(c: Client, sid: str, call_id: str, scope: str = "once") -> dict[str, Any]:
    return await c.request(
        {"type": "approve", "session_id": sid, "call_id": call_id, "scope": scope}
    )


def refused(reply: dict[str, Any], *words: str) -> None:
    assert (reply["type"], reply.get("code")) == ("error", "forbidden"), reply
    assert all(w in reply["message"] for w in words), reply


async def test_an_admins_run_in_a_users_session_is_the_admins_alone(tmp_path: Path) -> None:
    replies = [
        {"text": "hi alice"},  # alice's own turn
        call("terminal", action="run", command="echo from root"),  # root's, in alice's
        {"text": "root's run done"},
        call("terminal", action="run", command="echo in workspace"),  # root's, his own
        {"text": "granted"},
        call("terminal", action="run", command="echo in full"),  # root's own, full
        {"text": "asked again"},
    ]
    config = no_plan_config(tmp_path, policy={"rules": [ASK_ECHO]})
    env = clean_env(tmp_path, NAVI_CONFIG=str(config))
    with trio.fail_after(LIMIT):
        async with (
            open_fake_llm(replies) as llm,
            navi_serve(env, llm.url, tmp_path / "daemon.log") as daemon,
        ):
            tokens = {"alice": await add_user(env, "alice"),
                      "root": await add_user(env, "root", "admin")}  # fmt: skip
            async with (
                connect_as(daemon.url, tokens["alice"]) as alice,
                connect_as(daemon.url, tokens["root"]) as root,
            ):
                ok = await sent(alice, "hello")
                sid = ok["session_id"]
                await alice.until_end(sid)
                # No unsandboxed run in her session: refused before anything is stored.
                full = await sent(root, "read her files", session_id=sid, mode="full")
                refused(full, "mode full", "a session of your own")
                # A workspace run of root's in her session: its approval is root's.
                ok = await sent(root, "echo something", session_id=sid)
                assert ok["type"] == "ok", ok
                asked = await alice.until_type("approval_request", session_id=sid)
                cid = asked["call_id"]
                refused(await answered(alice, sid, cid, "always"), "only the owner of this run")
                for on_busy in ("steer", "interrupt"):
                    steer = await sent(alice, "print the token", session_id=sid, on_busy=on_busy)
                    refused(steer, "started by another user", f"only they may {on_busy}")
                ok = await answered(root, sid, cid)
                assert (ok["type"], ok["approved"]) == ("ok", True), ok
                end = await root.until_end(sid)
                assert (end["reason"], end["text"]) == ("complete", "root's run done"), end
                history = await alice.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
                said = [m["content"] for m in history["messages"] if m["role"] == "user"]
                assert said == ["hello", "echo something"], said  # none of hers joined
                # root's own session: an always grant in workspace...
                ok = await sent(root, "echo here")
                own = ok["session_id"]
                asked = await root.until_type("approval_request", session_id=own)
                assert asked["mode"] == "workspace", asked
                ok = await answered(root, own, asked["call_id"], "always")
                assert ok["type"] == "ok", ok
                assert (await root.until_end(own))["text"] == "granted"
                # ...does not cover a run in full: it asks again.
                ok = await sent(root, "echo there", session_id=own, mode="full")
                assert ok["type"] == "ok", ok
                again = await root.until(
                    lambda f: (
                        f.get("session_id") == own
                        and f["type"] in ("approval_request", "approval_decided")
                        and f.get("call_id") != asked["call_id"]
                    )
                )
                assert (again["type"], again.get("mode")) == ("approval_request", "full"), again
                await answered(root, own, again["call_id"])
                assert (await root.until_end(own))["text"] == "asked again"
    assert len(llm.chat_requests) == len(replies)
