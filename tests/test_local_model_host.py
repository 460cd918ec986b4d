"""A native crash of the embedded model is an error event, never a dead daemon.

Real parts: the model host process (``python -m navi_trio.llm.model_host``) with the real
SmolLM2-135M model, the runtime and agent loop on a real SQLite file, and, for the
session that must not notice, the fake LLM server over real HTTP on 127.0.0.1. The
crashes are the child's own test switch, ``NAVI_MODEL_HOST_CRASH`` (llm/model_host.py):
it kills itself with a real SIGILL, SIGSEGV or SIGKILL. The backoff itself is proved on
a MockClock in tests/test_model_host_supervision.py; here it is made short instead.

Skipped, with the reason printed, when the `local` extra is missing. Every test has an
absolute timeout.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import toolset, with_tools
from real_models import THREADS

from navi_trio.events import AgentEvent, ErrorEvent, StreamEnd, TextDelta
from navi_trio.llm import host as host_module
from navi_trio.llm import host_process, host_state
from navi_trio.llm.base import ChatRequest, LLMBackend, LLMChunk
from navi_trio.llm.factory import make_client
from navi_trio.llm.local import LocalBackend, default_model_file, llama_installed
from navi_trio.llm.ollama import OllamaBackend
from navi_trio.runtime import Runtime, open_runtime
from navi_trio.settings import REPO_ROOT, Settings, default_config_path
from navi_trio.testing.fake_llm import open_fake_llm
from navi_trio.testing.harness import test_config as make_config

if not llama_installed() or default_model_file() is None:
    pytest.skip("the `local` extra is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow

TIMEOUT = 240  # a few model loads on a loaded 2-core machine
CRASH = "NAVI_MODEL_HOST_CRASH"
SIGNALS = {
    "SIGILL": "SIGILL, illegal instruction",
    "SIGSEGV": "SIGSEGV, segmentation fault",
    "SIGKILL": "SIGKILL, killed",
}
FAKE_MODEL = "fake-remote"
SHORT_PROMPT = {"system_prompt": "Answer briefly.", "system_prompt_file": None}


@pytest.fixture(autouse=True)
def short_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """A crashed process starts again after 0.01 s, not 0.5 s: the waits here are real."""
    monkeypatch.setattr(host_module, "BACKOFF_FIRST", 0.01)


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(
        {}, db_path=tmp_path / "navi.db", data_dir=tmp_path / "data", num_ctx=2048,
        llm_backend="local", local_threads=THREADS,
    )  # fmt: skip


def _backend(data: Path, **options: Any) -> LocalBackend:
    """The embedded model on the tests' one llama.cpp thread (tests/real_models.py says
    why: two threads on a shared machine took several times as long)."""
    return LocalBackend(n_ctx=2048, threads=THREADS, data_dir=data, **options)


def _config(answer_max_tokens: int = 8) -> Any:
    # The shipped `local` profile without tools (so a reply is one plain generation), and
    # the same for a session on the fake server. Short answers (8 tokens: more than the 4
    # a crash mid-answer waits for): the tests are about ends, and assert only that an
    # answer has words. A one-line system prompt and no persona: the model reads every
    # prompt token at about the speed it writes one, and the shipped texts were ~110 of
    # the ~130 tokens of each prompt, read again after each crash.
    local = with_tools([], answer_max_tokens=answer_max_tokens, **SHORT_PROMPT)
    shipped = json.loads(default_config_path().read_text(encoding="utf-8"))["profiles"]["local"]
    remote = {**shipped, **local, "model": FAKE_MODEL}  # a copy of it: no planning call either
    return make_config({"local": local, "remote": remote}, persona="")


def _open(
    tmp_path: Path, backend: LLMBackend, answer_max_tokens: int = 8
) -> AbstractAsyncContextManager[Runtime]:
    config = _config(answer_max_tokens)
    return open_runtime(_settings(tmp_path), backend=backend, config=config, tools=toolset())


async def _run(rt: Runtime, session: str, text: str) -> list[AgentEvent]:
    events = []
    async with rt.agent.run_stream(session, text) as stream:
        async for event in stream:
            events.append(event)
    return events


def _errors(events: list[AgentEvent]) -> list[ErrorEvent]:
    return [e for e in events if isinstance(e, ErrorEvent)]


def _end(events: list[AgentEvent]) -> StreamEnd:
    end = events[-1]
    assert isinstance(end, StreamEnd), events
    return end


@pytest.mark.parametrize("sig", list(SIGNALS))
async def test_a_child_that_dies_mid_generation_gives_one_error_and_the_session_goes_on(
    sig: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CRASH, f"{sig}:after=4:starts=1")  # the first process only
    backend = _backend(tmp_path / "data", extra_buffers=False)
    with trio.fail_after(TIMEOUT):
        async with _open(tmp_path, backend) as rt:
            await rt.store.create_session("s1", profile_id="local")
            first = await _run(rt, "s1", "Count from 1 to 50, separated by commas.")
            (error,) = _errors(first)
            assert (
                error.message == f"the local model process died ({SIGNALS[sig]}) — see navi doctor"
            )
            assert error.code == "local_model_died"
            assert _end(first).reason == "error"
            assert [e for e in first if isinstance(e, TextDelta)]  # tokens came before it
            history = await rt.store.load_messages("s1")
            assert history[0]["role"] == "user"
            assert history[0]["content"] == "Count from 1 to 50, separated by commas."
            partial = history[1]
            assert partial["role"] == "assistant" and partial["partial"] is True
            assert partial["content"].strip() and sig in partial["error"]
            # The next message starts the process again (after the backoff) and is answered.
            second = await _run(rt, "s1", "Say hello.")
            assert not _errors(second), second
            assert _end(second).reason == "complete" and _end(second).text.strip()
            assert [m["role"] for m in await rt.store.load_messages("s1")] == [
                "user", "assistant", "user", "assistant"
            ]  # fmt: skip
            assert backend.host.failures == 0 and backend.host.status()["state"] == "ready"


async def test_a_crash_while_loading_fails_that_message_and_the_next_one_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CRASH, "SIGSEGV:load:starts=1")  # once, during loading
    backend = _backend(tmp_path / "data", extra_buffers=False)
    with trio.fail_after(TIMEOUT):
        async with _open(tmp_path, backend) as rt:
            await rt.store.create_session("s1", profile_id="local")
            first = await _run(rt, "s1", "Say hello.")
            (error,) = _errors(first)
            assert error.message == (
                "the local model process died while loading the model "
                "(SIGSEGV, segmentation fault) — see navi doctor"
            )
            assert (await rt.store.load_messages("s1"))[0]["content"] == "Say hello."
            second = await _run(rt, "s1", "Say hello again.")
            assert not _errors(second) and _end(second).text.strip()


class Router:
    """One runtime, two backends: the fake server's model for one session, the embedded
    model for the other (a daemon has one backend; this puts both in one loop)."""

    def __init__(self, local: LocalBackend, remote: LLMBackend) -> None:
        self.local = local
        self.remote = remote

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.local.run(task_status=task_status)

    def stream_chat(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[LLMChunk]]:
        chosen = self.remote if request.model == FAKE_MODEL else self.local
        return chosen.stream_chat(request)

    async def aclose(self) -> None:
        await self.remote.aclose()


async def test_another_session_keeps_streaming_while_the_local_model_dies(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(30)]
    # The fake server's answer, started once the local model streams its (long: 400
    # tokens, seconds) answer, stops after its first word until the child is dead: both
    # stream when it dies, and the rest of b's words come after.
    reply = {"text": " ".join(words)}
    local = _backend(tmp_path / "data", extra_buffers=False)
    seen: dict[str, list[tuple[float, AgentEvent]]] = {"a": [], "b": []}
    with trio.fail_after(TIMEOUT):
        async with (
            open_fake_llm([reply, {"text": "still here"}]) as fake,
            make_client(_settings(tmp_path)) as client,
            _open(tmp_path, Router(local, OllamaBackend(client, fake.url)), 400) as rt,
        ):
            await rt.store.create_session("a", profile_id="local")
            await rt.store.create_session("b", profile_id="remote")
            streaming = {"a": trio.Event(), "b": trio.Event()}

            async def run(session: str, text: str) -> None:
                async with rt.agent.run_stream(session, text) as stream:
                    async for event in stream:
                        seen[session].append((trio.current_time(), event))
                        if isinstance(event, TextDelta):
                            streaming[session].set()

            release = fake.hold_after(1)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, "a", "Count from 1 to 300, separated by commas.")
                await streaming["a"].wait()
                nursery.start_soon(run, "b", "Tell me something.")
                await streaming["b"].wait()
                # Both stream; the embedded model's process dies (any signal will do).
                assert not [e for _, e in seen["a"] if isinstance(e, StreamEnd)]
                killed_at = trio.current_time()
                os.kill(local.host.status()["pid"], signal.SIGKILL)
                release.set()
            a = [e for _, e in seen["a"]]
            (error,) = _errors(a)
            assert "(SIGKILL, killed)" in error.message and _end(a).reason == "error"
            b = [e for _, e in seen["b"]]
            assert not _errors(b) and _end(b).reason == "complete"
            assert _end(b).text.split() == words  # every word, none lost
            assert any(t > killed_at for t, e in seen["b"] if isinstance(e, TextDelta))
            # While the child is dead (only the next local request starts it again), the
            # other session streams as ever.
            assert local.host.status()["state"] == "idle"
            again = await _run(rt, "b", "And another thing.")
            assert _end(again).reason == "complete" and _end(again).text == "still here"
            assert local.host.status()["state"] == "idle"


async def test_five_real_crashes_at_start_up_mark_the_backend_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(CRASH, "SIGILL:load")
    caplog.set_level(logging.WARNING, logger=host_module.__name__)
    starts: list[int] = []

    async def counting(argv: list[str], env: dict[str, str]) -> host_process.ChildProcess:
        starts.append(1)
        return await host_process.spawn_process(argv, env)

    data = tmp_path / "data"
    backend = _backend(data, extra_buffers=False, spawn=counting)
    with trio.fail_after(TIMEOUT):
        async with _open(tmp_path, backend) as rt:
            await rt.store.create_session("s1", profile_id="local")
            messages = []
            for i in range(host_module.BROKEN_AFTER + 1):
                (error,) = _errors(await _run(rt, "s1", f"Say hello {i}."))
                messages.append(error)
            assert len(starts) == host_module.BROKEN_AFTER  # the sixth started nothing
    assert [e.code for e in messages] == ["local_model_died"] * 4 + ["local_model_broken"] * 2
    broken = messages[-1].message
    assert "died 5 times in a row" in broken and "SIGILL, illegal instruction" in broken
    assert "NAVI_MODEL_HOST_CRASH: SIGILL while loading" in broken  # its stderr's last lines
    # The daemon log has it, and the data folder keeps it for `navi doctor`.
    assert any(r.levelno == logging.ERROR and "broken" in r.getMessage() for r in caplog.records)
    state = json.loads((data / host_state.STATE_FILE).read_text())
    assert "SIGILL" in state["broken"]["message"]
    assert any("SIGILL while loading" in line for line in state["broken"]["stderr"])


async def test_extra_buffer_types_that_crash_the_probe_are_turned_off_and_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What an AMX fault looks like: the first token with extra buffer types dies.
    monkeypatch.setenv(CRASH, "SIGILL:extra")
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        backend = _backend(data)  # auto: probe, remember
        async with _open(tmp_path, backend) as rt:
            await rt.store.create_session("s1", profile_id="local")
            events = await _run(rt, "s1", "Say hello.")
            assert not _errors(events) and _end(events).text.strip()
            assert backend.host.status()["extra_buffers"] is False
            assert backend.host.failures == 0  # the probe's death is no crash
        state = json.loads((data / host_state.STATE_FILE).read_text())
        entry = state["extra_buffers"][host_state.state_key()]
        assert entry["on"] is False and "SIGILL" in entry["why"]
        # The next daemon starts without them at once: one process, no probe.
        starts: list[dict[str, str]] = []

        async def counting(argv: list[str], env: dict[str, str]) -> host_process.ChildProcess:
            starts.append(env)
            return await host_process.spawn_process(argv, env)

        again = _backend(data, spawn=counting)
        async with _open(tmp_path, again) as rt:
            events = await _run(rt, "s1", "Say hello again.")
            assert not _errors(events)
            assert len(starts) == 1 and again.host.status()["extra_buffers"] is False


def test_the_daemon_process_never_imports_llama_cpp(tmp_path: Path) -> None:
    # In a fresh interpreter (pytest's own has imported llama_cpp for the skips).
    code = f"""
import sys, trio
from pathlib import Path
from navi_trio.llm.local import LocalBackend
from navi_trio.runtime import open_runtime
from navi_trio.settings import Settings
from navi_trio.testing.harness import test_config

async def main():
    tmp = Path({str(tmp_path)!r})
    settings = Settings.from_env({{}}, db_path=tmp / "navi.db", data_dir=tmp / "data",
                                 num_ctx=2048, llm_backend="local", local_threads={THREADS})
    # The shipped profile without tools: one plain generation, no choice of a tool
    # (whose prompt, the tools' descriptions, is most of the time of a run here); a
    # one-line prompt and no persona, as the tests in this file have (`_config`).
    config = test_config({{"local": {{"tools": {{"agent": [], "subagent": []}},
                                      "answer_max_tokens": 8, **{SHORT_PROMPT!r}}}}},
                         persona="")
    async with open_runtime(settings, config=config) as rt:
        await rt.store.create_session("s1", profile_id="local")
        async with rt.agent.run_stream("s1", "Hello!") as stream:
            ends = [e async for e in stream][-1]
    print(type(ends).__name__, ends.reason, "llama_cpp" in sys.modules)

trio.run(main)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["StreamEnd", "complete", "False"], done.stdout


def test_the_model_reads_prompts_with_the_threads_it_is_given() -> None:
    # llama-cpp-python reads a prompt with one thread per CPU unless told: on a shared
    # machine their barriers spin, and reading took several times longer than one thread.
    from navi_trio.llm.host_wire import read_frame_sync
    from navi_trio.llm.model_host import Host

    threads = 1 if os.cpu_count() != 1 else 2  # never the CPU count, the default
    out = io.BytesIO()
    load = {"model_file": str(default_model_file()), "n_ctx": 512, "threads": threads}
    Host(load, out, None).load()
    ready = read_frame_sync(io.BytesIO(out.getvalue()))
    assert ready is not None and ready["type"] == "ready", ready
    assert ready["threads"] == [threads, threads], ready
