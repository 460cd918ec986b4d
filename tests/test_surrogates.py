"""A lone surrogate (``"\\ud800"``: valid JSON, not valid text) never poisons a session.

Where text enters navi it is refused or made clean before anything is stored: a client
frame is refused (bad_frame, naming the field), an LLM delta or tool-call argument and a
tool's result carry U+FFFD instead. A session an older version stored with one loads
with U+FFFD, over the wire and in `navi sessions history`, and goes on.

Rules: the LLM is the fake server over real HTTP, the store a real SQLite file (the old
row is written into it with sqlite3 directly), the daemon real WebSocket connections on
127.0.0.1; every test under an absolute `trio.fail_after`.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import EchoTool, call, of_type, toolset, with_tools
from api_ws import open_daemon
from store_backends import Backend
from test_cli import navi

from navi_trio.api.protocol import parse_frame
from navi_trio.errors import ProtocolError
from navi_trio.testing import open_harness
from navi_trio.text import clean_json, clean_text, has_lone_surrogate
from navi_trio.tools.base import ToolContext, ToolResult

TIMEOUT = 30
LONE = "\ud800"
FFFD = "\ufffd"


def _clean(value: Any) -> bool:
    return clean_json(value) is value


def _stored_rows(db: Path) -> list[Any]:
    """Every message and context row of the database, parsed as it is on disk."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT data FROM messages UNION ALL SELECT data FROM context")
        return [json.loads(r[0]) for r in rows.fetchall()]


# -- the helper ------------------------------------------------------------------------


def test_clean_text_replaces_lone_surrogates_and_keeps_pairs_and_clean_text() -> None:
    text = "ok é 🌍"
    assert clean_text(text) is text and not has_lone_surrogate(text)
    assert clean_text("a\ud800b\udfffc") == f"a{FFFD}b{FFFD}c"
    assert clean_text("\ud83d\ude00 \ud83d") == f"😀 {FFFD}"  # a pair kept apart is joined
    value = {"k": ["x", {"y": 1}], "n": None}
    assert clean_json(value) is value
    assert clean_json({"k\udc00": [1, "a\ud800"]}) == {f"k{FFFD}": [1, f"a{FFFD}"]}


# -- the wire ----------------------------------------------------------------------------


def test_a_frame_with_a_lone_surrogate_is_refused_naming_the_field() -> None:
    for raw, field in [
        ('{"type":"message","content":"\\ud800","session_id":"alice.S"}', "content"),
        ('{"type":"message","content":"hi","profile":"a\\uDFFFb"}', "profile"),
        ('{"type":"hello","token":"\\udc00"}', "token"),
        ('{"type":"sessions","action":"list","id":"\\ud800"}', "id"),
    ]:
        with pytest.raises(ProtocolError, match=f"field '{field}' holds a lone surrogate"):
            parse_frame(raw, 1 << 20)
    # A pair written as two escapes is one character: accepted.
    _, command = parse_frame('{"type":"message","content":"\\ud83d\\ude00"}', 1 << 20)
    assert command.content == "😀"  # type: ignore[union-attr]


async def test_a_message_with_a_lone_surrogate_stores_nothing_and_the_session_goes_on(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[{"text": "Hello"}], loop=True) as d:
            async with d.connect("alice") as c:
                await c.send('{"type":"message","content":"\\ud800","session_id":"alice.S","id":1}')
                err = await c.until(lambda f: f.get("id") == 1)
                assert (err["type"], err["code"]) == ("error", "bad_frame"), err
                assert "field 'content'" in err["message"]
                assert await d.harness.runtime.store.get_session("alice.S") is None
                ok = await c.request({"type": "message", "content": "hi", "session_id": "alice.S"})
                assert ok["type"] == "session", ok
                assert (await c.until_end("alice.S"))["text"] == "Hello"
                again = await c.request(
                    {"type": "message", "content": "more", "session_id": "alice.S"}
                )
                assert again["type"] == "ok", again
                await c.until_end("alice.S")
            assert all(_clean(row) for row in _stored_rows(tmp_path / "navi.db"))


# -- the LLM -----------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
async def test_a_lone_surrogate_from_the_llm_is_stored_as_ufffd(
    tmp_path: Path, dialect: str
) -> None:
    replies = [
        {"thinking": f"hm{LONE}", **call("echo", text=f"x{LONE}y")},
        {"text": f"bad{LONE}text"},
        {"text": "fine"},
    ]
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, dialect=dialect, tools=toolset(EchoTool()),
            profiles={"general": with_tools(["echo"])},
        ) as h:  # fmt: skip
            frames = await h.turn("s1", "hi")
            assert all(_clean(f) for f in frames), [f for f in frames if not _clean(f)]
            started = of_type(frames, "tool_started")
            assert started[0]["arguments"] == {"text": f"x{FFFD}y"}
            assert frames[-1]["text"] == f"bad{FFFD}text"
            stored = _stored_rows(tmp_path / "navi.db")
            assert all(_clean(row) for row in stored), stored
            assert any(m.get("content") == f"bad{FFFD}text" for m in stored)
            # The next turn goes to the LLM as usual.
            assert (await h.turn("s1", "and now?"))[-1]["text"] == "fine"
            assert f"bad{FFFD}text" in json.dumps(h.chat_requests[-1], ensure_ascii=False)


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
async def test_a_lone_surrogate_that_bypassed_the_wire_still_reaches_the_llm(
    tmp_path: Path, dialect: str
) -> None:
    # `navi run` reads its message from argv, where Python decodes bytes that are not
    # UTF-8 as lone surrogates: the request body carries U+FFFD, the turn goes on.
    with trio.fail_after(TIMEOUT):
        replies = [{"text": "DIRECT"}, {"text": "ok"}]  # a planning phase, then the answer
        async with open_harness(tmp_path, replies=replies, dialect=dialect) as h:
            frames = await h.turn("s1", "caf\udce9")
            assert frames[-1]["type"] == "stream_end" and frames[-1]["text"] == "ok", frames
            sent = [m["content"] for m in h.chat_requests[-1]["messages"] if m["role"] == "user"]
            assert f"caf{FFFD}" in sent, sent


# -- tools -------------------------------------------------------------------------------


class OddTool:
    """Returns text with lone surrogates, as an MCP or peer server or a file may."""

    name = "odd"
    description = "returns odd text"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.success(f"out{LONE}put", detail=f"d{LONE}")


def test_a_tool_result_never_holds_a_lone_surrogate() -> None:
    result = ToolResult.fail(f"e{LONE}", output=f"o{LONE}", extra=[f"x{LONE}"])
    assert (result.error, result.output) == (f"e{FFFD}", f"o{FFFD}")
    assert result.data == {"extra": [f"x{FFFD}"]}
    assert result.content() == f"Error: e{FFFD}\no{FFFD}"


async def test_a_tool_returning_a_lone_surrogate_is_stored_as_ufffd(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[call("odd"), {"text": "done"}], tools=toolset(OddTool()),
            profiles={"general": with_tools(["odd"])},
        ) as h:  # fmt: skip
            frames = await h.turn("s1", "hi")
            result = of_type(frames, "tool_result")[0]
            assert result["output"] == f"out{FFFD}put", result
            stored = _stored_rows(tmp_path / "navi.db")
            assert all(_clean(row) for row in stored), stored
            assert [m["content"] for m in stored if m.get("role") == "tool"] == [
                f"out{FFFD}put"
            ] * 2  # messages and context


# -- a session an older version stored with one ------------------------------------------


def _poison_first_row(db: Path, session_id: str) -> None:
    """What an older version wrote: the message JSON (ASCII, so the surrogate is a
    \\ud800 escape) of a user message that came with one."""
    bad = json.dumps({"role": "user", "content": f"old{LONE}text"})
    assert "\\ud800" in bad
    with sqlite3.connect(db) as conn:
        for table in ("messages", "context"):
            conn.execute(
                f"UPDATE {table} SET data = ? WHERE session_id = ? AND position ="
                f" (SELECT MIN(position) FROM {table} WHERE session_id = ?)",
                [bad, session_id, session_id],
            )


@pytest.mark.slow
async def test_a_session_stored_with_a_lone_surrogate_loads_and_goes_on(
    tmp_path: Path,
    env: dict[str, str],
) -> None:
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT * 2):
        async with open_daemon(tmp_path, replies=[{"text": "Hello"}], loop=True) as d:
            store = d.harness.runtime.store
            await store.create_session("alice.S", profile_id="general", user_id=d.ids["alice"])
            first = {"role": "user", "content": "old text"}
            answer = {"role": "assistant", "content": "an answer"}
            await store.append("alice.S", messages=[first, answer], context=[first, answer])
            _poison_first_row(db, "alice.S")
            assert (await store.load_messages("alice.S"))[0]["content"] == f"old{FFFD}text"
            loaded = await store.load_session("alice.S")
            assert loaded is not None and loaded.context[0]["content"] == f"old{FFFD}text"
            async with d.connect("alice") as c:
                history = await c.request({"type": "sessions", "action": "history",
                                           "session_id": "alice.S"})  # fmt: skip
                assert history["messages"][0]["content"] == f"old{FFFD}text", history
                ok = await c.request(
                    {"type": "message", "content": "next", "session_id": "alice.S"}
                )
                assert ok["type"] == "ok", ok
                assert (await c.until_end("alice.S"))["text"] == "Hello"
                sent = json.dumps(d.harness.chat_requests[-1], ensure_ascii=False)
                assert f"old{FFFD}text" in sent
            done = await navi("sessions", "history", "alice.S", "--url", d.url,
                              "--token", d.tokens["alice"], env=env, cwd=tmp_path)  # fmt: skip
            assert done.code == 0, done
            assert f"user: old{FFFD}text" in done.out and "Traceback" not in done.err, done


@pytest.mark.slow
async def test_a_stored_row_with_an_upper_case_surrogate_escape_loads_as_ufffd(
    backend: Backend,
) -> None:
    """JSON may write the escape in upper case (``\\uD800``), as other writers of the
    database do: every way a row is read back still cleans it."""
    bad = '{"role":"user","content":"old\\uD800text"}'
    assert json.loads(bad)["content"] == f"old{LONE}text"  # valid JSON, not text
    with trio.fail_after(TIMEOUT):
        async with backend.open() as store:
            sid = (await store.create_session(profile_id="p")).id
            first = {"role": "user", "content": "old text"}
            await store.append(sid, messages=[first], context=[first])
        for table in ("messages", "context"):
            await backend.execute(f"UPDATE {table} SET data = '{bad}'")
        async with backend.open() as store:
            loaded = await store.load_session(sid)
            page = await store.load_messages_page(sid, limit=10, max_bytes=1 << 20)
            read = [
                (await store.load_messages(sid))[0],
                (await store.load_context(sid))[0],
                page.messages[0],
                *(loaded.messages if loaded else []),
                *(loaded.context if loaded else []),
            ]
    assert [m["content"] for m in read] == [f"old{FFFD}text"] * 5
