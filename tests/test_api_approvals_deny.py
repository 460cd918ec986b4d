"""A deny grants nothing, whatever its scope (issue 17 "Missing tests"): a deny with
scope ``session`` or ``always`` fails that one call, and the next matching call of the
session still asks; nothing is kept for the owner either.

Rules: those of tests/test_api_approvals.py (real WebSocket connections on 127.0.0.1,
port 0; an absolute time limit; nothing sleeps), whose daemon and helpers these are.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from test_api_approvals import TIMEOUT, FakeTerminal, _answer, _ask, _daemon, _tool_results

from navi_trio.core.turn.approvals import ALWAYS_SCOPE


@pytest.mark.parametrize("scope", ["session", "always"])
async def test_a_deny_for_the_session_or_always_grants_nothing(tmp_path: Path, scope: str) -> None:
    term = FakeTerminal()
    with trio.fail_after(TIMEOUT):
        async with _daemon(tmp_path, term) as d, d.connect("alice") as c:
            sid, req = await _ask(c)
            ok = await _answer(c, "deny", sid, req["call_id"], scope=scope)
            assert ok["approved"] is False
            await c.until_end(sid)
            # The same call again in the same session: it asks again, it does not run.
            await c.request({"type": "message", "session_id": sid, "content": "again"})
            again = await c.until(
                lambda f: (
                    f.get("session_id") == sid
                    and (f["type"] == "approval_request" or f["type"] == "stream_end")
                )
            )
            assert again["type"] == "approval_request", (again, term.ran)
            assert again["call_id"] != req["call_id"] and again["tool"] == "terminal"
            assert term.ran == []
            await _answer(c, "approve", sid, again["call_id"])
            await c.until_end(sid)
            assert term.ran == ["git push"]
            assert [r["ok"] for r in _tool_results(c, sid)] == [False, True]
            decided = [f for f in c.frames if f["type"] == "approval_decided"]
            assert [(f["approved"], f["by"]) for f in decided] == [
                (False, "owner"), (True, "owner")
            ]  # fmt: skip
            assert await d.harness.runtime.store.kv_list(ALWAYS_SCOPE) == []
