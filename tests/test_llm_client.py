"""The LLM backends' HTTP client: the same chat requests, built cheaply, and no cookies.

Loopback only, port 0; every I/O test has an absolute timeout.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from navi_trio.llm.base import ChatRequest, DoneChunk, TextChunk
from navi_trio.llm.client import LLMClient
from navi_trio.llm.factory import make_client
from navi_trio.llm.ollama import OllamaBackend
from navi_trio.settings import Settings
from navi_trio.testing.fake_llm import open_fake_llm

TIMEOUT = 10
URL = "http://127.0.0.1:9/api/chat"


@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer k"}])
def test_a_chat_post_is_the_request_build_request_makes(headers: dict[str, str] | None) -> None:
    client = LLMClient(timeout=httpx.Timeout(None, connect=3))
    for body in (b'{"a": 1}', b'{"b": "\xc3\xa9"}', b""):  # the second from the template
        fast = client.json_post(URL, body, headers)
        slow = client.build_request(
            "POST",
            URL,
            content=body,
            headers={**(headers or {}), "Content-Type": "application/json"},
        )
        assert fast.content == slow.content == body  # read already, as the transport wants
        assert (fast.method, fast.url, fast.read()) == (slow.method, slow.url, slow.read())
        assert b"".join(fast.stream) == body  # type: ignore[arg-type]  # sync: a ByteStream
        assert fast.headers.raw == slow.headers.raw  # names, order and Content-Length
        assert fast.extensions == slow.extensions


async def test_the_llm_client_keeps_no_cookies() -> None:
    """An answer's Set-Cookie is neither parsed nor sent back (an LLM API needs none)."""
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, headers={"Set-Cookie": "session=abc; Path=/"}, content=b"{}")

    async with LLMClient(transport=httpx.MockTransport(answer)) as client:
        for _ in range(2):
            response = await client.send(client.json_post(URL, b"{}", None))
            await response.aclose()
        assert not client.cookies
        client.cookies = {"x": "y"}  # setting them keeps nothing either
        assert not client.cookies
    assert [r.headers.get("Cookie") for r in sent] == [None, None]


async def test_a_streamed_chat_through_make_client_builds_its_request_once() -> None:
    calls: list[Any] = []
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm([{"text": "hi there"}] * 3) as server:
            async with make_client(Settings(llm_connect_timeout=3)) as client:
                assert isinstance(client, LLMClient)
                real = client.build_request

                def counted(*args: Any, **kwargs: Any) -> httpx.Request:
                    calls.append(args)
                    return real(*args, **kwargs)

                client.build_request = counted  # type: ignore[method-assign]
                backend = OllamaBackend(client, server.url)
                request = ChatRequest(messages=[{"role": "user", "content": "hi"}], model="m")
                for _ in range(3):
                    async with backend.stream_chat(request) as chunks:
                        got = [c async for c in chunks]
                    assert "".join(c.text for c in got if isinstance(c, TextChunk)) == "hi there"
                    assert isinstance(got[-1], DoneChunk)
    assert len(calls) == 1  # the template; the next two requests are built from it
