"""The WebSocket daemon in-process: real connections on 127.0.0.1 port 0, the fake LLM
over real HTTP, the store on a SQLite file in tmp_path.

Rules: loopback only, port 0; every test has an absolute `trio.fail_after`; the hello
timeout test runs on the autojump clock (no store, so no thread makes it jump early);
nothing sleeps for real. Runs are held open by the `gate` test tool where a test needs
a run in progress.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import GateTool, call, toolset, with_tools
from api_ws import Client, open_daemon
from trio_websocket import ConnectionClosed, open_websocket_url

from navi_trio.api.server import ApiServer
from navi_trio.settings import Settings

TIMEOUT = 30
HELLO = {"text": "Hello there"}


def _gated(tmp_path: Path, gate: GateTool, **kw: Any) -> Any:
    return open_daemon(
        tmp_path, replies=[call("gate"), {"text": "gated done"}, HELLO], loop=True,
        tools=toolset(gate), profiles={"general": with_tools(["gate"])}, **kw,
    )  # fmt: skip


async def _start_session(c: Client, text: str = "hi") -> str:
    created = await c.request({"type": "message", "content": text})
    assert created["type"] == "session" and created["created"] is True, created
    ok = await c.until_type("ok", id=created["id"])
    return str(ok["session_id"])


async def _closed(c: Client) -> bool:
    try:
        await c.next()
    except ConnectionClosed:
        return True
    return False


# -- a normal exchange -------------------------------------------------------------------


async def test_hello_message_streams_frames_and_session_is_owned(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[HELLO], loop=True) as d:
            async with d.connect(hello=False) as c:
                await c.send({"type": "hello", "token": d.tokens["alice"]})
                welcome = await c.next()
                assert welcome == {
                    "type": "welcome", "protocol": 1, "server": "navi_trio 0.1.0",
                    "user": {"name": "alice", "role": "user"}, "llm_backend": "ollama",
                    "profiles": sorted(d.harness.runtime.config.current.profiles),
                    "default_profile": d.harness.runtime.config.current.default_profile,
                    "default_modes": dict.fromkeys(
                        d.harness.runtime.config.current.profiles, "workspace"
                    ),
                }  # fmt: skip
                assert "general" in welcome["profiles"]
                sid = await _start_session(c)
                end = await c.until_end(sid)
                assert end["text"] == "Hello there" and end["reason"] == "complete"
                seqs = [f["seq"] for f in c.frames if f.get("session_id") == sid and "seq" in f
                        and f["type"] not in ("ok",)]  # fmt: skip
                assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
                row = await d.harness.runtime.store.get_session(sid)
                assert row is not None and row.user_id == d.ids["alice"]
                listed = await c.request({"type": "sessions", "action": "list"})
                assert [(s["session_id"], s["user"], s["title"]) for s in listed["sessions"]] == [
                    (sid, "alice", "hi")  # the first message names the session
                ]
                history = await c.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
                assert [m["content"] for m in history["messages"]] == ["hi", "Hello there"]
                assert history["seq"] == end["seq"]


async def test_the_first_message_titles_the_session_once_in_one_plain_line(
    tmp_path: Path,
) -> None:
    first = "\n  \u202eFix   the\tbuild\x07 " + "x" * 200 + "\nsecond line"
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[HELLO], loop=True) as d:
            async with d.connect("alice") as c:
                sid = await _start_session(c, first)
                await c.until_end(sid)
                await c.request({"type": "message", "content": "later", "session_id": sid})
                await c.until_end(sid)
                (row,) = (await c.request({"type": "sessions", "action": "list"}))["sessions"]
                assert row["title"] == "Fix the build " + "x" * 66 + "…"
                created = await c.request({"type": "sessions", "action": "create"})
                (empty,) = [
                    s
                    for s in (await c.request({"type": "sessions", "action": "list"}))["sessions"]
                    if s["session_id"] == created["session_id"]
                ]
                assert empty["title"] == ""  # no message yet, no title


# -- auth --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first",
    [{"type": "hello", "token": "navi_wrong"}, {"type": "sessions", "action": "list"}, "nope"],
    ids=["bad-token", "not-hello", "not-json"],
)
async def test_a_bad_hello_gets_unauthorized_and_close(tmp_path: Path, first: Any) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d, d.connect(hello=False) as c:
            await c.send(first if isinstance(first, str) else json.dumps(first))
            err = await c.next()
            assert err["type"] == "error" and err["code"] == "unauthorized", err
            assert await _closed(c)


async def test_no_hello_within_10_s_gets_an_error_and_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The hello phase touches only settings: a stub runtime keeps threads (and with them
    # early clock jumps) out of this test.
    runtime = types.SimpleNamespace(settings=Settings.from_env({}), store=None)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(ApiServer(runtime, port=0).run)
            async with open_websocket_url(f"ws://127.0.0.1:{port}/") as ws:
                start = trio.current_time()
                err = json.loads(await ws.get_message())
                assert err["code"] == "unauthorized" and "10 s" in err["message"]
                assert 10 <= trio.current_time() - start < 11
                with pytest.raises(ConnectionClosed):
                    await ws.get_message()
            nursery.cancel_scope.cancel()


# -- ownership ---------------------------------------------------------------------------


async def test_another_users_session_and_tasks_are_refused(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[HELLO], loop=True) as d:
            async with d.connect("alice") as alice:
                sid = await _start_session(alice)
                await alice.until_end(sid)
            async with d.connect("bob") as bob:
                for frame in (
                    {"type": "message", "session_id": sid, "content": "mine now"},
                    {"type": "stop", "session_id": sid},
                    {"type": "compact", "session_id": sid},
                    {"type": "subscribe", "session_id": sid, "last_seq": 0},
                    {"type": "sessions", "action": "history", "session_id": sid},
                    {"type": "sessions", "action": "delete", "session_id": sid},
                    {"type": "tasks", "action": "list", "session_id": sid},
                ):
                    err = await bob.request(frame)
                    assert err["type"] == "error" and err["code"] == "forbidden", (frame, err)
                    assert err["session_id"] == sid
                listed = await bob.request({"type": "sessions", "action": "list"})
                assert listed["sessions"] == []
                err = await bob.request({"type": "tasks", "action": "check", "task_id": "t-1"})
                assert err["code"] == "not_found"
                # Nothing of bob's reached the session.
                store = d.harness.runtime.store
                assert [m["content"] for m in await store.load_messages(sid)] == [
                    "hi",
                    "Hello there",
                ]
            async with d.connect("root") as root:
                listed = await root.request({"type": "sessions", "action": "list"})
                assert [s["session_id"] for s in listed["sessions"]] == [sid]
                history = await root.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
                assert len(history["messages"]) == 2


async def test_delete_removes_messages_kv_and_folder(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[HELLO], loop=True) as d:
            store = d.harness.runtime.store
            async with d.connect("alice") as c:
                sid = await _start_session(c)
                await c.until_end(sid)
                await store.kv_set("todo", sid, [{"text": "x"}])
                await store.kv_set("task_notes", f"{sid}:t-1", {"note": 1})
                folder = d.harness.runtime.settings.session_dir(sid)
                assert folder.is_dir()  # made when its run started
                (folder / "f.txt").write_text("x")
                done = await c.request({"type": "sessions", "action": "delete", "session_id": sid})
                assert done == {"type": "sessions", "action": "delete", "session_id": sid,
                                "deleted": True, "id": done["id"]}  # fmt: skip
                assert await store.get_session(sid) is None
                assert await store.kv_get("todo", sid) is None
                assert await store.kv_list("task_notes", f"{sid}:") == []
                assert not folder.exists()
                err = await c.request({"type": "sessions", "action": "history", "session_id": sid})
                assert err["code"] == "not_found"


# -- bad frames ----------------------------------------------------------------------------


async def test_bad_frames_get_errors_and_the_connection_goes_on(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[HELLO], loop=True, ws_frame_max_bytes=2048) as d:
            async with d.connect("alice") as c:
                sid = await _start_session(c)
                await c.until_end(sid)
                cases: list[tuple[Any, str, str]] = [
                    ("{not json", "bad_frame", "not JSON"),
                    ("[1, 2]", "bad_frame", "JSON object"),
                    (b"\x00\x01binary", "bad_frame", "binary"),
                    ({"type": "fly"}, "unknown_type", "'fly'"),
                    (
                        {"type": "message", "content": 5},
                        "bad_frame",
                        "field 'content' must be a string",
                    ),
                    ({"type": "stop"}, "bad_frame", "session_id"),
                    ({"type": "tasks", "action": "boom"}, "bad_frame", "list, check, cancel"),
                    ({"type": "message", "content": "x" * 3000}, "too_large", "limit is 2048"),
                    (
                        {"type": "approve", "call_id": "c1"},
                        "bad_frame",
                        "field 'session_id' is required",
                    ),
                    ({"type": "deny", "session_id": sid, "call_id": "c1"}, "not_found", "'c1'"),
                    (
                        {"type": "message", "content": "x", "mode": "god"},
                        "bad_frame",
                        "workspace, full",
                    ),
                    ({"type": "hello", "token": "again"}, "bad_frame", "already"),
                    (
                        {"type": "message", "content": "x", "cwd": "/no/such/dir"},
                        "bad_frame",
                        "/no/such/dir",
                    ),
                    (
                        {"type": "message", "content": "x", "profile": "ghost"},
                        "bad_frame",
                        "unknown profile 'ghost'",
                    ),
                ]
                for frame, code, words in cases:
                    await c.send(frame if isinstance(frame, str | bytes) else json.dumps(frame))
                    err = await c.until_type("error")
                    assert err["code"] == code and words in err["message"], (frame, err)
                # Refused frames created nothing.
                listed = await c.request({"type": "sessions", "action": "list"})
                assert [s["session_id"] for s in listed["sessions"]] == [sid]
                # The connection and the session go on: a normal turn works.
                ok = await c.request({"type": "message", "session_id": sid, "content": "again"})
                assert ok["type"] == "ok"
                assert (await c.until_end(sid))["text"] == "Hello there"


# -- limits --------------------------------------------------------------------------------


async def test_connections_per_user_limit_closes_only_the_extra_one(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, ws_connections_per_user=1) as d:
            async with d.connect("alice") as first:
                async with d.connect("alice", hello=False) as second:
                    await second.send({"type": "hello", "token": d.tokens["alice"]})
                    err = await second.next()
                    assert err["code"] == "limit" and "connections" in err["message"]
                    assert await _closed(second)
                async with d.connect("bob") as bob:  # other users are not counted
                    assert (await bob.request({"type": "sessions", "action": "list"}))[
                        "type"
                    ] == "sessions"
                listed = await first.request({"type": "sessions", "action": "list"})
                assert listed["type"] == "sessions"
            async with d.connect("alice") as again:  # the slot came back
                assert (await again.request({"type": "sessions", "action": "list"}))[
                    "type"
                ] == "sessions"


async def test_sessions_per_user_limit(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, sessions_per_user=2) as d, d.connect("alice") as c:
            for _ in range(2):
                made = await c.request({"type": "sessions", "action": "create"})
                assert made["type"] == "session"
            err = await c.request({"type": "sessions", "action": "create"})
            assert err["code"] == "limit" and "2 sessions" in err["message"]
            err = await c.request({"type": "message", "content": "new one"})
            assert err["code"] == "limit"
            async with d.connect("bob") as bob:
                assert (await bob.request({"type": "sessions", "action": "create"}))[
                    "type"
                ] == "session"


async def test_frames_per_second_limit(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_daemon(tmp_path, ws_frames_per_sec=0.001, ws_frames_burst=3) as d,
            d.connect("alice") as c,
        ):
            for _ in range(3):
                assert (await c.request({"type": "sessions", "action": "list"}))[
                    "type"
                ] == "sessions"
            err = await c.request({"type": "sessions", "action": "list"})
            assert err["code"] == "rate_limited"
            async with d.connect("bob") as bob:  # per connection: bob is not slowed
                assert (await bob.request({"type": "sessions", "action": "list"}))[
                    "type"
                ] == "sessions"


# -- runs over the wire -------------------------------------------------------------------


async def test_queue_overflow_compact_refusal_and_stop_over_the_wire(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with _gated(tmp_path, gate, message_queue_max=2) as d, d.connect("alice") as c:
            sid = await _start_session(c, "hi")
            await gate.entered.wait()
            for text in ("A", "B", "C"):
                ok = await c.request({"type": "message", "session_id": sid, "content": text})
                assert ok["type"] == "ok" and ok["queued"] is True
            queued = [await c.until_type("message_queued") for _ in range(3)]
            assert [(f["text"], f["position"], f["dropped_total"]) for f in queued] == [
                ("A", 1, 0),
                ("B", 2, 0),
                ("C", 3, 0),
            ]
            dropped = await c.until_type("warning")
            assert dropped["code"] == "message_dropped" and "'A'" in dropped["message"]
            # The daemon's log says it too: the one word of it a killed daemon leaves.
            logged = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert [m for m in logged if sid in m and dropped["message"] in m], logged
            err = await c.request({"type": "compact", "session_id": sid})
            assert err["code"] == "busy" and "run is active" in err["message"]
            err = await c.request({"type": "sessions", "action": "delete", "session_id": sid})
            assert err["code"] == "session_busy"
            ok = await c.request({"type": "stop", "session_id": sid})
            assert ok["type"] == "ok" and ok["stopped"] is True
            assert (await c.until_end(sid))["reason"] == "stopped"
            gate.gate.set()
            # The queue drains in order: B then C (A was dropped).
            for _ in range(2):
                await c.until_end(sid)
            store = d.harness.runtime.store
            texts = [m["content"] for m in await store.load_messages(sid) if m["role"] == "user"]
            assert texts == ["hi", "B", "C"]


async def test_resubscribe_with_last_seq_replays_what_was_missed(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=[HELLO], loop=True) as d:
            async with d.connect("alice") as c:
                sid = await _start_session(c)
                await c.until_end(sid)
                first = [f for f in c.frames if f.get("seq") and f["type"] != "ok"]
                mid = first[len(first) // 2]["seq"]
            async with d.connect("alice") as c2:
                ok = await c2.request({"type": "subscribe", "session_id": sid, "last_seq": mid})
                assert ok["type"] == "ok"
                end = await c2.until_end(sid)
                replayed = [f["seq"] for f in c2.frames if f.get("session_id") == sid
                            and f["type"] not in ("ok",)]  # fmt: skip
                assert replayed == [f["seq"] for f in first if f["seq"] > mid]
                assert end["seq"] == first[-1]["seq"]


async def test_a_client_that_goes_away_leaves_the_run_and_others_alone(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with _gated(tmp_path, gate) as d:
            async with d.connect("alice") as watcher:
                async with d.connect("alice") as c:
                    sid = await _start_session(c)
                    await gate.entered.wait()
                ok = await watcher.request({"type": "subscribe", "session_id": sid})
                assert ok["type"] == "ok"
                gate.gate.set()
                assert (await watcher.until_end(sid))["text"] == "gated done"


async def test_a_failing_request_is_an_internal_error_and_the_daemon_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken() -> None:
        raise KeyError("a bug")

    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d, d.connect("alice") as c:
            monkeypatch.setattr(d.harness.runtime.store, "list_users", broken)
            err = await c.request({"type": "sessions", "action": "list"})
            assert err["code"] == "internal" and "KeyError" in err["message"]
            monkeypatch.undo()
            assert (await c.request({"type": "sessions", "action": "list"}))["type"] == "sessions"
            async with d.connect("bob") as bob:
                assert (await bob.request({"type": "sessions", "action": "create"}))[
                    "type"
                ] == "session"


async def test_cut_mid_run_then_resubscribe_gets_no_gap_and_no_duplicate(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with _gated(tmp_path, gate) as d:
            async with d.connect("alice") as c:
                sid = await _start_session(c)
                seen = await c.until_type("tool_started", session_id=sid)
                last = seen["seq"]
            # The connection is gone mid-run; the run goes on and ends.
            gate.gate.set()
            async with d.connect("alice") as c2, d.connect("alice") as c3:
                ok = await c2.request({"type": "subscribe", "session_id": sid, "last_seq": last})
                assert ok["type"] == "ok"
                await c3.request({"type": "subscribe", "session_id": sid, "last_seq": last})
                ends = [await c2.until_end(sid), await c3.until_end(sid)]
                for cl in (c2, c3):  # a round trip: whatever followed the end has arrived
                    await cl.request({"type": "sessions", "action": "list"})
                assert ends[0] == ends[1] and ends[0]["text"] == "gated done"
                got = [
                    [f["seq"] for f in cl.frames if f.get("session_id") == sid
                     and isinstance(f.get("seq"), int) and f["type"] != "ok"]
                    for cl in (c2, c3)
                ]  # fmt: skip
                # Several clients see the same frames, each seq once, increasing, from
                # after `last`; no text is missing (deltas may come merged: seq may skip).
                assert got[0] == got[1] and got[0][0] > last
                assert all(a < b for a, b in zip(got[0], got[0][1:], strict=False))
                text = "".join(f["text"] for f in c2.frames if f["type"] == "text_delta")
                assert text == "gated done"


async def test_stop_and_approvals_pass_the_frames_per_second_limit(tmp_path: Path) -> None:
    # A dropped stop let a run go on to its timeout: stop / approve / deny are exempt.
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with (
            _gated(tmp_path, gate, ws_frames_per_sec=0.001, ws_frames_burst=3) as d,
            d.connect("alice") as c,
        ):
            sid = await _start_session(c, "hi")
            await gate.entered.wait()
            limited = 0
            for _ in range(5):  # burst past the limit
                reply = await c.request({"type": "sessions", "action": "list"})
                limited += reply.get("code") == "rate_limited"
            assert limited >= 3
            for kind in ("approve", "deny"):
                err = await c.request({"type": kind, "session_id": sid, "call_id": "nope"})
                assert err["type"] == "error" and err["code"] != "rate_limited", err
            ok = await c.request({"type": "stop", "session_id": sid})
            assert ok["type"] == "ok" and ok["stopped"] is True, ok
            assert (await c.until_end(sid))["reason"] == "stopped"
            gate.gate.set()
