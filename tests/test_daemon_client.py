"""`open_daemon`, the one client of the daemon: connect and hello bounded, refusals,
requests matched by id, a frame stream without gaps or repeats, our run among others.

Rules: loopback only, port 0; every test has an absolute `trio.fail_after`. The real
daemon (tests/api_ws.py: a runtime and an ApiServer on 127.0.0.1) where the daemon's
behaviour matters; a scripted trio-websocket server where the test needs a daemon that
misbehaves (never welcomes, never answers, leaves the resubscribing to the client).
The timeouts run on the autojump clock, with no store (no thread makes it jump early).
Nothing sleeps for real; runs are held open by the `gate` tool.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from agent_tools import GateTool, call, toolset, with_tools
from api_ws import open_daemon as open_test_daemon
from test_cli import unused_port
from trio_websocket import WebSocketConnection, WebSocketRequest, serve_websocket

from navi_trio import wire
from navi_trio.api.daemon_client import OurRun, open_daemon
from navi_trio.api.our_run import Accepted
from navi_trio.api.protocol import COMMANDS
from navi_trio.core.session.broadcast import SUBSCRIBER_BUFFER
from navi_trio.errors import DaemonUnreachableError, RemoteError
from navi_trio.events import TextDelta, ThinkingDelta
from navi_trio.testing import open_fake_llm

TIMEOUT = 30
Frame = dict[str, Any]
Script = Callable[[WebSocketConnection], Awaitable[None]]


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[str]:
    """A WebSocket server on 127.0.0.1 whose every connection runs `script`; its URL."""

    async def handle(request: WebSocketRequest) -> None:
        await script(await request.accept())

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, handle, "127.0.0.1", 0, None)
        yield f"ws://127.0.0.1:{server.port}/"
        nursery.cancel_scope.cancel()


async def welcome(ws: WebSocketConnection) -> None:
    hello = json.loads(await ws.get_message())
    assert hello["type"] == "hello"
    await ws.send_message(json.dumps({"type": "welcome", "protocol": 1, "user": {"role": "user"}}))


def test_the_daemon_reads_the_client_frame_types_of_the_wire_vocabulary() -> None:
    assert tuple(COMMANDS) == wire.CLIENT_TYPES


# -- reaching the daemon ---------------------------------------------------------------


async def test_nothing_listening_is_daemon_unreachable_saying_what_to_do() -> None:
    url = f"ws://127.0.0.1:{unused_port()}/"
    with trio.fail_after(TIMEOUT), pytest.raises(DaemonUnreachableError) as caught:
        async with open_daemon(url, "t"):
            pytest.fail("connected to nothing")
    assert str(caught.value).startswith(f"no daemon answers at {url}: start one with `navi serve`")
    assert caught.value.reason and caught.value.__suppress_context__  # raised from None


async def test_a_server_that_is_not_a_daemon_is_named_as_such() -> None:
    """A `--url` at some other HTTP server (the fake LLM here): said plainly, not as
    trio-websocket's `ConnectionRejected` with its headers and body."""
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([]) as server:
            url = server.url.replace("http://", "ws://") + "/"
            with pytest.raises(DaemonUnreachableError) as caught:
                async with open_daemon(url, "t"):
                    pytest.fail("connected to an HTTP server")
    message = str(caught.value)
    assert message.startswith(f"{url} is not a navi daemon (it answered the WebSocket handshake")
    assert "HTTP 200" in message and "ConnectionRejected" not in message


async def test_a_server_that_never_finishes_the_handshake_is_given_up_on_in_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()  # takes the TCP connection, never answers the upgrade

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            start = trio.current_time()
            with pytest.raises(DaemonUnreachableError, match="no daemon answers"):
                async with open_daemon(f"ws://127.0.0.1:{port}/", "t", connect_timeout=4):
                    pass
            assert 4 <= trio.current_time() - start < 5
            nursery.cancel_scope.cancel()


async def test_a_daemon_that_never_welcomes_is_given_up_on_in_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def mute(ws: WebSocketConnection) -> None:
        await ws.get_message()  # the hello, never answered
        await trio.sleep_forever()

    with trio.fail_after(TIMEOUT):
        async with scripted(mute) as url:
            start = trio.current_time()
            with pytest.raises(DaemonUnreachableError, match="did not answer the hello within 7 s"):
                async with open_daemon(url, "t", hello_timeout=7):
                    pass
            assert 7 <= trio.current_time() - start < 8


async def test_a_refused_hello_is_the_remote_error_with_its_wire_code(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_test_daemon(tmp_path) as d:
            with pytest.raises(RemoteError) as caught:
                async with open_daemon(d.url, "navi_not_a_token"):
                    pytest.fail("welcomed with a wrong token")
            assert caught.value.code == "unauthorized"
            async with open_daemon(d.url, d.tokens["alice"]) as daemon:
                assert daemon.role == "user" and daemon.welcome["protocol"] == wire.PROTOCOL_VERSION


# -- requests --------------------------------------------------------------------------


async def test_a_reply_is_matched_by_its_id_and_the_frames_before_it_wait(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_test_daemon(tmp_path) as d, open_daemon(d.url, d.tokens["alice"]) as c:
            # A frame of the caller's own, answered first: not the reply asked for.
            await c.send({**wire.sessions_list(), "id": "mine"})
            tasks = await c.request(wire.tasks_list(None))
            assert tasks["type"] == "tasks" and tasks["id"] != "mine"
            kept = await c.receive()
            assert (kept["type"], kept["id"]) == ("sessions", "mine")
            with pytest.raises(RemoteError) as caught:
                await c.request(wire.history("alice.nosuch"))
            assert caught.value.code == "not_found"
            made = await c.send_message("hi", session_id="alice.r1")
            assert (made.session_id, made.created, made.queued) == ("alice.r1", True, False)


async def test_a_request_nobody_answers_is_given_up_on_in_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def deaf(ws: WebSocketConnection) -> None:
        await welcome(ws)
        while True:
            await ws.get_message()

    with trio.fail_after(TIMEOUT):
        async with scripted(deaf) as url, open_daemon(url, "t") as c:
            start = trio.current_time()
            with pytest.raises(DaemonUnreachableError, match="did not answer 'sessions' within 5"):
                await c.request(wire.sessions_list(), timeout=5)
            assert 5 <= trio.current_time() - start < 6


# -- the frame stream ------------------------------------------------------------------


def _gated(tmp_path: Path, gate: GateTool, texts: list[str]) -> Any:
    replies = [call("gate"), *({"text": t} for t in texts)]
    return open_test_daemon(
        tmp_path, replies=replies, tools=toolset(gate), profiles={"general": with_tools(["gate"])}
    )


async def _until_end(c: Any, run: OurRun | None = None) -> list[Frame]:
    """The session frames up to the top-level stream_end (of `run`, when given)."""
    frames: list[Frame] = []
    while True:
        frame = await c.receive()
        if run is not None and not run.ours(frame):
            continue
        frames.append(frame)
        if wire.is_top_end(frame) and (run is None or run.ended):
            return frames


async def test_a_lagged_stream_resumes_from_the_last_seq_without_gap_or_repeat(
    tmp_path: Path,
) -> None:
    gate = GateTool()
    with trio.fail_after(TIMEOUT):
        async with (
            _gated(tmp_path, gate, ["done"]) as d,
            open_daemon(d.url, d.tokens["alice"]) as c,
        ):
            await c.send_message("hi", session_id="alice.lag")
            await gate.entered.wait()
            actor = d.harness.runtime.sessions.actor("alice.lag")
            assert actor is not None
            # More unmergeable frames at once than this connection's subscriber holds: the
            # daemon cuts it off (lagged), and both it and the client subscribe again.
            for i in range(SUBSCRIBER_BUFFER + 300):
                actor.publish((ThinkingDelta, TextDelta)[i % 2](f"w{i} "))
            gate.gate.set()
            frames = await _until_end(c)
    assert [f["type"] for f in frames].count("lagged") == 1
    seqs = [f["seq"] for f in frames if wire.is_session_frame(f)]
    assert seqs == sorted(set(seqs)), "a frame came twice"
    # No gap: every word once, in order (a delta merged with the next keeps both).
    words = "".join(f["text"] for f in frames if f["type"] in ("text_delta", "thinking_delta"))
    assert words == "".join(f"w{i} " for i in range(SUBSCRIBER_BUFFER + 300)) + "done"


async def test_after_lagged_the_client_subscribes_again_from_its_last_seq() -> None:
    # A daemon that leaves the resubscribing to the client: frames 1-3, lagged, and the
    # rest only for a subscribe from 3 (with the epoch), overlapping what was sent.
    asked: list[Frame] = []

    def frame(seq: int, kind: str = "text_delta") -> str:
        body = {"type": kind, "session_id": "s", "seq": seq, "epoch": "e", "text": f"{seq} "}
        return json.dumps({**body, "is_subagent": False})

    async def cut_off(ws: WebSocketConnection) -> None:
        await welcome(ws)
        for seq in (1, 2, 3):
            await ws.send_message(frame(seq))
        await ws.send_message(
            json.dumps({"type": "lagged", "session_id": "s", "missed_from": 4, "missed_to": 6})
        )
        again = json.loads(await ws.get_message())
        asked.append(again)
        await ws.send_message(json.dumps({"type": "ok", "id": again.get("id")}))
        for seq in range(again["last_seq"] + 1, 7):
            await ws.send_message(frame(seq))
        await ws.send_message(frame(6))  # sent twice: dropped
        await ws.send_message(frame(7, "stream_end"))
        await trio.sleep_forever()

    with trio.fail_after(TIMEOUT):
        async with scripted(cut_off) as url, open_daemon(url, "t") as c:
            frames = await _until_end(c)
    assert [(f["type"], f.get("seq")) for f in frames] == [
        *(("text_delta", n) for n in (1, 2, 3)), ("lagged", None),
        *(("text_delta", n) for n in (4, 5, 6)), ("stream_end", 7),
    ]  # fmt: skip
    assert [(a["type"], a["last_seq"], a.get("epoch")) for a in asked] == [("subscribe", 3, "e")]


async def test_a_resync_is_handed_on_and_the_stream_goes_on_from_its_seq(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_test_daemon(tmp_path, replies=[{"text": "one"}, {"text": "two"}]) as d:
            async with open_daemon(d.url, d.tokens["alice"]) as first:
                await first.send_message("hi", session_id="alice.rs")
                ended = (await _until_end(first))[-1]
            async with open_daemon(d.url, d.tokens["alice"]) as c:
                # A seq this daemon never sent (another life's, no epoch): resync.
                await c.send(wire.subscribe("alice.rs", ended["seq"] + 1000))
                resync = await c.receive()
                while resync["type"] != "resync":
                    resync = await c.receive()
                assert resync["seq"] == ended["seq"] and resync["epoch"] == ended["epoch"]
                await c.send_message("again", session_id="alice.rs")
                frames = await _until_end(c)
    assert frames[0]["seq"] == ended["seq"] + 1 and frames[-1]["text"] == "two"


async def test_our_run_is_followed_behind_the_runs_queued_ahead_of_it(tmp_path: Path) -> None:
    gate = GateTool()
    queued: list[int] = []
    with trio.fail_after(TIMEOUT):
        async with _gated(tmp_path, gate, ["first done", "second done", "ours done"]) as d:
            async with d.connect("alice") as alice:
                await alice.request(wire.message("hi", "alice.q"))
                await gate.entered.wait()
                ahead = await alice.request(wire.message("before us", "alice.q"))
                assert ahead["queued"] is True
                async with open_daemon(d.url, d.tokens["alice"]) as c:
                    accepted = await c.send_message("thanks", session_id="alice.q")
                    assert accepted.queued
                    run = OurRun.of(accepted, "thanks", queued.append)
                    gate.gate.set()
                    ours = await _until_end(c, run)
    assert queued == [2]  # the running turn and one queued message first
    ends = [f for f in ours if f["type"] == "stream_end"]
    assert [e["text"] for e in ends] == ["ours done"] and ours[-1] is ends[0]
    texts = "".join(f.get("text", "") for f in ours if f["type"] == "text_delta")
    assert "first" not in texts and "second" not in texts
    assert not run.running and run.ended


async def test_the_ok_names_the_seq_after_which_the_messages_own_frames_come(
    tmp_path: Path,
) -> None:
    """The ok to a message carries the session's seq (and epoch) when the daemon took it:
    what the session published before is not the message's; its message_queued, or its
    run, comes after. So a client that gets the ok after those frames tells them apart."""
    gate = GateTool()
    frames: list[Frame] = []
    with trio.fail_after(TIMEOUT):
        async with (
            _gated(tmp_path, gate, ["first done", "second done", "third done"]) as d,
            open_daemon(d.url, d.tokens["alice"]) as c,
        ):
            first = await c.send_message("hi", session_id="alice.seq")
            await gate.entered.wait()
            second = await c.send_message("and then", session_id="alice.seq")
            gate.gate.set()
            run = OurRun.of(second, "and then")
            while not run.ended:
                frames.append(await c.receive())
                run.ours(frames[-1])
            # The run said its end and still saves: wait until the session is idle, so
            # the third message runs at once (else it queues, at position 0).
            await d.harness.runtime.sessions.actor("alice.seq").idle.wait()
            third = await c.send_message("last", session_id="alice.seq")
            ours = await _until_end(c, OurRun.of(third, "last"))
    assert first.seq == 0 and second.queued and not third.queued
    seqs = [f["seq"] for f in frames if wire.is_session_frame(f)]
    before = [f for f in frames if wire.is_session_frame(f) and f["seq"] <= (second.seq or 0)]
    assert before and "tool_started" in [f["type"] for f in before]  # the first run's
    after = next(f for f in frames if wire.is_session_frame(f) and f["seq"] > (second.seq or 0))
    assert after["type"] == "message_queued" and after["text"] == "and then"
    assert after["epoch"] == second.epoch == third.epoch
    assert third.seq is not None and third.seq >= max(seqs)  # after the second run
    assert ours[0]["seq"] == third.seq + 1 and ours[-1]["text"] == "third done"


def test_a_follower_counts_a_message_dropped_ahead_and_ends_when_its_own_is_dropped() -> None:
    """The queue's cap drops the oldest waiting message: one run fewer ends before
    ours; when the warning names ours, our message never runs and the follow ends."""
    seq = iter(range(1, 100))

    def frame(type_: str, **fields: Any) -> Frame:
        return {"type": type_, "session_id": "s", "seq": next(seq), **fields}

    def dropped(text: str) -> Frame:
        return frame("warning", code="message_dropped", message=(
            f"the queue was full (2 waiting, NAVI_MESSAGE_QUEUE_MAX): the oldest waiting, "
            f"the message {text!r}, was dropped and will not run (1 dropped so far)"
        ))  # fmt: skip

    accepted = Accepted("s", created=False, queued=True, on_busy="enqueue")
    run = OurRun.of(accepted, "mine")
    assert not run.ours(frame("message_queued", text="mine", position=3))
    assert not run.ours(dropped("an older one"))  # 2 runs ahead now, not 3
    assert not run.ours(dropped("mine, but not quite"))  # another one, not ours: 1 ahead
    assert not run.ours(frame("stream_end", is_subagent=False))  # the running turn's
    assert run.ours(frame("text_delta", text="ours"))
    assert run.running and not run.dropped
    gone = OurRun.of(accepted, "mine too")
    assert not gone.ours(frame("message_queued", text="mine too", position=2))
    assert gone.ours(dropped("mine too"))
    assert gone.dropped and gone.ended and not gone.running
    # A stop's drop of a kept message is another warning: not the cap's.
    kept = OurRun.of(accepted, "kept")
    assert not kept.ours(frame("message_queued", text="kept", position=1))
    assert not kept.ours(frame("warning", code="message_dropped", message="dropped (stopped)"))
    assert not kept.dropped
