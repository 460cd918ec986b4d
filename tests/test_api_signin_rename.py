"""The browser page's protocol additions over a real WebSocket on 127.0.0.1: renaming a
session (owner-checked, one clean line), the welcome's default mode of each profile, and
the one-time sign-in codes `navi web` prints (once each, for a minute, a bounded number
waiting). The expiry runs on a MockClock that also moves with real time (rate 1): the
store's thread needs real time, and `clock.jump` stands for the minute gone by.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from api_ws import Daemon, open_daemon
from trio_websocket import open_websocket_url

from navi_trio.api.signin import CODE_TTL_SEC, CODES_MAX, SigninCodes
from navi_trio.cli.web import page_address
from navi_trio.errors import AuthError, UsageError

TIMEOUT = 30


@pytest.fixture
def real_rate_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(rate=1)


async def _hello_with(d: Daemon, hello: dict[str, str]) -> dict[str, Any]:
    """The first frame the daemon answers a hello of `hello`'s fields with."""
    async with open_websocket_url(d.url) as ws:
        await ws.send_message(json.dumps({"type": "hello", **hello}))
        frame: dict[str, Any] = json.loads(await ws.get_message())
        return frame


async def test_a_session_is_renamed_by_its_owner_only(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d, d.connect("alice") as a, d.connect("bob") as b:
            made = await a.request({"type": "sessions", "action": "create"})
            sid = made["session_id"]
            title = "  the <b>plan</b>\n second line  "
            done = await a.request(
                {"type": "sessions", "action": "rename", "session_id": sid, "title": title}
            )
            assert done == {
                "type": "sessions", "id": done["id"], "action": "rename", "session_id": sid,
                "title": "the <b>plan</b>",
            }  # fmt: skip
            listed = await a.request({"type": "sessions", "action": "list"})
            assert [s["title"] for s in listed["sessions"]] == ["the <b>plan</b>"]
            theirs = await b.request(
                {"type": "sessions", "action": "rename", "session_id": sid, "title": "mine"}
            )
            assert theirs["code"] == "forbidden"
            for bad, words in (("   ", "must not be empty"), ("x" * 201, "at most 200")):
                refused = await a.request(
                    {"type": "sessions", "action": "rename", "session_id": sid, "title": bad}
                )
                assert refused["type"] == "error" and words in refused["message"], refused
            no_title = await a.request({"type": "sessions", "action": "rename", "session_id": sid})
            assert "needs a title" in no_title["message"]
            wrong = await a.request({"type": "sessions", "action": "list", "title": "x"})
            assert "for action 'rename' only" in wrong["message"]
            listed = await a.request({"type": "sessions", "action": "list"})
            assert [s["title"] for s in listed["sessions"]] == ["the <b>plan</b>"]


async def test_the_welcome_names_the_default_mode_of_each_profile(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d:
            welcome = await _hello_with(d, {"token": d.tokens["alice"]})
            modes = welcome["default_modes"]
            assert isinstance(modes, dict) and set(modes) == set(welcome["profiles"])
            assert set(modes.values()) <= {"read-only", "workspace", "full"}
            assert "token" not in welcome


async def test_a_sign_in_code_is_good_once_then_refused(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d, d.connect("alice") as a:
            answer = await a.request({"type": "signin_code"})
            assert answer["type"] == "signin_code" and answer["expires_in_sec"] == CODE_TTL_SEC
            code = answer["code"]
            assert isinstance(code, str) and len(code) >= 20 and d.tokens["alice"] not in code
            welcome = await _hello_with(d, {"code": code})
            assert welcome["type"] == "welcome", welcome
            assert welcome["user"] == {"name": "alice", "role": "user"}
            assert welcome["token"] == d.tokens["alice"]  # the page keeps it as if pasted
            again = await _hello_with(d, {"code": code})
            assert again["code"] == "unauthorized" and "used or expired" in str(again["message"])
            both = await _hello_with(d, {"code": code, "token": d.tokens["alice"]})
            assert both["code"] == "unauthorized" and "one of the two" in str(both["message"])


async def test_a_sign_in_code_expires_after_its_minute_and_few_wait(
    tmp_path: Path, real_rate_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT + 2 * CODE_TTL_SEC):
        async with open_daemon(tmp_path) as d, d.connect("alice") as a:
            fresh = (await a.request({"type": "signin_code"}))["code"]
            stale = (await a.request({"type": "signin_code"}))["code"]
            real_rate_clock.jump(CODE_TTL_SEC - 1)
            assert (await _hello_with(d, {"code": fresh}))["type"] == "welcome"
            real_rate_clock.jump(1)
            refused = await _hello_with(d, {"code": stale})
            assert refused["code"] == "unauthorized" and "expired" in str(refused["message"])
            # At most CODES_MAX wait at once; the expired ones make room.
            for _ in range(CODES_MAX):
                assert (await a.request({"type": "signin_code"}))["type"] == "signin_code"
            over = await a.request({"type": "signin_code"})
            assert over["code"] == "limit" and f"{CODES_MAX} sign-in codes" in over["message"]
            real_rate_clock.jump(CODE_TTL_SEC)
            assert (await a.request({"type": "signin_code"}))["type"] == "signin_code"


def test_a_sign_in_code_is_good_for_its_minute_and_not_at_its_end() -> None:
    now = [100.0]
    codes = SigninCodes(clock=lambda: now[0])
    kept, late = codes.issue("TOKEN-1"), codes.issue("TOKEN-2")
    now[0] = 100.0 + CODE_TTL_SEC - 0.5
    assert codes.redeem(kept) == "TOKEN-1"
    now[0] = 100.0 + CODE_TTL_SEC  # its minute is over, to the instant
    with pytest.raises(AuthError, match="used or expired"):
        codes.redeem(late)
    assert len(codes) == 0


def test_the_page_address_navi_web_prints() -> None:
    assert page_address("ws://127.0.0.1:8765/", "c0de") == "http://127.0.0.1:8765/#signin=c0de"
    assert page_address("wss://box.lan:443", "c0de") == "https://box.lan:443/#signin=c0de"
    for bad in ("http://127.0.0.1:8765/", "127.0.0.1:8765", "ws://"):
        with pytest.raises(UsageError, match="ws:// or wss://"):
            page_address(bad, "c0de")
