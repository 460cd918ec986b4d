"""`H11Transport` on its own: its pool (an idle connection the server closed is not
reused, idle ones expire, the cap and the pool timeout), what it makes of servers that
break HTTP (garbage, a head too big, a body cut short), a body framed by the close, and
TLS (a throwaway self-signed certificate made with the openssl command).

Rules: loopback only, port 0, servers in the same trio run; the autojump clock where
time matters; every test has an absolute timeout.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import h11
import httpx
import pytest
import trio
import trio.testing

from navi_trio.llm.base import DoneChunk, TextChunk
from navi_trio.llm.client import LLMClient
from navi_trio.llm.http import stream_chunks
from navi_trio.llm.ollama import OllamaParser
from navi_trio.llm.transport import MAX_HEAD_BYTES, H11Transport, _Conn, direct_body
from navi_trio.testing.fake_llm import FakeLLMServer, open_fake_llm

TIMEOUT = 20
LIMIT = 600  # virtual seconds, under the autojump clock
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

Handler = Callable[[trio.abc.Stream], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server on 127.0.0.1 running `handler` per connection: (its URL, a list
    holding the count of connections accepted)."""
    accepted = [0]

    async def counted(stream: trio.SocketStream) -> None:
        accepted[0] += 1
        try:
            await handler(stream)
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, counted, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}", accepted
        nursery.cancel_scope.cancel()


async def read_head(stream: trio.abc.Stream, conn: h11.Connection) -> None:
    """Read one whole request (head and body) from `stream`, or until the client closes
    (h11 then says so at every call: no busy loop for a test that failed)."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(bytes(await stream.receive_some(65536)))
        elif type(event) is h11.EndOfMessage or type(event) is h11.ConnectionClosed:
            return


async def answer(stream: trio.abc.Stream, conn: h11.Connection, body: bytes) -> None:
    head = h11.Response(status_code=200, headers=[("Content-Length", str(len(body)))])
    await stream.send_all(conn.send(head) + conn.send(h11.Data(data=body)))
    await stream.send_all(conn.send(h11.EndOfMessage()))


async def post(client: httpx.AsyncClient, url: str) -> bytes:
    response = await client.post(f"{url}/api/chat", json=BODY)
    return response.content


async def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    """A server closing its side after an answer (a keep-alive timeout): the next request
    takes a fresh connection at once, never sending on the dead one first."""
    requests = [0]

    async def one_answer_then_close(stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER)
        await read_head(stream, conn)
        requests[0] += 1
        await answer(stream, conn, b"{}")  # no "Connection: close": h11 keeps it alive

    with trio.fail_after(TIMEOUT):
        async with raw_server(one_answer_then_close) as (url, accepted):
            transport = H11Transport()
            async with LLMClient(transport=transport) as client:
                assert await post(client, url) == b"{}"
                await trio.testing.wait_all_tasks_blocked()  # the server has closed
                assert await post(client, url) == b"{}"
            assert (accepted[0], requests[0], transport.connections_made) == (2, 2, 2)


async def test_idle_connections_expire(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(LIMIT):
        async with open_fake_llm([{"text": "a"}] * 3) as server:
            transport = H11Transport(keepalive_expiry=5)
            async with LLMClient(transport=transport) as client:
                await post(client, server.url)
                await trio.sleep(4)
                await post(client, server.url)
                assert server.connections == 1
                await trio.sleep(6)
                await post(client, server.url)
                assert server.connections == 2
                assert transport.idle_connections == 1  # the expired one was closed


async def test_the_connection_cap_makes_a_request_wait_within_the_pool_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stall = {"text": "never", "stall": True}
    with trio.fail_after(LIMIT):
        async with open_fake_llm([stall, {"text": "b"}]) as server:
            transport = H11Transport(max_connections=1)
            async with LLMClient(transport=transport, timeout=httpx.Timeout(None)) as client:
                first = await client.send(
                    client.build_request("POST", f"{server.url}/api/chat", json=BODY), stream=True
                )
                with pytest.raises(httpx.PoolTimeout):
                    await client.post(
                        f"{server.url}/api/chat", json=BODY, timeout=httpx.Timeout(None, pool=3)
                    )
                await first.aclose()  # its slot (and its cut connection) freed
                second = await client.post(f"{server.url}/api/chat", json=BODY)
                assert second.status_code == 200
                assert server.connections == 2


async def test_closing_the_transport_closes_every_connection() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": "a"}, {"text": "b", "stall": True}]) as server:
            transport = H11Transport()
            client = LLMClient(transport=transport)
            await post(client, server.url)  # one idle connection
            streaming = await client.send(
                client.build_request("POST", f"{server.url}/api/chat", json=BODY), stream=True
            )
            await client.aclose()
            await server.wait_disconnects(1)  # the one in use: its reply was cut
            assert transport.idle_connections == 0
            with pytest.raises(httpx.ReadError):
                await streaming.aread()
            with pytest.raises(RuntimeError, match="closed"):
                await transport.handle_async_request(httpx.Request("GET", server.url))


RESET = b"(reset)"  # not bytes to send: close with an RST (SO_LINGER 0)


@pytest.mark.parametrize(
    ("sent", "match"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "illegal status line"),  # not HTTP at all
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * (4 * MAX_HEAD_BYTES) + b"\r\n\r\n", "too long"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "incomplete"),
        # Closed or reset without a byte of answer: what llm/http.py sends once more.
        (b"", "Server disconnected without sending a response"),
        (RESET, "Server disconnected without sending a response"),
    ],
    ids=["not-http", "head-too-big", "body-cut", "no-answer", "reset"],
)
async def test_a_server_breaking_http_is_a_remote_protocol_error(sent: bytes, match: str) -> None:
    async def bad(stream: trio.abc.Stream) -> None:
        await read_head(stream, h11.Connection(h11.SERVER))
        if sent == RESET:
            assert isinstance(stream, trio.SocketStream)
            stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif sent:
            await stream.send_all(sent)

    with trio.fail_after(TIMEOUT):
        async with raw_server(bad) as (url, _):
            transport = H11Transport()
            async with LLMClient(transport=transport) as client:
                with pytest.raises(httpx.RemoteProtocolError, match=match):
                    await post(client, url)
            assert transport.idle_connections == 0


async def test_a_body_ended_by_the_close_is_read_whole() -> None:
    """HTTP/1.0 style: no Content-Length, no chunks; the body is what comes before EOF."""

    async def unframed(stream: trio.abc.Stream) -> None:
        await read_head(stream, h11.Connection(h11.SERVER))
        await stream.send_all(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"a": ')
        await trio.testing.wait_all_tasks_blocked()
        await stream.send_all(b"1}")

    with trio.fail_after(TIMEOUT):
        async with raw_server(unframed) as (url, accepted):
            transport = H11Transport()
            async with LLMClient(transport=transport) as client:
                assert await post(client, url) == b'{"a": 1}'
                assert await post(client, url) == b'{"a": 1}'
            assert accepted[0] == 2  # never kept: the server said close


async def test_a_body_read_straight_from_its_connection_is_aiter_raws_and_keeps_it() -> None:
    """`direct_body` (how `stream_chunks` reads this transport's answers): each read as
    ``aiter_raw`` gives it, the body read once only, and the connection kept for the
    next request once the response is closed. Another transport's response has none."""

    async def in_two_parts(stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER)
        for _ in range(2):
            await read_head(stream, conn)
            head = h11.Response(status_code=200, headers=[("Transfer-Encoding", "chunked")])
            await stream.send_all(conn.send(head) + conn.send(h11.Data(data=b'{"a": ')))
            await trio.testing.wait_all_tasks_blocked()  # the client waits for more
            await stream.send_all(conn.send(h11.Data(data=b"1}")) + conn.send(h11.EndOfMessage()))
            conn.start_next_cycle()

    with trio.fail_after(TIMEOUT):
        async with raw_server(in_two_parts) as (url, accepted):
            transport = H11Transport()
            async with LLMClient(transport=transport) as client:
                for _ in range(2):
                    request = client.build_request("POST", f"{url}/api/chat", json=BODY)
                    response = await client.send(request, stream=True)
                    reads = direct_body(response)
                    assert reads is not None
                    assert [part async for part in reads] == [b'{"a": ', b"1}"]
                    with pytest.raises(httpx.StreamConsumed):
                        direct_body(response)
                    await response.aclose()
            assert (accepted[0], transport.connections_made) == (1, 1)
        mock = httpx.MockTransport(lambda request: httpx.Response(200, content=b"{}"))
        async with httpx.AsyncClient(transport=mock) as other:
            response = await other.send(other.build_request("GET", url), stream=True)
            assert direct_body(response) is None
            await response.aclose()


async def test_a_plain_connection_reads_what_is_there_and_nothing_once_cancelled() -> None:
    """The direct read of a plain TCP connection keeps trio's steps: a read cancelled
    before it starts takes nothing (the bytes wait for the next), bytes already there
    come at once, and a closed connection is an error, not a read of another file."""
    ours, theirs = trio.socket.socketpair()
    with ours, theirs:
        conn = _Conn(trio.SocketStream(ours), ours, (b"http", "127.0.0.1", 1))
        await theirs.send(b"abc")
        with trio.CancelScope() as stop:
            stop.cancel()
            await conn._read()
        assert stop.cancelled_caught
        assert await conn._read() == b"abc"
        await theirs.send(b"def")
        assert await conn._read() == b"def"
        conn.close()
        with pytest.raises(trio.ClosedResourceError):
            await conn._read()


async def test_a_plain_connections_reads_of_bytes_there_let_other_tasks_run() -> None:
    """Bytes already there are read at once, and each such read is still a turn for the
    other tasks (trio's own read yields too): a fast stream does not starve a Stop."""
    mine, other = socket.socketpair()
    ours = trio.socket.from_stdlib_socket(mine)
    with ours, other:
        conn = _Conn(trio.SocketStream(ours), ours, (b"http", "127.0.0.1", 1))
        turns = [0]

        async def another_task() -> None:
            while True:
                turns[0] += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(another_task)
            for _ in range(3):
                other.send(b"x")  # there before the read: the read's fast path
                assert await conn._read() == b"x"
            assert turns[0] >= 1
            nursery.cancel_scope.cancel()


async def test_bytes_read_as_a_deadline_passes_are_not_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A read that took bytes already there returns them even when its scope is
    cancelled at the turn it gives the others (the cancel lands at the next read)."""
    mine, other = socket.socketpair()
    ours = trio.socket.from_stdlib_socket(mine)
    with ours, other:
        conn = _Conn(trio.SocketStream(ours), ours, (b"http", "127.0.0.1", 1))
        other.send(b"abc")
        got: bytes | bytearray = b""
        with trio.CancelScope(deadline=trio.current_time() + 1) as scope:
            # Passed, not cancelled yet: the run loop cancels it at the next turn, the read's.
            autojump_clock.jump(1)
            got = await conn._read()
            await trio.sleep_forever()
        assert scope.cancelled_caught
        assert got == b"abc"


async def test_a_plain_connection_readable_then_not_waits_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A socket said readable whose read then finds nothing (another reader took the
    bytes, a spurious wake-up) is waited on again: not taken for the end of the body."""
    mine, other = socket.socketpair()
    ours = trio.socket.from_stdlib_socket(mine)
    real_read = os.read  # the transport's (`_Conn._read` calls os.read)
    calls = [0]

    def read(fd: int, n: int) -> bytes:
        calls[0] += 1
        if calls[0] == 2:  # the first read after the wait: nothing there after all
            raise BlockingIOError
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", read)
    with ours, other:
        conn = _Conn(trio.SocketStream(ours), ours, (b"http", "127.0.0.1", 1))

        async def send_once_waiting() -> None:
            await trio.testing.wait_all_tasks_blocked()  # the read waits for the socket
            other.send(b"abc")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_once_waiting)
            assert await conn._read() == b"abc"
        assert calls[0] == 3


async def test_a_read_timeout_given_to_the_client_ends_a_stalled_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The backends set no read timeout (the stream guard times a stream), but the
    transport keeps httpx's: a server that stops answering is a ReadTimeout once it passed."""
    stall = {"text": "never", "stall": True}
    with trio.fail_after(LIMIT):
        async with open_fake_llm([stall]) as server:
            timeout = httpx.Timeout(None, read=5)
            async with LLMClient(transport=H11Transport(), timeout=timeout) as client:
                start = trio.current_time()
                with pytest.raises(httpx.ReadTimeout):
                    await post(client, server.url)
                assert trio.current_time() - start == pytest.approx(5)


async def test_a_compressed_stream_through_this_transport_is_read_decompressed() -> None:
    """`stream_chunks` reads this transport's body straight from its connection only when
    it is the bytes as sent: a gzipped answer goes through httpx's decoder."""
    lines = [
        {"message": {"role": "assistant", "content": "hi"}, "done": False},
        {"message": {"role": "assistant", "content": ""}, "done": True},
    ]
    body = gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode())

    async def gzipped(stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER)
        await read_head(stream, conn)
        headers = [("Content-Length", str(len(body))), ("Content-Encoding", "gzip")]
        head = h11.Response(status_code=200, headers=headers)
        await stream.send_all(conn.send(head) + conn.send(h11.Data(data=body)))
        await stream.send_all(conn.send(h11.EndOfMessage()))

    with trio.fail_after(TIMEOUT):
        async with raw_server(gzipped) as (url, _):
            async with LLMClient(transport=H11Transport()) as client:
                parser = OllamaParser("m", url)
                chunks = [c async for c in stream_chunks(client, f"{url}/api/chat", {}, parser)]
    assert chunks[0] == TextChunk("hi") and isinstance(chunks[-1], DoneChunk)


# --- TLS ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (cert, key)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed: no certificate for the TLS tests")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout", str(key), "-out",
         str(cert), "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


@asynccontextmanager
async def tls_fake_llm(
    certificate: tuple[Path, Path], replies: list[dict[str, object]]
) -> AsyncIterator[tuple[FakeLLMServer, str]]:
    """The fake LLM server behind TLS: (the server, its https URL)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    server = FakeLLMServer(replies)
    async with trio.open_nursery() as nursery:
        tcp = await trio.open_tcp_listeners(0, host="127.0.0.1")
        # https_compatible: the server closes without TLS close_notify, as many do.
        tls = [trio.SSLListener(t, context, https_compatible=True) for t in tcp]
        nursery.start_soon(trio.serve_listeners, server._handle, tls)
        yield server, f"https://127.0.0.1:{tcp[0].socket.getsockname()[1]}"
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_https_streams_and_reuses_its_connection(certificate: tuple[Path, Path]) -> None:
    trusted = ssl.create_default_context(cafile=str(certificate[0]))
    with trio.fail_after(TIMEOUT):
        async with tls_fake_llm(certificate, [{"text": "one two"}, {"text": "three"}]) as (
            server,
            url,
        ):
            transport = H11Transport(verify=trusted)
            async with LLMClient(transport=transport) as client:
                for _ in range(2):
                    async with client.stream("POST", f"{url}/api/chat", json=BODY) as response:
                        assert response.http_version == "HTTP/1.1"
                        lines = [line async for line in response.aiter_lines() if line]
                    assert '"done": true' in lines[-1].replace('":true', '": true')
            assert server.connections == 1 and transport.connections_made == 1


@pytest.mark.slow
async def test_https_refuses_a_certificate_it_does_not_trust(
    certificate: tuple[Path, Path],
) -> None:
    with trio.fail_after(TIMEOUT):
        async with tls_fake_llm(certificate, [{"text": "x"}]) as (server, url):
            async with LLMClient(transport=H11Transport()) as client:  # the system's CAs
                with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                    await post(client, url)
            assert server.requests == []


@pytest.mark.slow
async def test_https_reads_a_body_ended_by_a_close_without_close_notify(
    certificate: tuple[Path, Path],
) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)

    async def unframed(stream: trio.abc.Stream) -> None:
        tls = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
        await read_head(tls, h11.Connection(h11.SERVER))
        await tls.send_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{}")
        await tls.aclose()  # https_compatible: the TCP close alone, no close_notify

    trusted = ssl.create_default_context(cafile=str(certificate[0]))
    with trio.fail_after(TIMEOUT):
        async with raw_server(unframed) as (url, _):
            async with LLMClient(transport=H11Transport(verify=trusted)) as client:
                assert await post(client, url.replace("http:", "https:")) == b"{}"
