"""The agent takes the session lease around every run: a second runtime on the same
database (as a second process would) gets `session_busy`, and the first run's history
is never interleaved with the refused message.

Rules: the fake LLM on 127.0.0.1 (port 0), the store a real SQLite file in tmp_path,
an absolute timeout on each test, no sleeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from navi_trio.store.base import LeaseRow
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import open_harness

TIMEOUT = 30


async def test_a_second_runtime_gets_session_busy_while_the_first_runs(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "first answer", "stall": True}]) as a:
            first = await a.session("s1")
            first.send("hi")
            await first.until_type("text_delta")  # the run is live and holds the lease
            async with open_harness(tmp_path, replies=[{"text": "never"}]) as b:
                frames = await b.turn("s1", "me too")
                assert b.chat_requests == []
            errors = [f for f in frames if f["type"] == "error"]
            assert len(errors) == 1 and errors[0]["code"] == "session_busy"
            assert "'s1' is busy" in errors[0]["message"]
            assert "this process" in errors[0]["message"]
            assert frames[-1]["type"] == "stream_end" and frames[-1]["reason"] == "error"
            first.stop()
            await first.until_end()
            # Released at the end of the run: now the other runtime may run it.
            async with open_harness(tmp_path, replies=[{"text": "second answer"}]) as b:
                frames = await b.turn("s1", "now")
                assert frames[-1]["reason"] == "complete"
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            saved = await store.load_messages("s1")
    assert [(m["role"], m["content"]) for m in saved] == [
        ("user", "hi"), ("assistant", "first answer"),
        ("user", "now"), ("assistant", "second answer"),
    ]  # fmt: skip


async def test_a_run_through_the_session_actor_claims_the_lease_once(tmp_path: Path) -> None:
    # The lease is taken in one place (the agent's run), not again by the actor around it.
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "one"}, {"text": "two"}]) as h:
            store = h.runtime.store
            claim_lease = store.claim_lease
            claims: list[str] = []

            async def counted(session_id: str, **kw: Any) -> LeaseRow:
                claims.append(session_id)
                return await claim_lease(session_id, **kw)

            store.claim_lease = counted  # type: ignore[method-assign]
            assert (await h.turn("s1", "hi"))[-1]["reason"] == "complete"
            assert claims == ["s1"]
            assert (await h.turn("s1", "again"))[-1]["reason"] == "complete"
            assert claims == ["s1", "s1"]
