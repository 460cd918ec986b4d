"""The stream guard: first-chunk and between-chunk timeouts, and closing the connection.

Rules for this module: loopback only, port 0; the autojump clock for anything that
sleeps (the fake server sleeps with trio.sleep in the same run, so a 100 s prefill takes
no real time); every test has an absolute timeout.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from llm_served import served

from navi_trio.errors import LLMChunkTimeout, LLMFirstChunkTimeout, LLMStatusError
from navi_trio.llm.base import (
    ChatRequest,
    DoneChunk,
    LLMBackend,
    LLMChunk,
    TextChunk,
    WorkingChunk,
)
from navi_trio.llm.guard import guarded_stream
from navi_trio.llm.http import inline_chunk_channel
from navi_trio.llm.scripted import ScriptedBackend
from navi_trio.settings import Settings

REQUEST = ChatRequest(messages=[{"role": "user", "content": "hi"}], model="m")
# Virtual seconds: far longer than any real test could wait.
LIMIT = 60


async def drain(
    backend: LLMBackend, first: float = 90, chunk: float = 60, pause: float = 0
) -> list[LLMChunk]:
    """The stream's chunks; with `pause`, the consumer waits that long after each."""
    got: list[LLMChunk] = []
    async with guarded_stream(
        backend, REQUEST, first_chunk_timeout=first, chunk_timeout=chunk
    ) as chunks:
        async for c in chunks:
            got.append(c)
            if pause:
                await trio.sleep(pause)
    return got


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
async def test_slow_prefill_raises_first_chunk_timeout_and_the_server_sees_the_disconnect(
    autojump_clock: trio.testing.MockClock, dialect: str
) -> None:
    with trio.fail_after(LIMIT * 10):
        async with served([{"text": "too late", "delay_first": 100}], dialect) as (server, backend):
            start = trio.current_time()
            with pytest.raises(LLMFirstChunkTimeout) as info:
                await drain(backend, first=90, chunk=60)
            assert info.value.seconds == 90
            assert trio.current_time() - start == pytest.approx(90, abs=1)
            with trio.fail_after(5):
                await server.wait_disconnects(1)
            assert server.disconnects[0]["chunks_sent"] == 0
            assert server.completed == 0


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
async def test_a_stall_mid_stream_raises_chunk_timeout_and_closes_the_connection(
    autojump_clock: trio.testing.MockClock, dialect: str
) -> None:
    with trio.fail_after(LIMIT * 10):
        reply = {"text": "one two three", "stall": True, "delay_chunk": 1}
        async with served([reply], dialect) as (server, backend):
            got: list[LLMChunk] = []
            with pytest.raises(LLMChunkTimeout) as info:
                async with guarded_stream(
                    backend, REQUEST, first_chunk_timeout=90, chunk_timeout=30
                ) as chunks:
                    async for c in chunks:
                        got.append(c)
            assert info.value.seconds == 30
            assert "".join(c.text for c in got if isinstance(c, TextChunk)) == "one two three"
            with trio.fail_after(5):
                await server.wait_disconnects(1)
            assert server.disconnects[0]["chunks_sent"] == 3


async def test_chunks_slower_than_first_timeout_but_within_chunk_timeout_pass(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT * 10):
        reply = {"text": "a b c", "delay_first": 80, "delay_chunk": 50}
        async with served([reply]) as (server, backend):
            got = await drain(backend, first=90, chunk=60)
            assert [c.text for c in got if isinstance(c, TextChunk)] == ["a ", "b ", "c"]
            assert isinstance(got[-1], DoneChunk)
            await server.wait_completed(1)  # the server's task may count it a step later
            assert server.disconnects == []


async def test_time_the_consumer_spends_on_a_chunk_does_not_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The turn's loop works on a chunk without waiting; its time (here 100 s jumped
    # between two receives) is not the model's.
    with trio.fail_after(LIMIT * 10):
        async with served([{"text": "a b"}]) as (_server, backend):
            texts = []
            async with guarded_stream(
                backend, REQUEST, first_chunk_timeout=5, chunk_timeout=5
            ) as chunks:
                async for c in chunks:
                    autojump_clock.jump(100)  # e.g. a long synchronous step
                    if isinstance(c, TextChunk):
                        texts.append(c.text)
            assert texts == ["a ", "b"]


async def test_a_consumer_that_waits_between_receives_waits_under_the_chunk_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A receive leaves its deadline in place (one move a chunk, not two): a consumer
    # that waits between receives is bounded by the chunk timeout too.
    with trio.fail_after(LIMIT * 10):
        async with served([{"text": "a b"}]) as (_server, backend):
            start = trio.current_time()
            with pytest.raises(LLMChunkTimeout):
                await drain(backend, first=5, chunk=5, pause=100)
            assert trio.current_time() - start < 100


async def test_cancelling_from_outside_during_prefill_closes_the_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT * 10):
        async with served([{"text": "never", "delay_first": 1000}]) as (server, backend):
            async with trio.open_nursery() as nursery:
                stop = trio.CancelScope()

                async def press_stop() -> None:
                    await server.wait_requests(1)
                    await trio.sleep(5)  # the model is prefilling
                    stop.cancel()

                nursery.start_soon(press_stop)
                with stop:
                    await drain(backend)
                assert stop.cancelled_caught
            with trio.fail_after(5):
                await server.wait_disconnects(1)
            assert trio.current_time() < 100  # Stop did not wait for the prefill


async def test_leaving_the_stream_early_closes_the_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT * 10):
        async with served([{"text": "a b c d e f", "delay_chunk": 1}]) as (server, backend):
            async with guarded_stream(
                backend, REQUEST, first_chunk_timeout=90, chunk_timeout=60
            ) as chunks:
                first = await chunks.receive()
            assert first == TextChunk("a ")
            with trio.fail_after(5):
                await server.wait_disconnects(1)


async def test_backend_errors_pass_through_the_guard(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT):
        async with served([{"status": 404, "error_body": "model 'm' not found"}]) as (_s, backend):
            with pytest.raises(LLMStatusError, match="model 'm' not found"):
                await drain(backend)


async def test_guard_applies_to_the_scripted_backend_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(LIMIT * 10):
        backend = ScriptedBackend(
            [{"delay_first": 100, "text": "x"}, {"text": "a b", "stall": True}]
        )
        with pytest.raises(LLMFirstChunkTimeout):
            await drain(backend, first=90)
        with pytest.raises(LLMChunkTimeout):
            await drain(backend, chunk=10)


async def test_errors_come_out_alone_when_the_consumer_calls_receive_directly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # trio closes the channel before cancelling the consumer; the guard's error must not
    # arrive wrapped in a group together with that EndOfChannel.
    replies = [{"status": 503, "error_body": "busy"}, {"delay_first": 100, "text": "x"}]
    with trio.fail_after(LIMIT * 10):
        async with served(replies) as (_server, backend):
            for expected in (LLMStatusError, LLMFirstChunkTimeout):
                with pytest.raises(expected):
                    async with guarded_stream(
                        backend, REQUEST, first_chunk_timeout=90, chunk_timeout=60
                    ) as chunks:
                        await chunks.receive()


class _Spawned(trio.abc.Instrument):
    """Records the tasks spawned under `parent` (in a nursery `parent` opened)."""

    def __init__(self, parent: trio.lowlevel.Task) -> None:
        self.parent = parent
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        nursery = task.parent_nursery
        if nursery is not None and nursery.parent_task is self.parent:
            self.names.append(task.name)


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
async def test_a_guarded_http_stream_runs_in_the_consumers_task(dialect: str) -> None:
    """Neither the guard nor the HTTP backends start a producer task: each chunk is read
    in the consumer's task (no nursery per call, no task switches per chunk), and the
    chunks, the timeouts and the closing are what they were."""
    with trio.fail_after(LIMIT):
        async with served([{"text": "one two"}] * 2, dialect) as (server, backend):
            await drain(backend)  # connecting starts tasks: the kept-alive connection is used
            spawned = _Spawned(trio.lowlevel.current_task())
            trio.lowlevel.add_instrument(spawned)
            try:
                got = await drain(backend)
            finally:
                trio.lowlevel.remove_instrument(spawned)
            assert spawned.names == []
            assert "".join(c.text for c in got if isinstance(c, TextChunk)) == "one two"
            assert isinstance(got[-1], DoneChunk)
            await server.wait_completed(2)
            assert server.disconnects == []


async def test_a_guarded_stream_enters_one_cancel_scope_however_many_chunks_it_carries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The timeouts are one scope whose deadline moves, not a scope per receive (which
    would cost more than the rest of the guard on every chunk)."""
    entered = 0
    enter = trio.CancelScope.__enter__

    def counted(scope: trio.CancelScope) -> trio.CancelScope:
        nonlocal entered
        entered += 1
        return enter(scope)

    monkeypatch.setattr(trio.CancelScope, "__enter__", counted)
    scopes = []
    with trio.fail_after(LIMIT):
        for words in (10, 50):
            entered = 0
            got = await drain(ScriptedBackend([{"text": " ".join(["w"] * words)}]))
            assert len([c for c in got if isinstance(c, TextChunk)]) == words
            scopes.append(entered)
    assert scopes[0] == scopes[1]


def test_the_default_timeouts_are_the_specs() -> None:
    """agent-loop.md, "Streaming guard wrapper": LLM_STREAM_FIRST_CHUNK_TIMEOUT defaults to
    90 s and LLM_STREAM_CHUNK_TIMEOUT to 60 s."""
    settings = Settings.from_env({})
    assert (settings.first_chunk_timeout, settings.chunk_timeout) == (90.0, 60.0)


class _WorksThenAnswers:
    """A backend that reports work at once, then is silent `gap` seconds, then answers."""

    def __init__(self, gap: float) -> None:
        self.gap = gap

    @asynccontextmanager
    async def stream_chat(
        self, request: ChatRequest
    ) -> AsyncIterator[trio.abc.ReceiveChannel[LLMChunk]]:
        send, receive = trio.open_memory_channel[LLMChunk](0)

        async def produce() -> None:
            async with send:
                await send.send(WorkingChunk("choosing a tool"))
                await trio.sleep(self.gap)
                await send.send(TextChunk("done"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            async with receive:
                yield receive
            nursery.cancel_scope.cancel()

    async def aclose(self) -> None:
        pass


async def test_work_before_the_first_output_keeps_the_first_chunk_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Work is not output: after a WorkingChunk the first text is still awaited under the
    first-chunk timeout (90 s here), not the shorter gap between chunks (60 s)."""
    with trio.fail_after(LIMIT * 10):
        got = await drain(_WorksThenAnswers(gap=80), first=90, chunk=60)
    assert [c.text for c in got if isinstance(c, TextChunk)] == ["done"]


async def test_a_stop_lands_at_the_next_chunk_of_an_http_stream_that_never_waits() -> None:
    """An HTTP backend's channel (`inline_chunk_channel`) runs its generator in the
    consumer's task; when one read brought many lines the generator yields chunk after
    chunk without waiting, and a Stop must still land at the next receive, whether
    through ``receive`` or ``async for`` (the guard's)."""

    async def ready() -> AsyncGenerator[LLMChunk, None]:  # every chunk there already
        for word in ("one", "two", "three"):
            yield TextChunk(word)

    @inline_chunk_channel
    def stream() -> AsyncGenerator[LLMChunk, None]:
        return ready()

    with trio.fail_after(LIMIT):
        for how in ("receive", "anext"):
            async with stream() as chunks:
                assert await chunks.receive() == TextChunk("one")
                with trio.CancelScope() as stop:
                    stop.cancel()
                    await (chunks.receive() if how == "receive" else chunks.__anext__())
                    pytest.fail(f"{how}: the stop did not land")
                assert stop.cancelled_caught
                # Nothing was taken by the receive the stop ended.
                assert [c async for c in chunks] == [TextChunk("two"), TextChunk("three")]
                with pytest.raises(trio.EndOfChannel):  # a channel's end, through receive
                    await chunks.receive()


async def test_the_streams_end_or_error_leaves_no_deadline_on_the_consumers_block(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The stream's one scope covers the consumer's whole block: once the stream ended,
    or a receive failed and the consumer went on, no chunk's deadline is left to cut it."""
    replies: list[dict[str, Any]] = [{"text": "a b"}, {"status": 503, "error_body": "busy"}]
    with trio.fail_after(LIMIT * 10):
        async with served(replies) as (_server, backend):
            async with guarded_stream(
                backend, REQUEST, first_chunk_timeout=5, chunk_timeout=5
            ) as chunks:
                got = [c async for c in chunks]
                assert isinstance(got[-1], DoneChunk)
                await trio.sleep(100)  # after the end
            async with guarded_stream(
                backend, REQUEST, first_chunk_timeout=5, chunk_timeout=5
            ) as chunks:
                with pytest.raises(LLMStatusError, match="busy"):
                    await chunks.receive()
                await trio.sleep(100)  # after the error, handled in the block
