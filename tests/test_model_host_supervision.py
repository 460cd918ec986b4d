"""The model host's supervisor (llm/host.py) with in-process fake children: time matters.

These are unit tests: a `FakeChild` speaks the host's wire over memory streams and dies,
hangs or talks nonsense on cue, so the backoff, the broken mark and the stop watchdog
run on `MockClock(autojump_threshold=0)` (seconds of backoff take no time). The same
behaviour with real processes and the real model: tests/test_local_model_host.py.
"""

from __future__ import annotations

import io
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from navi_trio.core.turn.llm_call import StreamedReply, stream_reply
from navi_trio.errors import (
    LLMChunkTimeout,
    LLMFirstChunkTimeout,
    LocalModelBrokenError,
    LocalModelDiedError,
)
from navi_trio.events import AgentEvent, ModelWorking, TextDelta
from navi_trio.llm import host as host_module
from navi_trio.llm import host_state
from navi_trio.llm.base import ChatRequest, DoneChunk, LLMChunk, TextChunk, WorkingChunk
from navi_trio.llm.guard import guarded_stream
from navi_trio.llm.host import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    BROKEN_AFTER,
    BROKEN_RETRY,
    STOP_GRACE,
    ModelHost,
)
from navi_trio.llm.host_process import LoadSpec, exit_description
from navi_trio.llm.host_wire import FrameReader, encode, read_frame_sync
from navi_trio.llm.model_host import CrashSwitch
from navi_trio.settings import Settings

TIMEOUT = 10_000  # MockClock seconds: every wait here is bounded, none is real

Behaviour = Callable[["FakeChild"], Awaitable[None]]


class FakeChild:
    """A stand-in for ``python -m navi_trio.llm.model_host``: pipes are memory streams."""

    def __init__(self, behaviour: Behaviour, pid: int) -> None:
        self.stdin, self._stdin_recv = trio.testing.memory_stream_one_way_pair()
        self._stdout_send, self.stdout = trio.testing.memory_stream_one_way_pair()
        self._stderr_send, self.stderr = trio.testing.memory_stream_one_way_pair()
        self.pid = pid
        self.behaviour = behaviour
        self.reader = FrameReader(self._stdin_recv)
        self.frames: list[dict[str, Any]] = []
        self._code: int | None = None
        self._exited = trio.Event()
        self._scope = trio.CancelScope()
        self.killed = False
        self.reaped = False

    @property
    def returncode(self) -> int | None:
        return self._code

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._code is not None
        self.reaped = True  # a real process's status is collected here: no zombie
        return self._code

    def kill(self) -> None:
        self.killed = True
        self.die(-9)

    def die(self, code: int) -> None:
        if self._code is None:
            self._code = code
            self._scope.cancel()
            self._stdout_send.close()
            self._stderr_send.close()
            self._exited.set()

    async def live(self) -> None:
        with self._scope:
            await self.behaviour(self)

    async def read(self) -> dict[str, Any]:
        frame = await self.reader.read()
        assert frame is not None
        self.frames.append(frame)
        return frame

    async def send(self, frame: dict[str, Any]) -> None:
        await self._stdout_send.send_all(encode(frame))

    async def say(self, text: str) -> None:
        await self._stderr_send.send_all(text.encode() + b"\n")


async def dies_at_load(child: FakeChild) -> None:
    await child.read()  # load
    await child.say("Fatal Python error: Illegal instruction")
    child.die(-4)


async def answers(child: FakeChild) -> None:
    await child.read()
    await child.send({"type": "ready", "model": "fake", "extra_buffers": False})
    while True:
        frame = await child.read()
        if frame["type"] == "chat":
            await child.send({"type": "chunk", "id": frame["id"],
                              "chunk": {"kind": "text", "text": "hi"}})  # fmt: skip
            await child.send({"type": "end", "id": frame["id"], "tokens": 1, "stopped": False})


async def ignores_stop(child: FakeChild) -> None:
    await child.read()
    await child.send({"type": "ready", "model": "fake", "extra_buffers": False})
    chat = await child.read()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_read_forever, child)  # it hears, and does nothing
        while True:  # one token a second, whatever the daemon says
            chunk = {"kind": "text", "text": "x"}
            await child.send({"type": "chunk", "id": chat["id"], "chunk": chunk})
            await trio.sleep(1)


async def _read_forever(child: FakeChild) -> None:
    while True:
        await child.read()


async def dies_mid_generation(child: FakeChild) -> None:
    await child.read()
    await child.send({"type": "ready", "model": "fake", "extra_buffers": False})
    chat = await child.read()
    for text in ("one", "two", "three"):
        await child.send({"type": "chunk", "id": chat["id"],
                          "chunk": {"kind": "text", "text": text}})  # fmt: skip
    await trio.sleep(1)  # the daemon takes the three chunks
    await child.say("Fatal Python error: Illegal instruction")
    child.die(-4)


async def loads_slowly(child: FakeChild) -> None:
    await trio.sleep(100)  # a big model on a loaded machine
    await answers(child)


async def stalls_until_stopped(child: FakeChild) -> None:
    """Two tokens, then nothing until the stop; it hears it and ends the generation."""
    await child.read()
    await child.send({"type": "ready", "model": "fake", "extra_buffers": False})
    chat = await child.read()
    for _ in range(2):
        await child.send({"type": "chunk", "id": chat["id"],
                          "chunk": {"kind": "text", "text": "x"}})  # fmt: skip
    while (await child.read())["type"] != "stop":
        pass
    await child.send({"type": "end", "id": chat["id"], "tokens": 2, "stopped": True})
    await answers_chats(child)


async def answers_chats(child: FakeChild) -> None:
    while True:
        frame = await child.read()
        if frame["type"] == "chat":
            await child.send({"type": "chunk", "id": frame["id"],
                              "chunk": {"kind": "text", "text": "hi"}})  # fmt: skip
            usage = {"kind": "done", "model": "fake", "prompt_tokens": 7,
                     "completion_tokens": 1, "done_reason": "stop"}  # fmt: skip
            await child.send({"type": "chunk", "id": frame["id"], "chunk": usage})
            await child.send({"type": "end", "id": frame["id"], "tokens": 1, "stopped": False})


async def talks_nonsense(child: FakeChild) -> None:
    await child.read()
    await child._stdout_send.send_all(b"\x00\x00\x00\x03abc")
    await trio.sleep_forever()


class Spawner:
    """The host's `spawn` seam: each start is the next behaviour, noted with its time."""

    def __init__(self, nursery: trio.Nursery, *behaviours: Behaviour) -> None:
        self.nursery = nursery
        self.behaviours = list(behaviours)
        self.children: list[FakeChild] = []
        self.times: list[float] = []

    async def __call__(self, argv: list[str], env: dict[str, str]) -> FakeChild:
        assert argv[1:] == ["-m", "navi_trio.llm.model_host"]
        behaviour = self.behaviours[min(len(self.children), len(self.behaviours) - 1)]
        child = FakeChild(behaviour, pid=1000 + len(self.children))
        self.children.append(child)
        self.times.append(trio.current_time())
        self.nursery.start_soon(child.live)
        return child


def _host(spawner: Spawner) -> ModelHost:
    # Extra buffer types set (no probe): the start is exactly one process.
    return ModelHost(LoadSpec(model_file=Path("fake.gguf")), extra_buffers=False, spawn=spawner)


def _request() -> ChatRequest:
    return ChatRequest([{"role": "user", "content": "hi"}], "local")


async def _answer(host: ModelHost) -> list[Any]:
    async with host.stream(_request()) as chunks:
        return [c async for c in chunks]


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_five_crashes_at_start_up_mark_the_backend_broken_without_a_restart_storm(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=host_module.__name__)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            spawner = Spawner(nursery, dies_at_load)
            host = _host(spawner)
            await nursery.start(host.run)
            errors = []
            for _ in range(BROKEN_AFTER):
                with pytest.raises(LocalModelDiedError) as caught:
                    await _answer(host)
                errors.append(caught.value)
            # Each start waited its backoff: 0.5, 1, 2, 4 s after the death before it.
            gaps = [b - a for a, b in zip(spawner.times, spawner.times[1:], strict=False)]
            assert gaps == [BACKOFF_FIRST * 2**i for i in range(BROKEN_AFTER - 1)]
            first, last = errors[0], errors[-1]
            assert not isinstance(first, LocalModelBrokenError)
            assert str(first) == (
                "the local model process died while loading the model "
                "(SIGILL, illegal instruction) — see navi doctor"
            )
            assert isinstance(last, LocalModelBrokenError)
            assert "died 5 times in a row" in str(last)
            assert "SIGILL, illegal instruction" in str(last)
            assert "Fatal Python error: Illegal instruction" in str(last)  # its stderr
            # Broken: a request fails at once, and nothing is started.
            now = trio.current_time()
            with pytest.raises(LocalModelBrokenError):
                await _answer(host)
            assert trio.current_time() == now and len(spawner.children) == BROKEN_AFTER
            assert host.status()["state"] == "broken"
            # Later, one start is tried again (and here it works: no longer broken).
            spawner.behaviours = [answers]
            await trio.sleep(BROKEN_RETRY)
            got = await _answer(host)
            assert got == [TextChunk("hi")]
            assert len(spawner.children) == BROKEN_AFTER + 1
            assert host.status()["state"] == "ready" and host.failures == 0
            nursery.cancel_scope.cancel()
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(logged) == 1 and "the local model is broken" in logged[0]
    assert "Fatal Python error: Illegal instruction" in logged[0]


async def test_a_crash_is_restarted_by_the_next_request_after_its_backoff(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            spawner = Spawner(nursery, dies_at_load, answers)
            host = _host(spawner)
            await nursery.start(host.run)
            with pytest.raises(LocalModelDiedError):
                await _answer(host)
            assert await _answer(host) == [TextChunk("hi")]
            assert spawner.times[1] - spawner.times[0] == BACKOFF_FIRST
            # One good generation clears the count: the next crash waits the first step.
            assert host.failures == 0
            nursery.cancel_scope.cancel()


async def test_a_generation_that_ignores_its_stop_gets_its_process_killed(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            spawner = Spawner(nursery, ignores_stop, answers)
            host = _host(spawner)
            await nursery.start(host.run)
            async with host.stream(_request()) as chunks:
                assert await chunks.receive() == TextChunk("x")
            left = trio.current_time()
            child = spawner.children[0]
            await trio.testing.wait_all_tasks_blocked()
            assert child.frames[-1]["type"] == "stop"  # the stop was sent at once
            await host.idle()  # the model is free only once the child is gone
            assert child.killed and trio.current_time() - left == STOP_GRACE
            # Our kill is no crash: no backoff, no count.
            assert host.failures == 0
            assert await _answer(host) == [TextChunk("hi")]
            assert spawner.times[1] - left == STOP_GRACE
            nursery.cancel_scope.cancel()


async def test_a_child_that_breaks_the_wire_is_killed_and_named(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            spawner = Spawner(nursery, talks_nonsense)
            host = _host(spawner)
            await nursery.start(host.run)
            with pytest.raises(LocalModelDiedError, match="a frame that is not JSON"):
                await _answer(host)
            assert spawner.children[0].killed
            assert host.failures == 1
            nursery.cancel_scope.cancel()


async def test_a_death_mid_generation_ends_that_stream_with_the_signal_and_the_next_restarts(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            spawner = Spawner(nursery, dies_mid_generation, answers)
            host = _host(spawner)
            await nursery.start(host.run)
            got: list[LLMChunk] = []
            with pytest.raises(LocalModelDiedError) as caught:
                async with host.stream(_request()) as chunks:
                    async for chunk in chunks:
                        got.append(chunk)
            # What came before the death reached the consumer; then one error naming it.
            assert got == [TextChunk("one"), TextChunk("two"), TextChunk("three")]
            assert str(caught.value) == (
                "the local model process died (SIGILL, illegal instruction) — see navi doctor"
            )
            assert host.failures == 1 and host.status()["state"] == "idle"
            assert host.last_death is not None and host.last_death["when"] == "while running"
            assert host.last_death["stderr"] == ["Fatal Python error: Illegal instruction"]
            # Nothing restarted it on its own; the next request does, after the backoff.
            died_at = trio.current_time()
            await trio.sleep(BACKOFF_MAX)
            assert len(spawner.children) == 1
            assert await _answer(host) == [TextChunk("hi")]
            assert len(spawner.children) == 2 and host.failures == 0
            assert spawner.times[1] - died_at == BACKOFF_MAX  # its backoff had long passed
            nursery.cancel_scope.cancel()


class _Backend:
    """The host behind the backend seam, for the stream guard (as LocalBackend is)."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    def stream_chat(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[LLMChunk]]:
        return self.host.stream(request)

    async def aclose(self) -> None:
        pass


async def _guarded(host: ModelHost, first: float, later: float) -> list[LLMChunk]:
    got: list[LLMChunk] = []
    guarded = guarded_stream(
        _Backend(host), _request(), first_chunk_timeout=first, chunk_timeout=later
    )
    async with guarded as chunks:
        async for chunk in chunks:
            got.append(chunk)
    return got


async def test_a_slow_start_is_the_first_chunk_timeout_and_the_next_request_finds_it_loaded(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            spawner = Spawner(nursery, loads_slowly)
            host = _host(spawner)
            await nursery.start(host.run)
            start = trio.current_time()
            with pytest.raises(LLMFirstChunkTimeout):
                await _guarded(host, first=30, later=10)
            assert trio.current_time() - start == 30  # the wait for the child is bounded
            # The start goes on (it was no crash); the next request waits for it.
            assert host.status()["state"] == "starting" and host.failures == 0
            got = await _guarded(host, first=90, later=10)
            assert got[0] == TextChunk("hi") and trio.current_time() - start == 100
            assert len(spawner.children) == 1
            nursery.cancel_scope.cancel()


async def test_a_stall_mid_generation_is_the_chunk_timeout_and_the_child_hears_the_stop(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            spawner = Spawner(nursery, stalls_until_stopped)
            host = _host(spawner)
            await nursery.start(host.run)
            start = trio.current_time()
            with pytest.raises(LLMChunkTimeout):
                await _guarded(host, first=30, later=10)
            assert trio.current_time() - start == 10
            child = spawner.children[0]
            await host.idle()  # it ended the generation when it heard the stop
            assert child.frames[-1]["type"] == "stop" and not child.killed
            assert host.last_stopped and host.failures == 0
            # The same process answers the next request, with its usage.
            got = await _guarded(host, first=30, later=10)
            assert got == [TextChunk("hi"), DoneChunk("fake", 7, 1, "stop")]
            assert len(spawner.children) == 1
            nursery.cancel_scope.cancel()


def test_exit_descriptions_name_the_signal() -> None:
    assert exit_description(-4) == "SIGILL, illegal instruction"
    assert exit_description(-11) == "SIGSEGV, segmentation fault"
    assert exit_description(-9) == "SIGKILL, killed"
    assert exit_description(1) == "exit status 1"


def test_the_crash_switch_reads_its_spec() -> None:
    switch = CrashSwitch.parse("SIGSEGV:after=3:starts=1", start=1)
    assert switch is not None and switch.after == 3 and switch.sig.name == "SIGSEGV"
    assert CrashSwitch.parse("SIGSEGV:after=3:starts=1", start=2) is None  # only the first
    load = CrashSwitch.parse("SIGKILL:load", start=7)
    assert load is not None and load.at == "load"
    assert CrashSwitch.parse("", start=1) is None
    for bad in ("SIGTERM:load", "SIGILL", "SIGILL:load:after=2", "SIGILL:later"):
        with pytest.raises(ValueError, match="NAVI_MODEL_HOST_CRASH"):
            CrashSwitch.parse(bad, start=1)


# ------------------------------------------------------------------ work is not silence


async def _loaded(child: FakeChild) -> None:
    """The child's start: it reads its load frame and says it is ready."""
    await child.read()
    await child.send({"type": "ready", "model": "fake", "extra_buffers": False})


@asynccontextmanager
async def hosted(*behaviours: Behaviour) -> AsyncIterator[tuple[ModelHost, Spawner]]:
    """A running host whose children behave as given (each start the next one)."""
    async with trio.open_nursery() as nursery:
        spawner = Spawner(nursery, *behaviours)
        host = _host(spawner)
        await nursery.start(host.run)
        yield host, spawner
        nursery.cancel_scope.cancel()


async def works_silently_then_answers(child: FakeChild) -> None:
    """A constrained step (choosing a tool): 180 s that stream nothing but `working`
    frames, 30 s apart (more than the later chunks' timeout), then the answer."""
    await _loaded(child)
    chat = await child.read()
    for n in range(7):
        await child.send({"type": "working", "id": chat["id"], "step": "choosing a tool",
                          "tokens": n})  # fmt: skip
        await trio.sleep(30)
    await child.send({"type": "chunk", "id": chat["id"],
                      "chunk": {"kind": "text", "text": "done"}})  # fmt: skip
    await child.send({"type": "end", "id": chat["id"], "tokens": 8, "stopped": False})
    await answers_chats(child)


async def works_then_goes_silent(child: FakeChild) -> None:
    await _loaded(child)
    chat = await child.read()
    await child.send({"type": "working", "id": chat["id"], "step": "choosing a tool",
                      "tokens": 0})  # fmt: skip
    await _read_forever(child)


async def answers_slowly(child: FakeChild) -> None:
    """Every chat: 200 words, one a second (a busy machine), then the end."""
    await _loaded(child)
    while True:
        frame = await child.read()
        if frame["type"] != "chat":
            continue
        for _ in range(200):
            await child.send({"type": "chunk", "id": frame["id"],
                              "chunk": {"kind": "text", "text": "w "}})  # fmt: skip
            await trio.sleep(1)
        await child.send({"type": "end", "id": frame["id"], "tokens": 200, "stopped": False})


async def test_the_models_own_silent_steps_are_progress_not_a_first_chunk_timeout(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with hosted(works_silently_then_answers) as (host, _):
            start = trio.current_time()
            got = await _guarded(host, first=90, later=10)
            # 210 s, never 90 s of silence: each `working` frame restarted the wait, and
            # the wait for the first output stayed the first chunk's (30 s gaps > 10 s).
            assert trio.current_time() - start == 210
            assert got == [*(WorkingChunk("choosing a tool", n) for n in range(7)),
                           TextChunk("done")]  # fmt: skip
            assert host.failures == 0


async def test_silence_after_the_last_sign_of_work_is_still_the_first_chunk_timeout(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with hosted(works_then_goes_silent) as (host, _):
            start = trio.current_time()
            with pytest.raises(LLMFirstChunkTimeout):
                await _guarded(host, first=90, later=10)
            assert trio.current_time() - start == 90


async def test_a_request_waiting_for_the_model_another_answer_holds_does_not_time_out(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with hosted(answers_slowly) as (host, spawner), trio.open_nursery() as nursery:
            first: list[LLMChunk] = []

            async def answer_first() -> None:
                first.extend(await _guarded(host, first=90, later=10))

            nursery.start_soon(answer_first)
            await trio.testing.wait_all_tasks_blocked()
            start = trio.current_time()
            second = await _guarded(host, first=90, later=10)  # waits 200 s for the model
            assert trio.current_time() - start == 400
            waiting = [c for c in second if isinstance(c, WorkingChunk)]
            assert waiting and {c.step for c in waiting} == {host_module.WAITING_STEP}
            assert len(waiting) == 200 // host_module.SLOT_REPORT_SEC  # one every 5 s
            assert [c for c in second if not isinstance(c, WorkingChunk)] == [TextChunk("w ")] * 200
            await trio.testing.wait_all_tasks_blocked()
            assert len(first) == 200 and len(spawner.children) == 1


async def test_the_models_work_is_an_event_and_not_the_start_of_its_answer(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with hosted(works_silently_then_answers) as (host, _):
            settings = Settings.from_env({}, first_chunk_timeout=90.0, chunk_timeout=10.0)
            emitted: list[AgentEvent] = []
            began: list[float] = []
            reply = await stream_reply(
                _Backend(host), settings, _request(), StreamedReply(), emitted.append,
                first_chunk=lambda: began.append(trio.current_time()),
            )  # fmt: skip
            assert reply.content == "done"
            working = [e for e in emitted if isinstance(e, ModelWorking)]
            assert [(e.step, e.tokens) for e in working] == [
                ("choosing a tool", n) for n in range(7)
            ]
            assert began == [210]  # the answer began with its text, not with the work
            assert [e for e in emitted if not isinstance(e, ModelWorking)] == [TextDelta("done")]


class FakeLlama:
    """What the child's `Host` uses of llama_cpp.Llama: a stream of `n` one-word tokens."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.n_tokens = 0

    def create_chat_completion(self, messages: Any, **params: Any) -> Any:
        def stream() -> Any:
            for i in range(self.n):
                self.n_tokens += 1
                yield {"choices": [{"delta": {"content": f"t{i}"}, "finish_reason": None}]}

        class Closing:  # llama's stream is closed by the host (`tokens`)
            def __init__(self) -> None:
                self.it = stream()

            def __iter__(self) -> Any:
                return self.it

            def close(self) -> None:
                self.it.close()

        return Closing()


def test_the_child_says_it_works_through_a_step_that_streams_nothing() -> None:
    from navi_trio.llm import model_host

    ticks = iter(range(1000))  # each token takes 0.2 s of the child's clock
    out = io.BytesIO()
    host = model_host.Host({"model_file": "fake.gguf"}, out, None, lambda: next(ticks) * 0.2)
    host.llama = FakeLlama(10)
    gen = model_host.Generation(7, {})
    text, _ = host.complete(gen, "choosing a tool", [], None, 24, {})
    assert text == "".join(f"t{i}" for i in range(10))
    stream = io.BytesIO(out.getvalue())
    frames = list(iter(lambda: read_frame_sync(stream), None))
    assert all(f["type"] == "working" and f["id"] == 7 for f in frames)
    assert all(f["step"] == "choosing a tool" for f in frames)
    # At its start, then at most every WORKING_EVERY (1 s: every fifth token here).
    assert [f["tokens"] for f in frames] == [0, 5, 10]


# ------------------------------------------------------------------ shutdown and what is kept


async def streams_until_stopped(child: FakeChild) -> None:
    """Mid-generation: one word, then it keeps computing (silent) until killed."""
    await _loaded(child)
    chat = await child.read()
    await child.send({"type": "chunk", "id": chat["id"],
                      "chunk": {"kind": "text", "text": "once"}})  # fmt: skip
    await _read_forever(child)


async def test_a_shutdown_mid_generation_reaps_the_child_and_ends_the_waiting_stream(
    mock_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as outer:  # the consumer outlives the host
            spawner = Spawner(outer, streams_until_stopped)
            host = _host(spawner)
            ended = trio.Event()
            got: list[LLMChunk] = []
            failed: list[BaseException] = []

            async def consume() -> None:
                try:
                    async with host.stream(_request()) as chunks:
                        async for chunk in chunks:
                            got.append(chunk)
                except LocalModelDiedError as exc:
                    failed.append(exc)
                ended.set()

            async with trio.open_nursery() as daemon:  # the runtime's nursery
                await daemon.start(host.run)
                outer.start_soon(consume)
                await trio.testing.wait_all_tasks_blocked()
                assert got == [TextChunk("once")]  # mid-generation now
                left = trio.current_time()
                daemon.cancel_scope.cancel()  # the daemon shuts down
            await ended.wait()
            (child,) = spawner.children
            assert child.killed and child.reaped  # killed, and its exit collected
            assert trio.current_time() == left  # no grace spent on a child that is gone
            (error,) = failed  # the waiting stream ended with an error, not a hang
            assert "SIGKILL" in str(error)


async def dies_in_the_probe(child: FakeChild) -> None:
    """Loaded with the extra buffer types: the probe's one token dies (an AMX fault)."""
    load = await child.read()
    assert load["extra_buffers"] is True and load["probe"] is True
    await child.send({"type": "probing"})
    await child.say("Fatal Python error: Illegal instruction")
    child.die(-4)


# The tests below write the data folder's state file (in a worker thread, as the daemon
# does): trio's real clock, not the MockClock (it would jump while a thread works); the
# backoffs are made zero instead, so nothing waits.
REAL_LIMIT = 30


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_module, "BACKOFF_FIRST", 0.0)


async def test_a_probe_that_dies_is_remembered_as_extra_buffers_off(tmp_path: Path) -> None:
    spec = LoadSpec(model_file=Path("fake.gguf"))
    with trio.fail_after(REAL_LIMIT):
        async with trio.open_nursery() as nursery:
            spawner = Spawner(nursery, dies_in_the_probe, answers)
            host = ModelHost(spec, data_dir=tmp_path, spawn=spawner)  # auto: probe once
            await nursery.start(host.run)
            assert await _answer(host) == [TextChunk("hi")]
            again = spawner.children[1].frames[0]
            assert (again["extra_buffers"], again["probe"]) == (False, False)
            assert host.failures == 0 and host.last_death is None  # a probe's death: no crash
            nursery.cancel_scope.cancel()
        state = await trio.to_thread.run_sync(host_state.read_state, tmp_path)
        key = await trio.to_thread.run_sync(host_state.state_key)
        entry = state["extra_buffers"][key]
        assert entry["on"] is False and "SIGILL" in entry["why"]
        # The next daemon starts without them at once: one process, no probe.
        async with trio.open_nursery() as nursery:
            spawner = Spawner(nursery, answers)
            host = ModelHost(spec, data_dir=tmp_path, spawn=spawner)
            await nursery.start(host.run)
            assert await _answer(host) == [TextChunk("hi")]
            (child,) = spawner.children
            assert (child.frames[0]["extra_buffers"], child.frames[0]["probe"]) == (False, False)
            nursery.cancel_scope.cancel()


async def _broken(
    spec: LoadSpec, tmp_path: Path, nursery: trio.Nursery
) -> tuple[ModelHost, Spawner]:
    """A host of the data folder `tmp_path` whose child died at start-up until broken."""
    spawner = Spawner(nursery, dies_at_load)
    host = ModelHost(spec, data_dir=tmp_path, extra_buffers=False, spawn=spawner)
    await nursery.start(host.run)
    for _ in range(BROKEN_AFTER):
        with pytest.raises(LocalModelDiedError):
            await _answer(host)
    assert host.status()["state"] == "broken"
    return host, spawner


async def _state(tmp_path: Path) -> dict[str, Any]:
    return await trio.to_thread.run_sync(host_state.read_state, tmp_path)


async def test_a_broken_model_that_starts_again_after_a_restart_is_no_longer_reported_broken(
    tmp_path: Path, no_backoff: None
) -> None:
    spec = LoadSpec(model_file=Path("fake.gguf"))
    with trio.fail_after(REAL_LIMIT):
        async with trio.open_nursery() as nursery:
            await _broken(spec, tmp_path, nursery)
            nursery.cancel_scope.cancel()  # (its state writes end first: thread jobs)
        assert "SIGILL" in (await _state(tmp_path))["broken"]["message"]  # for `navi doctor`
        # The daemon restarts, and the model starts (a rebuilt llama.cpp, say).
        async with trio.open_nursery() as nursery:
            spawner = Spawner(nursery, answers)
            host = ModelHost(spec, data_dir=tmp_path, extra_buffers=False, spawn=spawner)
            await nursery.start(host.run)
            assert await _answer(host) == [TextChunk("hi")]
            nursery.cancel_scope.cancel()
        assert "broken" not in await _state(tmp_path)  # `navi doctor` no longer says so


async def test_a_broken_model_that_starts_again_when_retried_is_no_longer_reported_broken(
    tmp_path: Path, no_backoff: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_module, "BROKEN_RETRY", 0.0)  # retried at the next request
    spec = LoadSpec(model_file=Path("fake.gguf"))
    with trio.fail_after(REAL_LIMIT):
        async with trio.open_nursery() as nursery:
            host, spawner = await _broken(spec, tmp_path, nursery)
            spawner.behaviours = [answers]
            assert await _answer(host) == [TextChunk("hi")]
            assert host.status()["state"] == "ready" and host.broken_message is None
            nursery.cancel_scope.cancel()
        # The mark was written, then removed: in that order, whatever the threads did.
        assert "broken" not in await _state(tmp_path)
