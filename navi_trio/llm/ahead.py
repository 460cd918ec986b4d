"""`ahead_channel`: an LLM stream read ahead of its consumer, deltas merged while it waits.

`trio.as_safe_channel` runs its generator one item per request: every streamed word
then costs a task switch (a semaphore and a channel hand-off) before it even reaches
the agent, and every hop after it one more. An HTTP backend's generator instead runs
ahead here: it parses whatever the socket already holds without waiting for the
consumer, and while the consumer is behind, a text (or thinking) chunk is merged into
the text chunk already waiting at the tail of the queue. A consumer that keeps up sees
exactly the chunks that were parsed; one that falls behind gets fewer, longer ones.
Order is kept: chunks merge only with their waiting neighbour of the same kind.

Bounded: at most `MAX_WAITING` chunks wait (the producer then waits for room) and a
merged chunk holds at most `MAX_MERGED_CHARS`. A producer's error reaches the consumer
after the chunks parsed before it, so a dropped stream still delivers all it had.
Leaving the ``async with`` (end, error, stop) cancels the producer, which closes its
generator: the HTTP response closes and the server sees the connection go.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import ParamSpec

import trio

from navi_trio.llm.base import LLMChunk, TextChunk, ThinkingChunk

P = ParamSpec("P")
MAX_WAITING = 16
MAX_MERGED_CHARS = 64_000


def merge_chunks(old: LLMChunk, new: LLMChunk) -> LLMChunk | None:
    """`old` and `new` as one chunk, when both are text or both thinking (and not too long)."""
    if type(old) is not type(new) or not isinstance(old, TextChunk | ThinkingChunk):
        return None
    assert isinstance(new, TextChunk | ThinkingChunk)
    if len(old.text) + len(new.text) > MAX_MERGED_CHARS:
        return None
    return type(old)(old.text + new.text)


class _Queue:
    def __init__(self) -> None:
        self.items: collections.deque[LLMChunk] = collections.deque()
        self.error: BaseException | None = None
        self.ended = False
        self.merged = 0
        self.has_items = trio.Event()
        self.has_room = trio.Event()
        self.has_room.set()

    def put(self, chunk: LLMChunk) -> bool:
        """Queue or merge `chunk`; False when the queue is full (wait for room first)."""
        if self.items:
            merged = merge_chunks(self.items[-1], chunk)
            if merged is not None:
                self.items[-1] = merged
                self.merged += 1
                return True
        if len(self.items) >= MAX_WAITING:
            self.has_room = trio.Event()
            return False
        self.items.append(chunk)
        self.has_items.set()
        return True

    def end(self, error: BaseException | None) -> None:
        self.ended = True
        self.error = error
        self.has_items.set()


class AheadReceiver(trio.abc.ReceiveChannel[LLMChunk]):
    def __init__(self, queue: _Queue) -> None:
        self._q = queue

    @property
    def merged(self) -> int:
        """Chunks merged into a waiting one so far (for tests and benchmarks)."""
        return self._q.merged

    async def receive(self) -> LLMChunk:
        await trio.lowlevel.checkpoint_if_cancelled()
        q = self._q
        while not q.items:
            if q.ended:
                if q.error is not None:
                    error, q.error = q.error, None
                    raise error
                raise trio.EndOfChannel
            q.has_items = trio.Event()
            await q.has_items.wait()
        chunk = q.items.popleft()
        q.has_room.set()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return chunk

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def _produce(agen: AsyncGenerator[LLMChunk, None], q: _Queue) -> None:
    error: Exception | None = None
    try:
        async for chunk in agen:
            while not q.put(chunk):
                await q.has_room.wait()
    except Exception as exc:  # handed to the consumer, after what came before it
        error = exc
    finally:
        q.end(error)
        await agen.aclose()


def ahead_channel(
    fn: Callable[P, AsyncGenerator[LLMChunk, None]],
) -> Callable[P, AbstractAsyncContextManager[AheadReceiver]]:
    """Decorate a chunk generator: ``async with fn(...) as chunks`` (module docstring)."""

    @asynccontextmanager
    @functools.wraps(fn)
    async def context_manager(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[AheadReceiver]:
        q = _Queue()
        sole: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_produce, fn(*args, **kwargs), q)
                try:
                    yield AheadReceiver(q)
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            if len(group.exceptions) != 1 or isinstance(group.exceptions[0], BaseExceptionGroup):
                raise
            sole = group.exceptions[0]
        if sole is not None:
            raise sole

    return context_manager
