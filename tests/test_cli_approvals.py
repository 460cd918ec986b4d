"""`navi run` and approvals: in `full` mode a terminal call asks (docs/pages/tools.md,
"Safety"); with no terminal to ask on, `navi run` denies it at once with a line saying so, the model
reads the denial and goes on; `--mode` is refused when unknown.

Rules: see tests/test_cli.py (real processes, forked from the warm fork server).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_cli import fake_llm, forked, messages

pytestmark = pytest.mark.slow  # its tests start processes


async def test_without_a_terminal_a_call_that_asks_is_denied_and_the_run_goes_on(
    env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    call = {"name": "terminal", "arguments": {"action": "run", "command": f"touch {marker}"}}
    replies: list[dict[str, Any]] = [
        {"text": "", "tool_calls": [call]},
        {"text": "It was denied, so I stop."},
    ]
    async with fake_llm(tmp_path, replies) as url:
        done = await forked("run", "--session", "s-ask", "--llm-url", url, "--mode", "full",
                            "hi", env=env, cwd=tmp_path)  # fmt: skip
    assert done.code == 0, done.err
    assert done.out.strip() == "It was denied, so I stop."
    assert "navi: denied terminal" in done.err and "no terminal to ask" in done.err
    assert not marker.exists()
    saved = await messages(tmp_path / "navi.db", "s-ask")
    tool = next(m for m in saved if m["role"] == "tool")
    assert "denied" in tool["content"].lower()


async def test_an_unknown_mode_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    done = await forked("run", "--mode", "godmode", "hi", env=env, cwd=tmp_path)
    assert done.code == 1 and "--mode" in done.err and "godmode" in done.err
