"""Our h11 transport checks a request's header set once (`RequestHeads`): the event it
makes is h11's own for every request, and a header value h11 refuses (a newline a
config's header could smuggle in, a NUL, a space at an end, a Content-Length that is
not digits) is refused every time, even beside a set already checked that differs only
there. Loopback only, port 0; every I/O test has an absolute timeout."""

from __future__ import annotations

import h11
import httpx
import pytest
import trio

from navi_trio.llm.client import LLMClient
from navi_trio.llm.transport import H11Transport, RequestHeads
from navi_trio.testing.fake_llm import open_fake_llm

TIMEOUT = 10
URL = "http://127.0.0.1:9/api/chat"


def _post(headers: list[tuple[bytes, bytes]], body: bytes) -> httpx.Request:
    """A POST with exactly these headers after Host (no Content-Length of httpx's)."""
    return httpx.Request(
        "POST",
        URL,
        headers=[(b"Host", b"127.0.0.1:9"), *headers],
        stream=httpx.ByteStream(body),
    )


def _plain(request: httpx.Request) -> h11.Request:
    return h11.Request(
        method=request.method, target=request.url.raw_path, headers=request.headers.raw
    )


def test_the_event_is_h11s_own_for_every_request_of_a_set() -> None:
    heads = RequestHeads()
    client = LLMClient()
    for headers in (None, {"Authorization": "Bearer k"}):
        for body in (b"{}", b'{"a": 1}', b"[" + b"1," * 500 + b"1]"):
            request = client.json_post(URL, body, headers)
            event, plain = heads.event(request), _plain(request)
            assert (event.method, event.target, event.http_version) == (
                plain.method,
                plain.target,
                plain.http_version,
            )
            assert event.headers.raw_items() == plain.headers.raw_items()
            assert list(event.headers) == list(plain.headers)  # names lower-cased as h11 does


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        (b"X-Key", b"good\r\nX-Injected: 1"),
        (b"X-Key", b"good\x00"),
        (b"X-Key", b" good"),
        (b"Content-Length", b" 2"),
        (b"Content-Length", b"2\r\nX-Injected: 1"),
    ],
)
def test_a_value_h11_refuses_is_refused_every_time_after_a_checked_set(
    name: bytes, bad: bytes
) -> None:
    heads = RequestHeads()
    good = [(b"X-Key", b"good"), (b"Content-Length", b"2")]
    heads.event(_post(good, b"{}"))  # checked and kept
    heads.event(_post(good, b"{}"))  # the kept set, Content-Length as before
    worse = [(n, bad if n == name else v) for n, v in good]
    for _ in range(2):  # refused, and not kept as checked either
        with pytest.raises(h11.LocalProtocolError):
            _plain(_post(worse, b"{}"))
        with pytest.raises(h11.LocalProtocolError):
            heads.event(_post(worse, b"{}"))
    with pytest.raises(h11.LocalProtocolError, match="conflicting Content-Length"):
        heads.event(_post([*good, (b"Content-Length", b"3")], b"{}"))  # still checked


def test_the_kept_sets_are_bounded() -> None:
    heads = RequestHeads(max_sets=3)
    for i in range(10):
        heads.event(_post([(b"X-N", str(i).encode()), (b"Content-Length", b"2")], b"{}"))
        assert len(heads._checked) <= 3


async def test_a_config_header_with_a_newline_is_refused_by_the_transport_each_time() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": "hi"}] * 2, loop=True) as server:
            async with LLMClient(transport=H11Transport()) as client:
                url = server.url + "/api/chat"
                body = b'{"model": "m", "messages": [], "stream": false}'
                for _ in range(2):
                    ok = await client.send(client.json_post(url, body, {"X-Key": "good"}))
                    await ok.aread()
                    assert ok.status_code == 200
                    smuggled = client.json_post(url, body, {"X-Key": "good\r\nX-Injected: 1"})
                    with pytest.raises(httpx.LocalProtocolError, match="Illegal header value"):
                        await client.send(smuggled)
                sent = [r["headers"] for r in server.chat_requests]
                assert len(sent) == 2 and all(h["x-key"] == "good" for h in sent)
                assert not any("x-injected" in h for h in sent)
