"""`role_profiles`: the profiles a role may use, wherever a profile is chosen.

A profile carries tools, rules, ``env``, MCP servers and budgets: without this list any
user could name the admins' profile in a message, and any model could switch to it.
With ``"role_profiles": {"user": [...]}`` a user's message, a schedule naming a profile,
the model's ``switch_profile`` and ``spawn_agent`` are held to the list, and a session
whose profile is not on it (an admin's run switched it) goes on with the role's default.

Rules: a real runtime and ApiServer in this process, real WebSocket clients on
127.0.0.1 for a user and an admin, the fake LLM server over real HTTP scripted to make
the calls. Every test has an absolute time limit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import call
from api_ws import open_daemon

from navi_trio.errors import ConfigError
from navi_trio.profiles import ConfigSource, parse_config
from navi_trio.settings import default_config_path

TIMEOUT = 30


def data(**role_profiles: list[str]) -> dict[str, Any]:
    path = default_config_path()
    cfg: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    for profile in cfg["profiles"].values():
        profile.update(planning_first_message=False, planning_enabled=False)
    cfg["role_profiles"] = role_profiles
    return cfg


def config(**role_profiles: list[str]) -> ConfigSource:
    path = default_config_path()
    return ConfigSource(path, initial=parse_config(data(**role_profiles), path))


def test_role_profiles_are_checked_strictly() -> None:
    path = default_config_path()
    for bad, expected in (
        ({"guest": ["general"]}, "$.role_profiles: unknown role(s) 'guest'"),
        ({"user": ["nosuch"]}, "$.role_profiles['user']: unknown profile(s) 'nosuch'"),
        ({"user": []}, "$.role_profiles['user']: name at least one profile"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(data(**bad), path)
        assert expected in str(info.value)
    cfg = parse_config(data(user=["researcher", "general"]), path)
    assert cfg.profiles_for("user") == ["general", "researcher"]
    assert cfg.profiles_for("admin") == sorted(cfg.profiles)
    assert cfg.default_for("user") == "general"
    assert parse_config(data(user=["researcher"]), path).default_for("user") == "researcher"


async def test_a_user_names_only_the_profiles_of_their_role_and_is_offered_only_those(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=[{"text": "hi"}, {"text": "hi"}], config=config(user=["researcher"])
        ) as d:
            async with d.connect("alice", hello=False) as alice:
                await alice.send({"type": "hello", "token": d.tokens["alice"]})
                welcome = await alice.next()
                assert welcome["profiles"] == ["researcher"], welcome
                assert welcome["default_profile"] == "researcher"
                refused = await alice.request(
                    {"type": "message", "content": "hi", "profile": "coder"}
                )
                assert refused["type"] == "error" and refused["code"] == "forbidden", refused
                assert "profile 'coder' is not one a user may use" in refused["message"]
                assert await d.harness.runtime.store.list_sessions() == []
                ok = await alice.request({"type": "message", "content": "hi"})
                await alice.until_end(ok["session_id"])
                row = await d.harness.runtime.store.get_session(ok["session_id"])
                assert row is not None and row.profile_id == "researcher"
                schedule = await alice.request(
                    {"type": "schedule", "action": "add", "message": "x", "every": "1h",
                     "new": True, "profile": "coder"}
                )  # fmt: skip
                assert schedule["type"] == "error" and schedule["code"] == "forbidden"
            async with d.connect("root") as root:  # an admin: any profile
                ok = await root.request({"type": "message", "content": "hi", "profile": "coder"})
                assert ok["type"] == "session" and ok["created"], ok


async def test_the_model_cannot_switch_or_spawn_into_a_profile_the_role_may_not_use(
    tmp_path: Path,
) -> None:
    replies = [
        call("switch_profile", profile_id="coder"),
        call("spawn_agent", task="do it", profile_id="coder"),
        {"text": "done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with (
            open_daemon(tmp_path, replies=replies, config=config(user=["general"])) as d,
            d.connect("alice") as alice,
        ):
            ok = await alice.request({"type": "message", "content": "go"})
            sid = ok["session_id"]
            await alice.until_end(sid)
            results = [f for f in alice.frames if f["type"] == "tool_result"]
            assert [r["name"] for r in results] == ["switch_profile", "spawn_agent"]
            for result in results:
                assert not result["ok"], result
                assert "profile 'coder' is not one a user may use" in result["error"], result
            row = await d.harness.runtime.store.get_session(sid)
            assert row is not None and row.profile_id == "general"


async def test_a_session_on_a_profile_the_user_may_not_use_goes_on_with_their_default(
    tmp_path: Path,
) -> None:
    replies = [{"text": "alice's"}, {"text": "the admin's"}, {"text": "alice again"}]
    with trio.fail_after(TIMEOUT):
        async with (
            open_daemon(tmp_path, replies=replies, config=config(user=["general"])) as d,
            d.connect("alice") as alice,
            d.connect("root") as root,
        ):
            ok = await alice.request({"type": "message", "content": "one"})
            sid = ok["session_id"]
            await alice.until_end(sid)
            await root.request(
                {"type": "message", "content": "two", "session_id": sid, "profile": "coder"}
            )
            await root.until_end(sid)
            store = d.harness.runtime.store
            row = await store.get_session(sid)
            assert row is not None and row.profile_id == "coder"  # the admin's run switched it
            await alice.request({"type": "message", "content": "three", "session_id": sid})
            warning = await alice.until_type("warning", code="profile_refused")
            assert "this session goes on with 'general'" in warning["message"], warning
            await alice.until(
                lambda f: f["type"] == "stream_end" and f.get("text") == "alice again"
            )
            row = await store.get_session(sid)
            assert row is not None and row.profile_id == "general"
