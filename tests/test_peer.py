"""The peer tool (issue 12): ask another navi daemon, over real WebSocket connections.

Two daemons in one test: A (a runtime driven through the harness, whose model calls
``peer``) and B (a runtime + ApiServer on 127.0.0.1 port 0), each with its own fake LLM
server on 127.0.0.1. B's users and tokens are real (hashed in its SQLite store).

Rules: loopback only, port 0; every test has an absolute `trio.fail_after`; nothing
sleeps for real: runs are held open by B's fake LLM stalling mid-stream, tests wait on
frames; the timeout test moves a MockClock by hand once B is stuck.
"""

from __future__ import annotations

import io
import json
import logging
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from agent_tools import call, with_tools
from api_ws import Daemon, open_daemon

from navi_trio.api.peer_link import WsPeerLink
from navi_trio.cli.doctor import collect_doctor, print_doctor
from navi_trio.core.turn.policy import CallFacts, decide, summary
from navi_trio.errors import ConfigError
from navi_trio.profiles import AgentProfile, ConfigSource, PeerConfig, parse_config
from navi_trio.settings import Settings, default_config_path
from navi_trio.testing import Harness, open_harness
from navi_trio.testing.harness import SessionDriver
from navi_trio.testing.memkv import MemoryKV
from navi_trio.tools.base import ToolContext
from navi_trio.tools.peer import PeerTool, _Feed

TIMEOUT = 30
TOKEN_ENV = "NAVI_TEST_PEER_TOKEN"
PLAIN = with_tools([], planning_first_message=False)
# peer asks (core/turn/policy.py): these tests are about the link, so a rule allows it.
ALLOW_PEER = {"rules": [{"tool": "peer", "decision": "allow"}]}
ASKER = with_tools(["peer", "tasks"], planning_first_message=False, policy=ALLOW_PEER)
ASKS = with_tools(["peer"], planning_first_message=False)  # the policy's own default


def config(peers: dict[str, Any] | None = None, default: str = "general") -> ConfigSource:
    """The shipped config with the test profiles and `peers`."""
    path = default_config_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    data["profiles"].update(plain=PLAIN, asker=ASKER, asks=ASKS)
    data["default_profile"] = default
    if peers is not None:
        data["peers"] = peers
    return ConfigSource(path, initial=parse_config(data, path))


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def peer_b(tmp_path: Path, replies: list[dict[str, Any]]) -> AsyncIterator[Daemon]:
    (tmp_path / "b").mkdir()
    async with open_daemon(tmp_path / "b", replies=replies, config=config(default="plain")) as b:
        yield b


@asynccontextmanager
async def daemon_a(
    tmp_path: Path, replies: list[dict[str, Any]], peers: dict[str, Any]
) -> AsyncIterator[Harness]:
    (tmp_path / "a").mkdir()
    async with open_harness(tmp_path / "a", replies=replies, config=config(peers)) as a:
        yield a


def to_b(b: Daemon, **extra: Any) -> dict[str, Any]:
    return {"b": {"url": b.url, "token_env": TOKEN_ENV, **extra}}


def ask(message: str, **args: Any) -> dict[str, Any]:
    return call("peer", action="ask", peer="b", message=message, **args)


def results(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == "tool_result" and f["name"] == "peer"]


def tool_events(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f["data"] for f in frames if f["type"] == "tool_event" and f["name"] == "peer"]


async def ended(b: Daemon, session_id: str) -> dict[str, Any]:
    """B's session's last top-level stream_end (replayed from its first frame)."""
    actor = await b.harness.runtime.sessions.get(session_id)
    driver = SessionDriver(actor, actor.subscribe(last_seq=0))
    try:
        return (await driver.until_end())[-1]
    finally:
        driver.subscription.close()


async def b_session(b: Daemon) -> str:
    rows = await b.harness.runtime.store.list_sessions()
    assert len(rows) == 1, rows
    return str(rows[0].id)


async def start(a: Harness, text: str = "ask b") -> SessionDriver:
    driver = await a.session("s1")
    driver.send(text, profile_id="asker")
    return driver


# -- asking ---------------------------------------------------------------------------


async def test_the_answer_is_the_peers_and_the_peer_session_can_be_continued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    b_replies = [
        call("nosuch"),  # a tool card on B: started, then failed
        {"text": "B says forty-two"},
        {"text": "B remembers"},
    ]
    a_replies = [
        ask("What is 6*7?", session="alice.pq-1"),
        ask("And again?", session="alice.pq-1"),
        {"text": "A is done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with peer_b(tmp_path, b_replies) as b, daemon_a(tmp_path, a_replies, to_b(b)) as a:
            token = b.tokens["alice"]
            monkeypatch.setenv(TOKEN_ENV, token)
            driver = await start(a)
            frames = await driver.until_end()
            assert frames[-1]["text"] == "A is done"
            first, second = results(frames)
            assert first["ok"] and second["ok"], (first, second)
            assert first["output"].startswith("B says forty-two")
            assert '"session": "alice.pq-1"' in first["output"]  # the model learns the id
            assert second["output"].startswith("B remembers")
            # The model saw B's answer as the tool's result.
            tool_msgs = [m for m in a.chat_requests[1]["messages"] if m["role"] == "tool"]
            assert "B says forty-two" in tool_msgs[-1]["content"]
            # B ran both messages in one session, owned by the token's user.
            history = await b.harness.runtime.store.load_messages("alice.pq-1")
            said = [(m["role"], m.get("content")) for m in history if m["role"] != "tool"]
            assert ("user", "What is 6*7?") in said and ("user", "And again?") in said
            assert ("assistant", "B remembers") in said
            row = await b.harness.runtime.store.get_session("alice.pq-1")
            assert row is not None and row.user_id == b.ids["alice"]
            # B's text and tool cards streamed as A's tool events, marked with the peer.
            events = tool_events(frames)
            assert events and all(e["peer"] == "b" for e in events)
            assert "forty-two" in "".join(e.get("text", "") for e in events if "stream" in e)
            cards = [(e["event"], e["tool"]) for e in events if "tool" in e]
            assert cards[:2] == [("tool_started", "nosuch"), ("tool_result", "nosuch")]
            failed = next(e for e in events if e.get("event") == "tool_result")
            assert failed["ok"] is False and failed["status"].startswith("failed: unknown tool")
            # The token is in no frame, no result and no log line of either daemon.
            assert token not in json.dumps(frames) and token not in caplog.text


async def test_stop_on_our_side_stops_the_peers_run(
    tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    b_replies = [{"text": "thinking about it slowly", "stall": True}]
    with trio.fail_after(TIMEOUT):
        async with (
            peer_b(tmp_path, b_replies) as b,
            daemon_a(tmp_path, [ask("a long question")], to_b(b)) as a,
        ):
            monkeypatch.setenv(TOKEN_ENV, b.tokens["alice"])
            driver = await start(a)
            # B is mid-stream (its words reached A) and stalls there.
            await driver.until(lambda f: f["type"] == "tool_event" and "slowly" in
                               f["data"].get("text", ""))  # fmt: skip
            assert driver.stop()
            frames = await driver.until_end()
            assert frames[-1]["reason"] == "stopped"
            sid = await b_session(b)
            end = await ended(b, sid)
            assert end["reason"] == "stopped", end
            assert b.harness.fake is not None
            await b.harness.fake.wait_disconnects(1)  # B's model request was cut too
            assert "sending stop" in caplog.text
            assert b.tokens["alice"] not in json.dumps(driver.frames) + caplog.text


async def test_a_message_queued_behind_another_run_gets_its_own_answer(
    tmp_path: Path, monkeypatch: Any
) -> None:
    b_replies: list[dict[str, Any]] = [
        {"text": "the earlier run", "stall": True},
        {"text": "B answers the queued one"},
    ]
    with trio.fail_after(TIMEOUT):
        async with (
            peer_b(tmp_path, b_replies) as b,
            daemon_a(tmp_path, [ask("me too", session="alice.pq-2"), {"text": "ok"}], to_b(b)) as a,
            b.connect("alice") as alice,
        ):
            monkeypatch.setenv(TOKEN_ENV, b.tokens["alice"])
            await alice.request({"type": "message", "session_id": "alice.pq-2", "content": "first"})
            assert b.harness.fake is not None
            await b.harness.fake.wait_requests(1)  # B's session is busy with alice's run
            driver = await start(a)
            await alice.until_type("message_queued", text="me too")
            await alice.request({"type": "stop", "session_id": "alice.pq-2"})
            (result,) = results(await driver.until_end())
            assert result["ok"], result
            assert result["output"].startswith("B answers the queued one")


async def test_background_ask_returns_a_task_and_the_job_gets_the_answer(
    tmp_path: Path, monkeypatch: Any
) -> None:
    a_replies = [ask("in the background please", background=True), {"text": "asked it"}]
    with trio.fail_after(TIMEOUT):
        async with (
            peer_b(tmp_path, [{"text": "B answers later"}]) as b,
            daemon_a(tmp_path, a_replies, to_b(b)) as a,
        ):
            monkeypatch.setenv(TOKEN_ENV, b.tokens["alice"])
            driver = await start(a)
            frames = await driver.until_end()
            (result,) = results(frames)
            assert json.loads(result["output"])["status"] == "running"
            (job,) = a.runtime.supervisor.list_jobs("s1")
            await job.done.wait()
            assert job.result is not None and job.result.ok, job.result
            assert job.result.output.startswith("B answers later")
            assert any(getattr(e, "data", {}).get("peer") == "b" for e in job.ring)


async def test_cancelling_a_background_ask_stops_the_peers_run(
    tmp_path: Path, monkeypatch: Any
) -> None:
    b_replies = [{"text": "never finishing", "stall": True}]
    a_replies = [ask("in the background", background=True), {"text": "asked it"}]
    with trio.fail_after(TIMEOUT):
        async with peer_b(tmp_path, b_replies) as b, daemon_a(tmp_path, a_replies, to_b(b)) as a:
            monkeypatch.setenv(TOKEN_ENV, b.tokens["alice"])
            driver = await start(a)
            await driver.until_end()
            assert b.harness.fake is not None
            await b.harness.fake.wait_requests(1)
            (job,) = a.runtime.supervisor.list_jobs("s1")
            sid = await b_session(b)
            assert a.runtime.supervisor.cancel("s1", job.task_id)
            await job.done.wait()
            assert (await ended(b, sid))["reason"] == "stopped"


async def test_the_peers_text_is_coalesced_at_most_once_per_interval(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    emitted: list[dict[str, Any]] = []
    ctx = ToolContext(
        session_id="s1", session_dir=tmp_path, kv=MemoryKV(),
        settings=Settings.from_env({}, tool_progress_interval_sec=1.0),
        profile=AgentProfile(), config=config().current, emit=emitted.append,
    )  # fmt: skip
    feed = _Feed(ctx, "b")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed.run)
        feed.text("one ")
        await trio.testing.wait_all_tasks_blocked()
        feed.text("two ")
        feed.text("three ")
        await trio.testing.wait_all_tasks_blocked()
        assert [e["text"] for e in emitted] == ["one "]  # the rest waits for the interval
        await trio.sleep(1.0)
        await trio.testing.wait_all_tasks_blocked()
        assert [e["text"] for e in emitted] == ["one ", "two three "]
        feed.text("four")
        feed.card({"event": "tool_started", "tool": "t"})  # a card flushes the text first
        assert [e.get("text") for e in emitted[2:]] == ["four", None]
        nursery.cancel_scope.cancel()
    assert all(e["peer"] == "b" for e in emitted)


# -- failures -------------------------------------------------------------------------


async def one_result(tmp_path: Path, b_replies: list[dict[str, Any]], peers: Any,
                     args: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    async with peer_b(tmp_path, b_replies) as b:
        a_replies = [ask("hello?", **(args or {})), {"text": "ok"}]
        async with daemon_a(tmp_path, a_replies, peers(b) if callable(peers) else peers) as a:
            driver = await start(a)
            frames = await driver.until_end()
            (result,) = results(frames)
            return result


def test_peer_asks_in_workspace_and_full_is_denied_in_read_only_and_rules_decide() -> None:
    def decision(mode: str, rules: list[dict[str, Any]] | None = None, **args: Any) -> str:
        prof = config().current.profiles["asks"]
        prof = attrs.evolve(prof, policy=attrs.evolve(prof.policy, rules=()))
        if rules:
            data = json.loads(default_config_path().read_text(encoding="utf-8"))
            data["profiles"]["asks"] = {**ASKS, "policy": {"rules": rules}}
            prof = parse_config(data, default_config_path()).profiles["asks"]
        return decide(prof, "user", mode, CallFacts.of("peer", args)).decision

    args: dict[str, Any] = {"action": "ask", "peer": "lab", "message": "rm the logs"}
    assert decision("workspace", **args) == "ask"
    assert decision("full", **args) == "ask"
    assert decision("read-only", **args) == "deny"
    # A rule decides per peer (the call's "action") and message, in read-only too.
    lab = [{"tool": "peer", "action": "lab", "match": "what *", "decision": "allow"}]
    assert decision("read-only", lab, **{**args, "message": "what time is it"}) == "allow"
    assert decision("workspace", lab, **args) == "ask"
    assert decision("workspace", lab, **{**args, "peer": "prod", "message": "what"}) == "ask"
    assert summary("peer", {**args, "session": "s-0123456789ab"}) == (
        "peer lab (session s-0123456789ab): rm the logs"
    )


async def test_a_peer_call_asks_and_a_denied_one_never_reaches_the_peer(
    tmp_path: Path, monkeypatch: Any
) -> None:
    with trio.fail_after(TIMEOUT):
        async with peer_b(tmp_path, [{"text": "never"}]) as b:
            monkeypatch.setenv(TOKEN_ENV, b.tokens["alice"])
            async with daemon_a(tmp_path, [ask("drop the table"), {"text": "ok"}], to_b(b)) as a:
                driver = await a.session("s1")
                driver.send("ask b", profile_id="asks")
                [*_, request] = await driver.until_type("approval_request")
                assert request["summary"] == "peer b: drop the table", request
                assert "peer runs a turn on the daemon 'b'" in request["rule"], request
                await a.runtime.approvals.answer(
                    "s1", request["call_id"], approve=False, scope="once", user_id="local"
                )
                frames = await driver.until_end()
            assert await b.harness.runtime.store.list_sessions() == []
    (result,) = results(frames)
    assert result["ok"] is False and "denied" in result["error"], result


async def test_an_unreachable_peer_is_a_clear_failure(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv(TOKEN_ENV, "navi_some_token_value")
    url = f"ws://127.0.0.1:{unused_port()}/"
    with trio.fail_after(TIMEOUT):
        result = await one_result(tmp_path, [], {"b": {"url": url, "token_env": TOKEN_ENV}})
    assert result["ok"] is False
    assert f"peer 'b' ({url}): no navi daemon answers" in result["error"], result


async def test_a_bad_token_is_refused_and_never_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bad = "navi_not_a_real_token_0123456789"
    with trio.fail_after(TIMEOUT):
        result = await one_result(tmp_path, [], lambda b: {"b": {"url": b.url, "token": bad}})
    assert result["ok"] is False
    assert "refused the token" in result["error"] and "unauthorized" in result["error"]
    assert bad not in json.dumps(result) and bad not in caplog.text


async def test_a_failed_peer_run_is_a_failed_result(tmp_path: Path, monkeypatch: Any) -> None:
    b_replies = [{"status": 500, "error_body": "the model fell over"}]
    with trio.fail_after(TIMEOUT):
        async with peer_b(tmp_path, b_replies) as b:
            monkeypatch.setenv(TOKEN_ENV, b.tokens["alice"])
            async with daemon_a(tmp_path, [ask("x"), {"text": "ok"}], to_b(b)) as a:
                (result,) = results(await (await start(a)).until_end())
    assert result["ok"] is False
    assert "the peer's run failed (error)" in result["error"], result
    assert "the model fell over" in result["error"]


async def test_unknown_peer_missing_token_and_no_peers_are_clear(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    peers = {"b": {"url": "ws://127.0.0.1:9/", "token_env": TOKEN_ENV}}
    a_replies = [
        call("peer", action="ask", peer="nope", message="hi"),
        ask("hi"),
        {"text": "ok"},
    ]
    with trio.fail_after(TIMEOUT):
        async with daemon_a(tmp_path, a_replies, peers) as a:
            unknown, missing = results(await (await start(a)).until_end())
    assert unknown["error"] == "unknown peer 'nope'; peers: b"
    assert (
        f"the environment variable {TOKEN_ENV} (peers.b.token_env) is not set" in (missing["error"])
    )
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path / "c", replies=[ask("hi"), {"text": "ok"}],
                                config=config()) as c:  # fmt: skip
            (none,) = results(await (await start(c)).until_end())
    assert none["error"].startswith('no peers are configured: add a "peers" section')


async def test_timeout_fails_and_stops_the_peers_run(
    tmp_path: Path, monkeypatch: Any, mock_clock: trio.testing.MockClock
) -> None:
    # The clock moves by hand once B is stuck; as a safety net only, 10 idle real
    # seconds let it jump, so a broken timeout fails on the deadline below.
    mock_clock.autojump_threshold = 10.0
    b_replies = [{"text": "stuck here", "stall": True}]
    with trio.fail_after(3600):
        async with (
            peer_b(tmp_path, b_replies) as b,
            daemon_a(tmp_path, [ask("q", timeout=5), {"text": "gave up"}], to_b(b)) as a,
        ):
            monkeypatch.setenv(TOKEN_ENV, b.tokens["alice"])
            driver = await start(a)
            await driver.until(lambda f: f["type"] == "tool_event" and "stuck" in
                               f["data"].get("text", ""))  # fmt: skip
            mock_clock.jump(6)
            frames = await driver.until_end()
            (result,) = results(frames)
            assert result["ok"] is False
            assert "no answer from peer 'b'" in result["error"] and "within 5 s" in result["error"]
            assert "its run was stopped" in result["error"]
            assert (await ended(b, await b_session(b)))["reason"] == "stopped"


# -- config and doctor ----------------------------------------------------------------


def test_the_agent_has_a_manual_for_peer() -> None:
    description = PeerTool(WsPeerLink()).description
    assert description.endswith("Manual: read `manual:peer` with the filesystem tool.")
    text = (Settings().manuals_dir / "peer.md").read_text(encoding="utf-8")
    assert "## Background mode" in text and '"background": true' in text


def test_peer_config_is_strict_and_hides_the_token(tmp_path: Path) -> None:
    path = default_config_path()
    base = json.loads(path.read_text(encoding="utf-8"))

    def parse(peers: Any) -> Any:
        return parse_config({**base, "peers": peers}, path)

    cfg = parse({"b": {"url": "ws://h:1/", "token": "navi_secret_value"}})
    assert "navi_secret_value" not in repr(cfg)
    assert cfg.peers["b"] == PeerConfig(url="ws://h:1/", token="navi_secret_value")
    for peers, said in (
        ({"b": {"url": "ws://h:1/"}}, "give exactly one of token_env (better) or token"),
        ({"b": {"url": "ws://h:1/", "token": "x", "token_env": "Y"}}, "exactly one"),
        ({"b": {"url": "http://h:1/", "token_env": "Y"}}, "expected a ws:// or wss:// URL"),
        ({"b": {"url": "ws://h:1/", "token_env": "Y", "tokn": 1}}, "tokn"),
        ({"b": {"url": "ws://h:1/", "token_env": "Y", "timeout_sec": 0}}, "timeout_sec"),
    ):
        with pytest.raises(ConfigError, match=re.escape(said)):
            parse(peers)


async def test_doctor_reports_peers_it_cannot_reach(tmp_path: Path, monkeypatch: Any) -> None:
    with trio.fail_after(TIMEOUT):
        async with peer_b(tmp_path, []) as b:
            monkeypatch.setenv(TOKEN_ENV, b.tokens["alice"])
            shipped = default_config_path().parent
            folder = tmp_path / "config"
            await trio.to_thread.run_sync(copy_tree, shipped, folder)
            data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
            data["peers"] = {
                "good": {"url": b.url, "token_env": TOKEN_ENV},
                "gone": {"url": f"ws://127.0.0.1:{unused_port()}/", "token_env": TOKEN_ENV},
                "wrong": {"url": b.url, "token": "navi_wrong_token_for_doctor"},
            }
            (folder / "config.json").write_text(json.dumps(data), encoding="utf-8")
            settings = attrs.evolve(
                Settings.from_env({}, db_path=tmp_path / "d.db", data_dir=tmp_path / "d"),
                config_path=folder / "config.json",
            )
            report = await collect_doctor(settings, f"ws://127.0.0.1:{unused_port()}/")
    out = io.StringIO()
    print_doctor(report, out)
    assert "peer         good ws://127.0.0.1" in out.getvalue()
    peers = {p["name"]: p for p in report["peers"]}
    assert peers["good"]["ok"] is True
    assert peers["gone"]["ok"] is False and "unreachable" in peers["gone"]["error"]
    assert "refused the token" in peers["wrong"]["error"]
    assert sum("peer 'gone'" in w for w in report["warnings"]) == 1
    assert b.tokens["alice"] not in json.dumps(report)
    assert "navi_wrong_token_for_doctor" not in json.dumps(report)


def copy_tree(src: Path, dst: Path) -> None:
    import shutil

    shutil.copytree(src, dst)
