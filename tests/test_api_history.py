"""A session's history over the wire comes in pages, and clients follow them.

The daemon answers ``sessions`` ``history`` with one page: at most `limit` messages
(1000 without) and about 1 MB of them, so a page with its envelope stays under 1 MiB
(a message bigger than that comes alone), and a ``next_cursor`` to ask for the rest
(null on the last page). `open_daemon` follows the pages and hands on the whole
history as one reply; so do `navi sessions history` and the chat, which read through it.

Rules: the daemon in-process on 127.0.0.1 port 0 (tests/api_ws.py), the store a real
SQLite file; sessions are written through the store. Every test under an absolute
`trio.fail_after`; nothing sleeps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import Client, Daemon, open_daemon
from test_cli import navi

from navi_trio import wire
from navi_trio.api.daemon_client import open_daemon as open_client

TIMEOUT = 60
MIB = 1 << 20


def _long_history() -> list[dict[str, Any]]:
    """12 answers of 300 kB (three to a page) and one of 1.2 MB (alone) in the middle."""
    history: list[dict[str, Any]] = []
    for i in range(12):
        role = "user" if i % 2 == 0 else "assistant"
        history.append({"role": role, "content": f"{i:02d}" + chr(97 + i) * 300_000})
    history.insert(6, {"role": "assistant", "content": "big" + "z" * 1_200_000})
    return history


async def _session(d: Daemon, sid: str, history: list[dict[str, Any]]) -> None:
    store = d.harness.runtime.store
    await store.create_session(sid, profile_id="general", user_id=d.ids["alice"])
    await store.append(sid, messages=history)


async def _pages(c: Client, sid: str, **fields: Any) -> list[dict[str, Any]]:
    """Every page of `sid`'s history, following the cursors (the frames as they came)."""
    pages = [await c.request({"type": "sessions", "action": "history", "session_id": sid,
                              **fields})]  # fmt: skip
    while pages[-1].get("next_cursor") is not None:
        cursor = pages[-1]["next_cursor"]
        assert isinstance(cursor, str), pages[-1]
        pages.append(await c.request({"type": "sessions", "action": "history",
                                      "session_id": sid, "cursor": cursor, **fields}))  # fmt: skip
        assert len(pages) < 100, "the pages do not come to an end"
    return pages


async def test_a_long_history_comes_in_pages_under_a_mebibyte_that_add_up_to_all_of_it(
    tmp_path: Path,
) -> None:
    history = _long_history()
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d:
            await _session(d, "alice.long", history)
            async with d.connect("alice", max_message_size=4 * MIB) as c:
                pages = await _pages(c, "alice.long")
                sizes = [len(json.dumps(p, ensure_ascii=False).encode()) for p in pages]
                got = [m for p in pages for m in p["messages"]]
                seq = d.harness.runtime.sessions.actor("alice.long")
        assert got == history
        assert [len(p["messages"]) for p in pages] == [3, 3, 1, 3, 3]
        for page, size in zip(pages, sizes, strict=True):
            assert page["type"] == "sessions" and page["action"] == "history", page.keys()
            one_big = len(page["messages"]) == 1 and size > MIB
            assert size < MIB or one_big, size
            assert seq is not None and page["seq"] == seq.seq and page["epoch"] == seq.epoch
        assert [p["next_cursor"] is None for p in pages] == [False] * 4 + [True]


async def test_limit_and_cursor_page_a_history_and_bad_ones_are_refused_by_name(
    tmp_path: Path,
) -> None:
    history = [{"role": "user", "content": f"m{i}"} for i in range(12)]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d:
            await _session(d, "alice.short", history)
            async with d.connect("alice") as c:
                # A client that knows nothing of pages: a short history comes whole.
                whole = await c.request(
                    {"type": "sessions", "action": "history", "session_id": "alice.short"}
                )
                assert whole["messages"] == history and whole["next_cursor"] is None
                pages = await _pages(c, "alice.short", limit=5)
                assert [len(p["messages"]) for p in pages] == [5, 5, 2]
                assert [m for p in pages for m in p["messages"]] == history
                bad = {
                    "limit": [0, 1001, "5", True, 2.5],
                    "cursor": ["abc", 12, "", "1.0; DROP TABLE"],
                }
                for field, values in bad.items():
                    for value in values:
                        ask = {"type": "sessions", "action": "history", "session_id": "alice.short"}
                        err = await c.request({**ask, field: value})
                        assert err["type"] == "error" and err["code"] == "bad_frame", err
                        assert f"field '{field}'" in err["message"], err
                err = await c.request({"type": "sessions", "action": "list", "limit": 5})
                assert err["code"] == "bad_frame", err
                assert "field 'limit' is for action 'history' only" in err["message"], err
                err = await c.request({"type": "sessions", "action": "list", "cwd": "/"})
                assert "field 'cwd' is for action 'create' only" in err["message"], err
                # The connection goes on.
                again = await c.request({"type": "sessions", "action": "history",
                                         "session_id": "alice.short", "limit": 1000})  # fmt: skip
                assert again["messages"] == history


@pytest.mark.slow
async def test_open_daemon_and_navi_sessions_history_follow_the_pages(
    tmp_path: Path, env: dict[str, str]
) -> None:
    history = _long_history()
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d:
            await _session(d, "alice.long", history)
            async with open_client(d.url, d.tokens["alice"]) as daemon:
                reply = await daemon.request(wire.history("alice.long"))
                assert reply["messages"] == history and reply["next_cursor"] is None
                actor = d.harness.runtime.sessions.actor("alice.long")
                assert actor is not None and reply["seq"] == actor.seq
                # Read as a stream (the chat's way): one frame of the whole history, and
                # without an id, as it was asked.
                await daemon.send(wire.history("alice.long"))
                frame = await daemon.receive()
                assert frame["messages"] == history and "id" not in frame
            done = await navi("sessions", "history", "alice.long", "--url", d.url,
                              "--token", d.tokens["alice"], env=env, cwd=tmp_path)  # fmt: skip
        assert done.code == 0, done.err
        lines = done.out.splitlines()
        assert [line[:12] for line in lines] == [
            f"{m['role']}: {m['content'][: 12 - len(m['role']) - 2]}" for m in history
        ]
        assert len(done.out) > sum(len(m["content"]) for m in history)


@pytest.mark.slow  # asks again after real 0.2 s waits until the frame rate allows
async def test_open_daemon_asks_again_for_a_page_refused_for_the_frame_rate(
    tmp_path: Path,
) -> None:
    """Five pages against a burst of two frames: the third page and on are refused as
    rate_limited at first, and asked for again (every 0.2 s; 2 frames a second here)."""
    history = [{"role": "user", "content": f"{i}" + "p" * 900_000} for i in range(5)]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, ws_frames_per_sec=2, ws_frames_burst=2) as d:
            await _session(d, "alice.rated", history)
            async with open_client(d.url, d.tokens["alice"]) as daemon:
                reply = await daemon.request(wire.history("alice.rated"))
    assert reply["messages"] == history and reply["next_cursor"] is None
