"""Approvals over real WebSocket connections (docs/pages/tools.md, "Safety").

Rules: loopback only, port 0 (tests/api_ws.py); every test has an absolute time limit;
the timeout test runs on the autojump clock under a real-time limit (tests/realtime.py
says why a trio deadline would not do); nothing sleeps for real. The tool under policy
is a stand-in named ``terminal`` that records what it ran and the context it ran with,
so no shell runs here (the sandbox is w-sandbox's and tested there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing
from agent_tools import call, toolset, with_tools
from api_ws import Client, Daemon, open_daemon
from realtime import paced

from navi_trio.core.turn import UserMessage
from navi_trio.core.turn.approvals import ALWAYS_SCOPE
from navi_trio.testing import open_harness
from navi_trio.tools.base import ToolContext, ToolResult

TIMEOUT = 30
ASK_PUSH = {"tool": "terminal", "action": "run", "match": "git push*", "decision": "ask"}


class FakeTerminal:
    """Stands in for terminal: records each command and the context it ran with."""

    name = "terminal"
    description = "runs a command (test stand-in)"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.ctxs: list[ToolContext] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.ran.append(str(args.get("command")))
        self.ctxs.append(ctx)
        return ToolResult.success(f"ran {args.get('command')}")


def _daemon(
    tmp_path: Path,
    term: FakeTerminal,
    *,
    rules: Any = (ASK_PUSH,),
    replies: Any = None,
    policy: dict[str, Any] | None = None,
    **kw: Any,
) -> Any:
    replies = replies or [call("terminal", action="run", command="git push"), {"text": "done"}]
    policy = policy or {"rules": list(rules)}
    return open_daemon(
        tmp_path, replies=replies, loop=True, tools=toolset(term),
        # No plan on a first message: the scripted replies are the run's own.
        profiles={"general": with_tools(["terminal"], policy=policy, planning_first_message=False)},
        **kw,
    )  # fmt: skip


async def _ask(c: Client, text: str = "push it", **fields: Any) -> tuple[str, dict[str, Any]]:
    """Send a message in a new session; its session id and the approval_request."""
    created = await c.request({"type": "message", "content": text, **fields})
    sid = str(created["session_id"])
    request = await c.until_type("approval_request", session_id=sid)
    return sid, request


async def _answer(c: Client, kind: str, sid: str, call_id: str, scope: str = "once") -> Any:
    frame = {"type": kind, "session_id": sid, "call_id": call_id, "scope": scope}
    return await c.request(frame)


def _tool_results(c: Client, sid: str) -> list[dict[str, Any]]:
    return [f for f in c.frames if f["type"] == "tool_result" and f.get("session_id") == sid]


async def test_approve_once_runs_the_call_and_the_next_one_asks_again(tmp_path: Path) -> None:
    term = FakeTerminal()
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term) as d, d.connect("alice") as c:
            sid, req = await _ask(c)
            assert req["tool"] == "terminal" and req["summary"] == "terminal run: git push"
            assert "rule 1" in req["rule"] and "git push*" in req["rule"]
            assert term.ran == []  # it waits
            ok = await _answer(c, "approve", sid, req["call_id"])
            assert ok["type"] == "ok" and ok["approved"] is True, ok
            end = await c.until_end(sid)
            assert end["text"] == "done" and term.ran == ["git push"]
            decided = await c.until_type("approval_decided", session_id=sid)
            assert decided["approved"] is True and decided["by"] == "owner"
            assert [r["ok"] for r in _tool_results(c, sid)] == [True]
            # "once" grants nothing more: the next call asks again.
            await c.send({"type": "message", "session_id": sid, "content": "again"})
            again = await c.until_type("approval_request", session_id=sid)
            await _answer(c, "deny", sid, again["call_id"])
            await c.until_end(sid)
            assert term.ran == ["git push"]


async def test_deny_fails_the_call_and_the_model_goes_on(tmp_path: Path) -> None:
    term = FakeTerminal()
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term) as d, d.connect("alice") as c:
            sid, req = await _ask(c)
            ok = await _answer(c, "deny", sid, req["call_id"])
            assert ok["approved"] is False
            end = await c.until_end(sid)
            assert end["text"] == "done" and end["reason"] == "complete"
            assert term.ran == []
            (result,) = _tool_results(c, sid)
            assert result["ok"] is False and "the user denied it" in result["error"]
            # The model read the refusal and answered after it.
            tool_msgs = [m for m in d.harness.chat_requests[-1]["messages"] if m["role"] == "tool"]
            assert "not run" in tool_msgs[-1]["content"]


async def test_session_scope_grants_the_rule_for_the_rest_of_the_session(
    tmp_path: Path,
) -> None:
    term = FakeTerminal()
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term) as d, d.connect("alice") as c:
            sid, req = await _ask(c)
            await _answer(c, "approve", sid, req["call_id"], scope="session")
            await c.until_end(sid)
            await c.request({"type": "message", "session_id": sid, "content": "again"})
            await c.until_end(sid)
            assert term.ran == ["git push", "git push"]
            assert len([f for f in c.frames if f["type"] == "approval_request"]) == 1
            # Another session of the same owner asks again.
            sid2, _ = await _ask(c, "push elsewhere")
            assert sid2 != sid


async def test_always_is_persisted_and_a_restart_still_allows(tmp_path: Path) -> None:
    term = FakeTerminal()
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term) as d, d.connect("alice") as c:
            alice = d.ids["alice"]
            sid, req = await _ask(c)
            await _answer(c, "approve", sid, req["call_id"], scope="always")
            await c.until_end(sid)
            stored = await d.harness.runtime.store.kv_list(ALWAYS_SCOPE)
            assert [k for k, _ in stored] == [
                f"{alice}|workspace|rule|general|terminal|run|git push*|ask"
            ]
        # A new daemon on the same database: the owner's next such call just runs.
        term2 = FakeTerminal()
        replies = [call("terminal", action="run", command="git push --tags"), {"text": "ok"}]
        policy = {"rules": [ASK_PUSH]}
        async with open_harness(
            tmp_path, replies=replies, loop=True, tools=toolset(term2),
            profiles={"general": with_tools(["terminal"], policy=policy)},
        ) as h:  # fmt: skip
            frames = await h.turn(sid, "push the tags", user_id=alice)
            assert term2.ran == ["git push --tags"]
            assert not [f for f in frames if f["type"] == "approval_request"]
            decided = [f for f in frames if f["type"] == "approval_decided"]
            assert [(f["by"], f["scope"]) for f in decided] == [("grant", "always")]


async def test_no_answer_within_the_timeout_is_a_deny(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The clock is paced (tests/realtime.py): on a threshold of 0 it jumped at every
    pass of the run loop while the store's thread worked, about 20,000 virtual seconds
    had gone by when the approval was asked, and on a slow machine the far deadlines
    (1e5 s) came first and the test hung."""
    term = FakeTerminal()
    async with paced(autojump_clock, TIMEOUT):
        async with _daemon(
            tmp_path, term, approval_timeout_sec=45, first_chunk_timeout=1e5,
            chunk_timeout=1e5, session_idle_sec=1e5, llm_connect_timeout=1e5,
            ws_hello_timeout_sec=1e5, message_accept_timeout_sec=1e5,
        ) as d, d.connect("alice") as c:  # fmt: skip
            sid, req = await _ask(c)
            asked_at = trio.current_time()
            assert asked_at < 1000, asked_at  # far from the far deadlines (1e5 s)
            assert req["timeout_sec"] == 45
            decided = await c.until_type("approval_decided", session_id=sid)
            assert 43 <= trio.current_time() - asked_at <= 46
            assert decided["by"] == "timeout" and decided["approved"] is False
            end = await c.until_end(sid)
            assert end["text"] == "done" and term.ran == []
            (result,) = _tool_results(c, sid)
            assert "no answer within 45 s" in result["error"]
            assert d.harness.runtime.approvals.pending(sid) == []


async def test_stop_while_waiting_ends_the_run_at_once(tmp_path: Path) -> None:
    term = FakeTerminal()
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term) as d, d.connect("alice") as c:
            sid, req = await _ask(c)
            assert d.harness.runtime.approvals.pending(sid) == [req["call_id"]]  # waiting
            ok = await c.request({"type": "stop", "session_id": sid})
            assert ok["stopped"] is True
            end = await c.until_end(sid)
            assert end["reason"] == "stopped" and term.ran == []
            (result,) = _tool_results(c, sid)
            assert result["error"] == "stopped by the user"
            assert d.harness.runtime.approvals.pending(sid) == []
            late = await _answer(c, "approve", sid, req["call_id"])
            assert late["type"] == "error" and late["code"] == "not_found", late


async def test_only_the_owner_answers(tmp_path: Path) -> None:
    term = FakeTerminal()
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term) as d, d.connect("alice") as alice:
            sid, req = await _ask(alice)
            for who in ("bob", "root"):  # another user, and an admin who is not the owner
                async with d.connect(who) as other:
                    err = await _answer(other, "approve", sid, req["call_id"], "always")
                    assert err["type"] == "error" and err["code"] == "forbidden", (who, err)
            assert term.ran == [] and d.harness.runtime.approvals.pending(sid) == [req["call_id"]]
            assert await d.harness.runtime.store.kv_list(ALWAYS_SCOPE) == []
            # The owner on another connection: subscribing shows what waits, and answers.
            async with d.connect("alice") as again:
                ok = await again.request({"type": "subscribe", "session_id": sid})
                assert [a["call_id"] for a in ok["approvals"]] == [req["call_id"]]
                assert ok["approvals"][0]["summary"] == "terminal run: git push"
                await _answer(again, "approve", sid, req["call_id"])
            await alice.until_end(sid)
            assert term.ran == ["git push"]


async def test_headless_rule_applies_when_no_client_is_attached(tmp_path: Path) -> None:
    term = FakeTerminal()
    replies = [
        call("terminal", action="run", command="git push"),
        call("terminal", action="run", command="git status"),
        {"text": "done"},
    ]
    policy = {
        "rules": [{"tool": "terminal", "action": "run", "match": "git *", "decision": "ask"}],
        "headless_allow": [{"tool": "terminal", "match": "git status*"}],
    }
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term, policy=policy, replies=replies) as d:
            rt = d.harness.runtime
            await rt.store.create_session(
                "s-headless", profile_id="general", user_id=d.ids["alice"]
            )
            # Not the session's first message: no planning call takes the scripted replies.
            earlier = {"role": "user", "content": "earlier"}
            await rt.store.append("s-headless", messages=[earlier], context=[earlier])
            actor = await rt.sessions.get("s-headless")
            # Nobody subscribed: nobody could answer.
            actor.send_message(UserMessage("tidy up", user_id=d.ids["alice"]))
            await actor.idle.wait()
            assert term.ran == ["git status"]
            tools = [m for m in await rt.store.load_messages("s-headless") if m["role"] == "tool"]
            assert "headless rule" in tools[0]["content"] and not tools[0]["ok"]
            assert tools[1]["ok"]


async def test_a_background_call_is_approved_before_it_detaches(tmp_path: Path) -> None:
    term = FakeTerminal()
    replies = [call("terminal", action="run", command="git push", background=True), {"text": "ok"}]
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term, replies=replies) as d, d.connect("alice") as c:
            sid, req = await _ask(c)
            sup = d.harness.runtime.supervisor
            assert sup.list_jobs(sid) == []  # nothing detached yet
            await _answer(c, "approve", sid, req["call_id"])
            await c.until_end(sid)
            (result,) = _tool_results(c, sid)
            assert result["ok"] and "task_id" in result["output"]
            assert [j.tool for j in sup.list_jobs(sid)] == ["terminal"]


# -- modes -------------------------------------------------------------------------------


async def _mode_of_run(
    d: Daemon, user: str, term: FakeTerminal, **fields: Any
) -> tuple[ToolContext, bool]:
    """The context the run's tool call ran with, and whether it asked first."""
    async with d.connect(user) as c:
        created = await c.request({"type": "message", "content": "go", **fields})
        sid = str(created["session_id"])
        got = await c.until(
            lambda f: (
                f.get("session_id") == sid
                and (f["type"] == "approval_request" or f["type"] == "stream_end")
            )
        )
        if got["type"] == "approval_request":
            await _answer(c, "approve", sid, got["call_id"])
            await c.until_end(sid)
    return term.ctxs[-1], got["type"] == "approval_request"


async def test_a_user_role_token_cannot_reach_full(tmp_path: Path) -> None:
    term = FakeTerminal()
    replies = [call("terminal", action="run", command="make"), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term, rules=(), replies=replies) as d:
            ctx, asked = await _mode_of_run(d, "alice", term, mode="full")
            assert ctx.mode == "workspace" and ctx.sandbox is not None and not asked
            assert ctx.sandbox.network is False and ctx.session_dir in ctx.sandbox.writable
            ctx, asked = await _mode_of_run(d, "alice", term, mode="read-only")
            assert ctx.mode == "read-only" and ctx.sandbox is not None and not asked
            assert ctx.sandbox.writable == ()
            ctx, asked = await _mode_of_run(d, "root", term)
            assert ctx.mode == "workspace" and not asked  # the admin's default too
            ctx, asked = await _mode_of_run(d, "root", term, mode="full")
            assert ctx.mode == "full" and ctx.sandbox is None and asked


async def test_an_admins_run_in_another_users_session_never_runs_in_full(
    tmp_path: Path,
) -> None:
    # The config gives admins full by default; a fork keeps its source's mode: neither
    # takes an admin's run in a user's session out of the sandbox (the user wrote that
    # session's context), and asking for full there is refused.
    term = FakeTerminal()
    replies = [call("terminal", action="run", command="make"), {"text": "done"}]
    policy = {"modes": {"admin": "full"}}
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term, policy=policy, replies=replies) as d:
            ctx, _ = await _mode_of_run(d, "alice", term)
            sid = ctx.session_id
            store = d.harness.runtime.store
            await store.update_session(sid, meta={"mode": "full"})  # as a fork keeps it
            async with d.connect("root") as root:
                refused = await root.request(
                    {"type": "message", "content": "go", "session_id": sid, "mode": "full"}
                )
                assert (refused["type"], refused["code"]) == ("error", "forbidden"), refused
                assert "a session of your own" in refused["message"]
                ok = await root.request({"type": "message", "content": "go", "session_id": sid})
                assert ok["type"] == "ok", ok
                got = await root.until(
                    lambda f: (
                        f.get("session_id") == sid
                        and f["type"] in ("approval_request", "stream_end")
                    )
                )
                assert got["type"] == "stream_end", got  # sandboxed: make did not ask
            assert (term.ctxs[-1].mode, term.ctxs[-1].session_id) == ("workspace", sid)
            assert term.ctxs[-1].sandbox is not None
            ctx, asked = await _mode_of_run(d, "root", term)  # in a session of root's own
            assert ctx.mode == "full" and ctx.sandbox is None and asked


async def test_a_user_cannot_leave_a_read_only_mode_configured_for_users(
    tmp_path: Path,
) -> None:
    term = FakeTerminal()
    replies = [call("terminal", action="run", command="make"), {"text": "done"}]
    policy = {"modes": {"user": "read-only"}}
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term, policy=policy, replies=replies) as d:
            for asked_for in (None, "workspace", "full"):
                fields = {} if asked_for is None else {"mode": asked_for}
                ctx, _ = await _mode_of_run(d, "alice", term, **fields)
                assert ctx.mode == "read-only", asked_for


async def test_a_network_rule_opens_the_sandbox_network_for_its_calls_only(
    tmp_path: Path,
) -> None:
    term = FakeTerminal()
    replies = [
        call("terminal", action="run", command="curl https://example.org"),
        call("terminal", action="run", command="make"),
        {"text": "done"},
    ]
    rule = {"tool": "terminal", "match": "curl *", "decision": "ask", "network": True}
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term, rules=[rule], replies=replies) as d:
            ctx, asked = await _mode_of_run(d, "alice", term)
            assert asked and term.ran == ["curl https://example.org", "make"]
            curl, make = term.ctxs
            assert curl.sandbox is not None and curl.sandbox.network is True
            assert make.sandbox is not None and make.sandbox.network is False


async def test_a_subagent_runs_in_its_parents_mode(tmp_path: Path) -> None:
    from navi_trio.tools.spawn_agent import SpawnAgentTool

    term = FakeTerminal()
    replies = [
        call("spawn_agent", task="build it"),
        call("terminal", action="run", command="make"),  # the sub-agent's call
        {"text": "sub done"},
        {"text": "done"},
    ]
    profile = {
        "tools": {"agent": ["spawn_agent"], "subagent": ["terminal"]},
        "planning_first_message": False,
    }
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, tools=toolset(term, SpawnAgentTool()),
            profiles={"general": profile},
        ) as h:  # fmt: skip
            await h.turn("s-sub", "delegate", mode="read-only")
            (ctx,) = term.ctxs
            assert ctx.is_subagent and ctx.mode == "read-only"
            assert ctx.sandbox is not None and ctx.sandbox.writable == ()
