"""`navi mcp serve`'s ``rewind`` and ``fork`` tools, driven by the MCP SDK's stdio client.

A session made by real runs (the fake LLM over HTTP, real files under tmp_path) is then
listed, previewed (nothing changes), rewound with the preview's token, undone, and
forked through the tools of a `navi mcp serve` process working on the same database (no
daemon: its runtime in its own process). The tools need no LLM; one is named, so
nothing depends on an Ollama or the local model being on this machine.

Rules: see tests/test_mcp_serve.py (real processes, an absolute deadline, no sleeps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from rewind_kit import PROFILES, TIMEOUT, calls, say, turn, write
from test_mcp_serve import mcp_serve

from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import open_harness

pytestmark = pytest.mark.slow


async def call(client: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    structured: dict[str, Any] = result.structured_content
    return structured


def no_llm(env: dict[str, str]) -> dict[str, str]:
    """`env` with an LLM named that nobody asks: rewind and fork need none, and naming
    one keeps `navi mcp serve` from looking for Ollama or the local model on this machine."""
    return {**env, "NAVI_LLM_BACKEND": "ollama", "OLLAMA_HOST": "http://127.0.0.1:9"}


async def test_the_rewind_tool_lists_previews_applies_and_undoes_and_fork_makes_a_session(
    env: dict[str, str], tmp_path: Path
) -> None:
    work = (tmp_path / "work").resolve()
    work.mkdir()
    (work / "a.txt").write_text("v0\n")
    replies = [calls(write("a.txt", "v1\n")), say("one"), calls(write("a.txt", "v2\n")), say("2")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=replies, profiles=PROFILES) as h:
            await turn(h, "s-mcp", "first", cwd=work, user_role="admin")
            await turn(h, "s-mcp", "second", cwd=work, user_role="admin")
        async with mcp_serve(no_llm(env), tmp_path) as client:
            listed = await call(client, "rewind", session_id="s-mcp")
            assert listed["action"] == "list" and "second" in listed["summary"]
            preview = await call(client, "rewind", session_id="s-mcp", to="-1")
            assert preview["action"] == "preview" and preview["token"]
            assert "a.txt" in preview["summary"] and (work / "a.txt").read_text() == "v2\n"
            done = await call(
                client, "rewind", session_id="s-mcp", to="-1", confirm=preview["token"]
            )
            assert done["action"] == "done" and done["undo"]
            assert (work / "a.txt").read_text() == "v1\n"
            wrong = await client.call_tool(
                "rewind", {"session_id": "s-mcp", "to": "-1", "confirm": preview["token"]}
            )
            assert wrong.is_error  # the session moved on: the old preview is refused
            back = await call(client, "rewind", session_id="s-mcp", branch=done["undo"])
            await call(
                client, "rewind", session_id="s-mcp", branch=done["undo"], confirm=back["token"]
            )
            assert (work / "a.txt").read_text() == "v2\n"
            made = await call(client, "fork", session_id="s-mcp", at="2", files=True)
            assert made["messages"] == 4 and made["folder"]
            assert (Path(made["folder"]) / "a.txt").read_text() == "v1\n"
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        users = [m["content"] for m in await store.load_messages("s-mcp") if m["role"] == "user"]
        assert users == ["first", "second"]
        assert (await store.get_session(made["new_session_id"])) is not None
