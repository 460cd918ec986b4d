"""One owner per session and the run log (issue 8: "One path", "Logs").

The session actor is the one place a session's turns run: it takes the lease (another
process's run is refused with session_busy), switches an existing session's profile
when a message names another one, and logs one INFO line per run start / end (reason,
duration), per tool call (name, ok, duration) and per error, with session and user.
SessionState has no lock of its own any more: the actor serialises.

Rules: see tests/test_agent_basic.py (real HTTP to the fake LLM, real SQLite file).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from agent_tools import EchoTool, call, seed, toolset, with_tools

from navi_trio.core.turn import SessionLeases
from navi_trio.core.turn.session_state import SessionState
from navi_trio.testing import Harness, open_harness

TIMEOUT = 30
LOGGER = "navi_trio.core.session.session_actor"


async def alice(h: Harness) -> dict[str, Any]:
    """A message's sender fields for the stored user alice."""
    uid = await h.user("alice")
    return {"user_id": uid, "user_info": {"id": uid, "name": "alice", "role": "user"}}


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def _harness(tmp_path: Path, replies: list[dict[str, object]]) -> object:
    return open_harness(
        tmp_path, replies=replies, tools=toolset(EchoTool()),
        profiles={"general": with_tools(["echo"]), "coder": with_tools(["echo"])},
    )  # fmt: skip


async def test_a_run_logs_its_start_tool_calls_errors_and_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    replies = [call("echo", text="x"), call("nope"), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with _harness(tmp_path, replies) as h:  # type: ignore[attr-defined]
            await seed(h)
            sender = await alice(h)
            frames = await h.turn("s1", "go", **sender)
            assert frames[-1]["reason"] == "complete"
            # An unknown profile is refused by the actor: an error line and the end.
            frames = await h.turn("s1", "again", profile_id="no-such", **sender)
            assert frames[-1]["reason"] == "error"
    lines = _lines(caplog)
    assert lines[0] == "session s1: run started (user alice)"
    assert any(ln.startswith("session s1: tool echo ok in ") and ln.endswith("(user alice)")
               for ln in lines), lines  # fmt: skip
    assert any(ln.startswith("session s1: tool nope failed in ") for ln in lines), lines
    ends = [ln for ln in lines if "run ended" in ln]
    assert len(ends) == 2, lines
    assert ends[0].startswith("session s1: run ended: complete in ") and "alice" in ends[0]
    assert ends[1].startswith("session s1: run ended: error in ")
    errors = [ln for ln in lines if ": error [" in ln]
    assert len(errors) == 1 and "unknown profile 'no-such'" in errors[0], lines
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == LOGGER)


async def test_a_message_with_another_profile_switches_an_existing_session(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with _harness(tmp_path, [{"text": "one"}, {"text": "two"}]) as h:  # type: ignore[attr-defined]
            await seed(h, profile_id="general")
            await h.turn("s1", "hi", profile_id="coder")
            row = await h.runtime.store.get_session("s1")
            assert row.profile_id == "coder"
            await h.turn("s1", "and on")  # no profile: the session keeps coder
            assert (await h.runtime.store.get_session("s1")).profile_id == "coder"


async def test_the_actor_refuses_a_session_another_process_runs(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with _harness(tmp_path, [{"text": "never"}]) as h:  # type: ignore[attr-defined]
            await seed(h)
            other = SessionLeases(h.runtime.store)  # another owner: "another process"
            async with other.hold("s1"):
                frames = await h.turn("s1", "hi")
            errors = [f for f in frames if f["type"] == "error"]
            assert [e["code"] for e in errors] == ["session_busy"]
            assert frames[-1]["type"] == "stream_end" and frames[-1]["reason"] == "error"
            assert h.chat_requests == []
            frames = await h.turn("s1", "now")  # released: the session runs again
            assert frames[-1]["text"] == "never"


def test_session_state_has_no_second_lock() -> None:
    # One owner per session (the actor; across processes the lease): no lock here.
    assert "lock" not in {f.name for f in attrs.fields(SessionState)}
