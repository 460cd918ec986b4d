"""A session frame is JSON-encoded once, however many clients are subscribed to it, and
the text every client gets is the one it got before (``json.dumps``, compact, UTF-8).

Rules: see tests/test_api_server.py (loopback, port 0, absolute timeouts).
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest
import trio
from api_ws import open_daemon

from navi_trio.api import protocol
from navi_trio.api.protocol import encode, event_frame
from navi_trio.events import TextDelta, ToolStarted

TIMEOUT = 30
SUBSCRIBERS = 3


def _plain(frame: dict[str, Any]) -> str:
    return json.dumps(dict(frame), ensure_ascii=False, separators=(",", ":"))


def test_an_event_frame_encodes_to_the_same_text_as_a_plain_dict() -> None:
    frame = event_frame(
        ToolStarted(call_id="c1", name="echo", arguments={"text": "héllo ✓", "n": [1, 2]}),
        "s1", 7, "e1",
    )  # fmt: skip
    assert encode(frame) == _plain(frame)
    assert encode(frame) is encode(frame)  # the second time is the kept text
    # A lone surrogate cannot go out as UTF-8, nor as an escape the client would choke
    # on: it goes out as U+FFFD, as for any other frame.
    odd = event_frame(TextDelta(text="a\ud800b"), "s1", 8)
    assert encode(odd) == encode(dict(odd)) == _plain({**odd, "text": "a\ufffdb"})


def test_a_big_frame_is_not_kept_encoded() -> None:
    frame = event_frame(TextDelta(text="x" * protocol.KEEP_MAX_CHARS), "s1", 1)
    assert encode(frame) == encode(frame) == _plain(frame)
    assert encode(frame) is not encode(frame)


def test_a_frame_built_from_an_event_frame_is_encoded_afresh() -> None:
    frame = event_frame(TextDelta(text="one "), "s1", 1)
    encode(frame)
    merged = {**frame, "text": "one two", "seq": 2}  # what the delta merging builds
    assert json.loads(encode(merged))["text"] == "one two"


async def test_each_frame_is_encoded_once_for_all_subscribers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: collections.Counter[tuple[Any, Any]] = collections.Counter()
    real = protocol._dumps

    def counting(frame: dict[str, Any]) -> str:
        if not isinstance(frame, protocol.EventFrame):  # (an event frame's count is its _json's)
            encoded[frame.get("session_id"), frame.get("seq")] += 1
        return real(frame)

    def counted(cls: type[protocol.EventFrame]) -> Any:
        made = cls._json  # a token's from its template, any other's by the encoder

        def _json(frame: protocol.EventFrame) -> str:
            encoded[frame.get("session_id"), frame.get("seq")] += 1
            return made(frame)

        return _json

    call = {"name": "no_such_tool", "arguments": {"text": "ünïcode"}}
    replies = [{"text": "first"}, {"tool_calls": [call]}, {"text": "second"}]
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies) as d:
            async with d.connect("alice") as a, d.connect("alice") as b, d.connect("alice") as c:
                created = await a.request({"type": "message", "content": "hi"})
                sid = created["session_id"]
                before = (await a.until_end(sid))["seq"]
                for other in (b, c):
                    ok = await other.request({"type": "subscribe", "session_id": sid})
                    assert ok["type"] == "ok", ok
                monkeypatch.setattr(protocol, "_dumps", counting)
                for cls in (protocol.EventFrame, protocol._TokenFrame):
                    monkeypatch.setattr(cls, "_json", counted(cls))
                await a.request({"type": "message", "session_id": sid, "content": "again"})
                ends = [await x.until_end(sid) for x in (a, b, c)]
    assert len({e["seq"] for e in ends}) == 1

    def live(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            f for f in frames
            if f.get("session_id") == sid and isinstance(f.get("seq"), int) and f["seq"] > before
        ]  # fmt: skip

    got = [live(x.frames) for x in (a, b, c)]
    assert got[0] == got[1] == got[2] and len(got[0]) >= 3, got
    seqs = {(sid, f["seq"]) for f in got[0]}
    assert {k: encoded[k] for k in seqs} == dict.fromkeys(seqs, 1)
