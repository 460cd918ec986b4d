"""A peer `ask` whose `timeout` is above the peer's `timeout_sec` waits `timeout_sec`
at most (issue 17 "Missing tests"): the model cannot make a call wait longer than the
config allows.

Rules: those of tests/test_peer.py, whose two daemons and helpers these are (real
WebSocket connections on 127.0.0.1, B's fake LLM stalling mid-stream). The MockClock
moves by hand once B is stuck; as a safety net only, 10 idle real seconds let it jump,
so a timeout that is not capped fails on the result's text instead of hanging.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing
from test_peer import TOKEN_ENV, ask, b_session, daemon_a, ended, peer_b, results, start, to_b

from navi_trio.testing.harness import SessionDriver

CAP = 5  # the peer's timeout_sec


def _arrived(driver: SessionDriver) -> list[dict[str, Any]]:
    """The frames that have arrived so far, without waiting."""
    while True:
        try:
            driver.frames.append(driver.subscription.frames.receive_nowait())
        except trio.WouldBlock:
            return list(driver.frames)


async def test_an_ask_timeout_above_the_peers_timeout_sec_is_capped_to_it(
    tmp_path: Path, monkeypatch: Any, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 10.0
    b_replies = [{"text": "stuck here", "stall": True}]
    a_replies = [ask("q", timeout=100), {"text": "gave up"}]
    with trio.fail_after(3600):
        async with (
            peer_b(tmp_path, b_replies) as b,
            daemon_a(tmp_path, a_replies, to_b(b, timeout_sec=CAP)) as a,
        ):
            monkeypatch.setenv(TOKEN_ENV, b.tokens["alice"])
            driver = await start(a)
            await driver.until(
                lambda f: f["type"] == "tool_event" and "stuck" in f["data"].get("text", "")
            )
            mock_clock.jump(CAP - 0.5)
            await trio.testing.wait_all_tasks_blocked()
            assert results(_arrived(driver)) == []  # still waiting, as it may
            mock_clock.jump(1)
            (result,) = results(await driver.until_end())
            assert result["ok"] is False
            assert f"no answer from peer 'b' ({b.url}) within {CAP} s" in result["error"]
            assert "its run was stopped" in result["error"]
            assert (await ended(b, await b_session(b)))["reason"] == "stopped"
