"""A session's frame written to the socket in the publisher's own call.

While a connection's writer waits with nothing queued and nothing is being sent, a
frame its pump is handed goes out at once: wsproto makes its bytes and the socket takes
them, with no task switch to the writer. What the socket does not take stays pending in
the stream under trio-websocket (`ReplayStream`), and every later send puts it first,
so the bytes on the wire keep their order whoever sends next.

Rules: real sockets on 127.0.0.1 (or a socket pair), each test bounded by `fail_after`.
"""

from __future__ import annotations

import socket
from pathlib import Path

import trio
import trio.testing
from api_ws import open_daemon
from hypothesis import given
from hypothesis import strategies as st
from test_output_steps import Steps
from trio_websocket import WebSocketConnection
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage
from wsproto.extensions import PerMessageDeflate

from navi_trio.api import connection
from navi_trio.api.metrics import DaemonMetrics
from navi_trio.api.outbox import Outbox
from navi_trio.api.web import ReplayStream
from navi_trio.events import TextDelta

TIMEOUT = 60
# Encoded sizes where a frame's header grows ("é" is two bytes in UTF-8).
EDGES = [125, 126, 127, 65_535, 65_536]
FRAMES = 50


async def test_frames_published_while_the_writer_waits_reach_the_client_without_it(
    tmp_path: Path,
) -> None:
    """FRAMES deltas published in one go, the writer waiting: the client gets each of
    them, in order, the writer task takes not one step, and each counts as sent."""
    metrics = DaemonMetrics()
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, metrics=metrics, replies=[{"text": "ready"}]) as d:
            async with d.connect("alice") as c:
                created = await c.request({"type": "message", "content": "hi"})
                sid = str((await c.until_type("ok", id=created["id"]))["session_id"])
                await c.until_end(sid)
                actor = d.harness.runtime.sessions.actor(sid)
                assert actor is not None
                await trio.testing.wait_all_tasks_blocked()
                sent = metrics.frames_sent.n
                steps = Steps()
                trio.lowlevel.add_instrument(steps)
                try:
                    for i in range(FRAMES):
                        actor.publish(TextDelta(text=f"t{i} "))
                    got = [await c.until_type("text_delta", text=f"t{i} ") for i in range(FRAMES)]
                finally:
                    trio.lowlevel.remove_instrument(steps)
                assert metrics.frames_sent.n - sent == FRAMES
    seqs = [int(str(f["seq"])) for f in got]
    assert seqs == list(range(seqs[0], seqs[0] + FRAMES)), seqs
    writer = [n for n in steps.steps if n.endswith("Connection._writer")]
    assert not writer, {n: steps.steps[n] for n in writer}


async def test_frames_sent_at_once_count_in_the_outbox_until_the_writer_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A burst written at once meets the outbox's bound where queued frames would have:
    past it frames are queued, then refused (the pump's queue takes them, then lagged),
    and room comes back when the writer has run."""
    outbox = Outbox(3, 10**6)
    got: list[str | None] = []
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:

            async def writer() -> None:
                got.append(await outbox.next())

            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(3):
                assert outbox.may_send_at_once("f")
                outbox.sent_at_once("f")
            assert not outbox.may_send_at_once("f")
            assert outbox.put_nowait("queued")  # nothing queued: it goes, the writer woken
            assert not outbox.put_nowait("more")
        assert got == ["queued"]
        assert outbox.put_nowait("more")  # the writer ran: the frames sent have gone
        assert not outbox.may_send_at_once("f")  # the writer does not wait now


async def _pair() -> tuple[ReplayStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    return ReplayStream(trio.SocketStream(a), b""), trio.SocketStream(b)


async def _read(stream: trio.SocketStream, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        got += await stream.receive_some()
    return bytes(got)


async def test_what_the_socket_does_not_take_goes_before_the_next_send() -> None:
    """The peer does not read: frames written at once until the socket takes only part
    of one; the rest is pending, nothing else is written at once meanwhile, and the next
    send (another task's, as trio-websocket's pong would be) puts the rest first."""
    with trio.fail_after(TIMEOUT):
        wire, peer = await _pair()
        written: list[bytes] = []
        for i in range(10_000):
            assert wire.can_write_now()
            frame = bytes([65 + i % 26]) * 1000
            written.append(frame)
            if not wire.write_now(frame):
                break
        assert wire.pending, "the socket took every frame"
        assert not wire.can_write_now()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wire.send_all, b"after")
            got = await _read(peer, sum(map(len, written)) + len(b"after"))
        assert got == b"".join(written) + b"after"
        assert not wire.pending
        assert wire.can_write_now()


async def test_a_flush_sends_the_rest_alone_and_a_closed_socket_is_never_written() -> None:
    with trio.fail_after(TIMEOUT):
        wire, peer = await _pair()
        written = []
        while True:
            written.append(b"x" * 1000)
            if not wire.write_now(written[-1]):
                break
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wire.flush)
            got = await _read(peer, sum(map(len, written)))
        assert got == b"".join(written)
        await wire.flush()  # nothing pending: nothing sent, no error
        await wire.inner.aclose()
        assert not wire.write_now(b"lost")
        assert wire.pending == b"lost"
        try:
            await wire.flush()
        except trio.ClosedResourceError:
            pass
        else:
            raise AssertionError("a flush on a closed stream did not fail")


def test_trio_websocket_keeps_its_wsproto_state_where_the_connection_reads_it() -> None:
    proto = WSConnection(ConnectionType.SERVER)
    ws = WebSocketConnection(trio.testing.memory_stream_pair()[0], proto)
    assert connection._wsproto(ws) is proto


def _wsproto_frame(text: str) -> bytes:
    server = WSConnection(ConnectionType.SERVER)
    client = WSConnection(ConnectionType.CLIENT)
    server.receive_data(client.send(Request(host="h", target="/")))
    assert [type(e) for e in server.events()] == [Request]
    server.send(AcceptConnection())
    return server.send(TextMessage(data=text))


@given(
    st.one_of(
        st.text(),
        st.integers(0, 70_000).map(lambda n: "x" * n),
        st.sampled_from(EDGES).map(lambda n: "é" * (n // 2) + "x" * (n % 2)),
    )
)
def test_a_text_frame_is_the_bytes_wsproto_makes(text: str) -> None:
    assert connection.text_frame(text) == _wsproto_frame(text)


async def test_the_server_accepts_no_extension_so_its_own_frames_stay_plain(
    tmp_path: Path,
) -> None:
    """A client offering permessage-deflate gets a connection without it: the frames
    the daemon makes itself (`text_frame`) are what wsproto would have sent."""
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path) as d:
            stream = await trio.open_tcp_stream("127.0.0.1", d.port)
            async with stream:
                ws = WSConnection(ConnectionType.CLIENT)
                host = f"127.0.0.1:{d.port}"
                offer = Request(host=host, target="/", extensions=[PerMessageDeflate()])
                await stream.send_all(ws.send(offer))
                accepted: list[AcceptConnection] = []
                while not accepted:
                    data = await stream.receive_some()
                    assert data, "the daemon hung up"
                    ws.receive_data(data)
                    accepted = [e for e in ws.events() if isinstance(e, AcceptConnection)]
    assert accepted[0].extensions == []
