"""`ShardedClient`: one httpx client for the backend, its streams spread over small pools.

httpcore's connection pool walks all its connections (and, to close surplus idle ones,
all of them again for each idle one) every time a request starts or a response closes.
With hundreds of sessions streaming at once that walk was most of the daemon's CPU
(500 sessions: ~40 % of the main thread in
``AsyncConnectionPool._assign_requests_to_connections``), and httpx's default limit of
100 connections made the other sessions queue for a connection. Here each request goes
to the first shard with fewer than `per_shard` streams open (so a lone session keeps
reusing one keep-alive connection), every shard an `LLMClient` (llm/client.py) without a
connection limit: a pool walk costs at most `per_shard` connections.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from navi_trio.llm.client import LLMClient

SHARDS = 32
PER_SHARD = 16


class _Counted(httpx.AsyncByteStream):
    """A response body that tells its shard when it is closed."""

    def __init__(self, inner: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._inner:
            yield part

    async def aclose(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()
        await self._inner.aclose()


class ShardedClient(LLMClient):
    """An `LLMClient` (no cookies, a cheap chat POST) whose `send` goes through one of
    several small pools, each an `LLMClient` too."""

    def __init__(self, *, shards: int = SHARDS, per_shard: int = PER_SHARD, **kw: Any) -> None:
        # One SSL context (loading the CA certificates costs ~10-25 ms) for this client
        # and every shard: a shard made while hundreds of sessions stream must not load
        # them again on the event loop.
        if not isinstance(kw.get("verify"), ssl.SSLContext):
            kw["verify"] = httpx.create_ssl_context(verify=kw.get("verify", True))
        super().__init__(**kw)
        self._kw = kw
        # Made on first use: a daemon with a few sessions needs one shard.
        self._shards: list[LLMClient | None] = [None] * max(shards, 1)
        self._open = [0] * len(self._shards)
        self.per_shard = per_shard

    def _shard(self, i: int) -> LLMClient:
        shard = self._shards[i]
        if shard is None:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=self.per_shard)
            shard = self._shards[i] = LLMClient(limits=limits, **self._kw)
        return shard

    def _pick(self) -> int:
        for i, n in enumerate(self._open):
            if n < self.per_shard:
                return i
        return min(range(len(self._open)), key=self._open.__getitem__)

    async def send(
        self, request: httpx.Request, *, stream: bool = False, **kw: Any
    ) -> httpx.Response:
        i = self._pick()
        self._open[i] += 1
        try:
            response = await self._shard(i).send(request, stream=stream, **kw)
        except BaseException:
            self._open[i] -= 1
            raise
        if not stream:
            self._open[i] -= 1
            return response

        def release() -> None:
            self._open[i] -= 1

        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Counted(response.stream, release)
        return response

    @property
    def open_streams(self) -> list[int]:
        """Streams open per shard now (for tests and benchmarks)."""
        return list(self._open)

    async def aclose(self) -> None:
        for shard in self._shards:
            if shard is not None:
                await shard.aclose()
        await super().aclose()
