"""The backend's HTTP client spreads concurrent streams over small pools (httpcore walks
its whole pool per request: hundreds of streams in one pool cost most of the CPU), and
a lone session keeps reusing one keep-alive connection.

Rules: loopback only, port 0 (the fake LLM server in the same trio run); no sleeps; an
absolute timeout.
"""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from navi_trio.llm.factory import make_client
from navi_trio.llm.shards import ShardedClient
from navi_trio.settings import Settings
from navi_trio.testing.fake_llm import open_fake_llm

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_concurrent_streams_fill_one_small_pool_after_another() -> None:
    assert isinstance(make_client(Settings(llm_transport="httpx")), ShardedClient)
    stall = {"text": "never", "stall": True}
    with trio.fail_after(30):
        async with open_fake_llm([stall] * 5 + [{"text": "a"}] * 3) as server:
            async with ShardedClient(shards=4, per_shard=2, timeout=10) as client:
                responses: list[httpx.Response] = []

                async def open_one() -> None:
                    request = client.build_request("POST", f"{server.url}/api/chat", json=BODY)
                    responses.append(await client.send(request, stream=True))

                async with trio.open_nursery() as nursery:
                    for _ in range(5):
                        nursery.start_soon(open_one)
                assert client.open_streams == [2, 2, 1, 0]
                for response in responses:
                    await response.aclose()
                assert client.open_streams == [0, 0, 0, 0]
                # One at a time: the first pool, its keep-alive connection reused.
                before = server.connections
                for _ in range(3):
                    request = client.build_request("POST", f"{server.url}/api/chat", json=BODY)
                    response = await client.send(request, stream=True)
                    await response.aread()
                    await response.aclose()
                assert client.open_streams == [0, 0, 0, 0]
                assert server.connections - before <= 1


def test_every_shard_shares_the_clients_one_ssl_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading CA certificates costs ms: a shard made under load must not do it again."""
    made: list[object] = []
    real = httpx.create_ssl_context

    def counting(*args: object, **kw: object) -> object:
        ctx = real(*args, **kw)  # type: ignore[arg-type]
        made.append(ctx)
        return ctx

    monkeypatch.setattr(httpx, "create_ssl_context", counting)
    client = ShardedClient(shards=3, per_shard=1, timeout=5)
    shards = [client._shard(i) for i in range(3)]
    assert len(made) == 1
    for shard in shards:
        assert shard._transport._pool._ssl_context is made[0]  # type: ignore[attr-defined]
