"""Issue 7, the LLM layer: what a real server (llama-cpp-python) and hostile output showed.

Glued tool names, the empty 200 body, the wrong-dialect 404, non-finite numbers in tool
arguments, the answer size cap. Everything over real HTTP against the fake server, whose
modes mirror what llama-cpp-python 0.3 sent (see navi_trio.testing._dialects).

Rules: loopback only, port 0; the autojump clock for anything that sleeps; every test
has an absolute timeout.
"""

from __future__ import annotations

import json
import math
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import llm_served
import pytest
import trio
import trio.testing
from agent_tools import EchoTool, assert_paired, of_type, seed, tool_contents, toolset, with_tools

from navi_trio.errors import (
    ConfigError,
    LLMAnswerTooLongError,
    LLMChunkTimeout,
    LLMConnectionError,
    LLMEmptyResponseError,
    LLMFirstChunkTimeout,
    LLMStatusError,
    StoreError,
)
from navi_trio.llm.base import (
    ChatRequest,
    DoneChunk,
    LLMBackend,
    LLMChunk,
    TextChunk,
    ToolCallsChunk,
)
from navi_trio.llm.http import make_tool_call
from navi_trio.llm.ollama import OllamaParser
from navi_trio.llm.openai import OpenAIParser
from navi_trio.llm.scripted import ScriptedBackend
from navi_trio.settings import Settings
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import open_harness
from navi_trio.testing.fake_llm import FakeLLMServer

TIMEOUT = 10
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("filesystem", "terminal", "abab")
]


def request(**kw: Any) -> ChatRequest:
    kw.setdefault("messages", [{"role": "user", "content": "hello there"}])
    kw.setdefault("model", "m")
    kw.setdefault("tools", TOOLS)
    return ChatRequest(**kw)


def served(
    replies: list[dict[str, Any]], dialect: str = "openai", **options: Any
) -> AbstractAsyncContextManager[tuple[FakeLLMServer, Any]]:
    return llm_served.served(replies, dialect, server=options)


async def collect(backend: LLMBackend, req: ChatRequest | None = None) -> list[LLMChunk]:
    return await llm_served.collect(backend, req or request())


def sse(delta: dict[str, Any], finish: str | None = None) -> str:
    return "data: " + json.dumps({"choices": [{"delta": delta, "finish_reason": finish}]})


# --- 1. tool call names, every way a server streams them ------------------------------


@pytest.mark.parametrize("style", ["openai", "split_name", "repeat_name", "reversed"])
async def test_tool_calls_come_out_whole_in_every_streaming_style(style: str) -> None:
    calls = [
        {"name": "filesystem", "arguments": {"action": "list", "path": "/tmp"}},
        {"name": "terminal", "arguments": {"command": "ls -la", "n": [1, 2.5]}},
    ]
    reply = {"tool_calls": calls, "tool_call_style": style}
    with trio.fail_after(TIMEOUT):
        async with served([reply]) as (_server, backend):
            got = await collect(backend)
    (chunk,) = [c for c in got if isinstance(c, ToolCallsChunk)]
    assert [(c.name, c.arguments, c.parse_error) for c in chunk.calls] == [
        ("filesystem", {"action": "list", "path": "/tmp"}, None),
        ("terminal", {"command": "ls -la", "n": [1, 2.5]}, None),
    ]
    assert len({c.id for c in chunk.calls}) == 2
    assert isinstance(got[-1], DoneChunk) and got[-1].done_reason == "tool_calls"


def test_the_fragments_llama_cpp_python_sent_give_one_clean_call() -> None:
    # Recorded from llama-cpp-python 0.3.36 (SmolLM2, chatml-function-calling), trimmed.
    cid = "call__0_filesystem_cmpl-df672c47"
    lines = [sse({"role": "assistant", "content": None, "function_call": None, "tool_calls": None})]
    for piece in ['{ "', "action", '" : "', "list", '", "path": "', "/tmp", '" }', ""]:
        frag = {
            "index": 0,
            "id": cid,
            "type": "function",
            "function": {"name": "filesystem", "arguments": piece},
        }
        lines.append(
            sse(
                {
                    "role": None,
                    "content": None,
                    "function_call": {"name": "filesystem", "arguments": piece},
                    "tool_calls": [frag],
                }
            )
        )
    lines += [
        sse({"role": None, "content": None, "tool_calls": None}, "tool_calls"),
        "data: [DONE]",
    ]
    parser = OpenAIParser("m")
    out = [c for line in lines for c in parser.feed(line)]
    calls = next(c for c in out if isinstance(c, ToolCallsChunk)).calls
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        (cid, "filesystem", {"action": "list", "path": "/tmp"})
    ]


def test_a_name_that_is_a_repetition_is_settled_by_the_tools_offered() -> None:
    def name_of(pieces: list[str], known: frozenset[str]) -> str:
        parser = OpenAIParser("m", tool_names=known)
        for p in pieces:
            parser.feed(sse({"tool_calls": [{"index": 0, "function": {"name": p}}]}))
        (calls, _done) = parser.feed("data: [DONE]")
        assert isinstance(calls, ToolCallsChunk)
        return calls.calls[0].name

    assert name_of(["ab", "ab"], frozenset()) == "ab"  # repeated whole
    assert name_of(["ab", "ab"], frozenset({"abab"})) == "abab"  # sent in pieces
    assert name_of(["file", "filesys", "filesystem"], frozenset()) == "filesystem"  # so far
    assert name_of(["file", "system"], frozenset()) == "filesystem"


def test_fragments_without_index_are_keyed_by_their_id() -> None:
    parser = OpenAIParser("m")
    feeds = [
        [{"id": "a", "function": {"name": "filesystem", "arguments": '{"x"'}}],
        [{"function": {"arguments": ": 1}"}}],
        [{"id": "b", "function": {"name": "terminal", "arguments": "{}"}}],
        [{"id": "a", "function": {"name": "filesystem", "arguments": ""}}],
    ]
    for frags in feeds:
        parser.feed(sse({"tool_calls": frags}))
    calls, _done = parser.feed("data: [DONE]")
    assert isinstance(calls, ToolCallsChunk)
    assert [(c.id, c.name, c.arguments) for c in calls.calls] == [
        ("a", "filesystem", {"x": 1}),
        ("b", "terminal", {}),
    ]


# --- 3. an empty 200 body is not a dropped connection ----------------------------------


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_an_empty_body_says_the_prompt_is_probably_over_the_window(dialect: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"empty_body": True}], dialect) as (_server, backend):
            with pytest.raises(LLMEmptyResponseError) as info:
                await collect(backend)
    message = str(info.value)
    assert "OLLAMA_NUM_CTX" in message and "context window" in message
    assert "dropped" not in message and info.value.code == "llm_empty_response"


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_a_body_cut_mid_stream_is_still_a_dropped_connection(dialect: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "one two three", "drop_after": 1}], dialect) as (_s, b):
            with pytest.raises(LLMConnectionError, match="dropped") as info:
                await collect(b)
    assert not isinstance(info.value, LLMEmptyResponseError)
    assert "OLLAMA_NUM_CTX" not in str(info.value)


def test_parsers_tell_no_bytes_from_a_cut_stream() -> None:
    for parser in (OpenAIParser("m", "u"), OllamaParser("m", "u")):
        with pytest.raises(LLMEmptyResponseError):
            parser.finish()
    openai = OpenAIParser("m", "u")
    openai.feed(sse({"content": "x"}))
    ollama = OllamaParser("m", "u")
    ollama.feed(json.dumps({"message": {"content": "x"}, "done": False}))
    for parser in (openai, ollama):
        with pytest.raises(LLMConnectionError) as info:
            parser.finish()
        assert not isinstance(info.value, LLMEmptyResponseError)


# --- 4. a 404 from the wrong dialect's path names the right backend --------------------


async def test_a_404_on_api_chat_suggests_the_openai_backend() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "x"}], "ollama", dialects=("openai",)) as (_s, backend):
            with pytest.raises(LLMStatusError) as info:
                await collect(backend)
    assert info.value.status == 404
    assert "--backend openai" in str(info.value) and "NAVI_LLM_BACKEND=openai" in str(info.value)


async def test_a_404_on_chat_completions_suggests_the_ollama_backend() -> None:
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "x"}], "openai", dialects=("ollama",)) as (_s, backend):
            with pytest.raises(LLMStatusError) as info:
                await collect(backend)
    assert "--backend ollama" in str(info.value) and "NAVI_LLM_BACKEND=ollama" in str(info.value)


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_a_missing_model_404_gets_no_dialect_hint(dialect: str) -> None:
    reply = {"status": 404, "error_body": "model 'm' not found, try pulling it first"}
    with trio.fail_after(TIMEOUT):
        async with served([reply], dialect) as (_s, backend):
            with pytest.raises(LLMStatusError) as info:
                await collect(backend)
    assert "model 'm' not found" in str(info.value) and "--backend" not in str(info.value)


# --- 6. non-finite numbers never get in -------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"x": 1e400}',
        '{"x": NaN}',
        '{"x": Infinity}',
        '{"x": -Infinity}',
        '{"a": {"b": [1, 2, -1e999]}}',
    ],
)
def test_non_finite_argument_text_is_a_parse_error(text: str) -> None:
    call = make_tool_call("c1", "echo", text)
    assert call.arguments == {}
    assert call.parse_error is not None and "not finite" in call.parse_error


def test_non_finite_numbers_in_ollama_argument_objects_are_a_parse_error() -> None:
    parser = OllamaParser("m")
    line = (
        '{"message": {"role": "assistant", "content": "", "tool_calls": [{"function": '
        '{"name": "echo", "arguments": {"deep": {"list": [1, NaN]}}}}]}, "done": false}'
    )
    (chunk,) = parser.feed(line)
    assert isinstance(chunk, ToolCallsChunk)
    (call,) = chunk.calls
    assert call.arguments == {} and "deep.list[1]" in (call.parse_error or "")
    # Finite numbers, big ones included, pass.
    assert make_tool_call("c", "echo", {"x": 1e300, "y": [-2.5]}).parse_error is None


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_a_history_holding_infinity_is_sent_as_strict_json(dialect: str) -> None:
    # A session saved before the check may hold Infinity: the body must still be JSON.
    history = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "echo", "arguments": {"x": math.inf}}],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "echo", "content": "ok"},
    ]
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "fine"}], dialect) as (server, backend):
            req = request(messages=history, options={"temperature": math.nan})
            got = await collect(backend, req)
    assert isinstance(got[-1], DoneChunk)
    body = server.chat_requests[0]["body"]
    json.dumps(body, allow_nan=False)  # what the fake got had no NaN / Infinity


async def test_the_store_refuses_non_finite_numbers_with_a_clear_error(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            await store.create_session("s1", profile_id="general")
            bad = {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c", "name": "echo", "arguments": {"x": math.inf}}],
            }
            with pytest.raises(StoreError, match="not finite"):
                await store.append("s1", messages=[bad], context=[bad])
            assert await store.load_messages("s1") == []


# --- 7. an answer that never ends is cut ------------------------------------------------


def test_answer_max_chars_is_a_setting_that_refuses_zero_and_negatives() -> None:
    assert Settings.from_env({}).answer_max_chars == 200_000
    assert Settings.from_env({"NAVI_ANSWER_MAX_CHARS": "1234"}).answer_max_chars == 1234
    for bad in ("0", "-5"):
        with pytest.raises(ConfigError, match="NAVI_ANSWER_MAX_CHARS"):
            Settings.from_env({"NAVI_ANSWER_MAX_CHARS": bad})


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_an_endless_answer_is_cut_at_the_cap_and_the_connection_closed(
    autojump_clock: trio.testing.MockClock, dialect: str
) -> None:
    from navi_trio.core.turn.llm_call import StreamedReply as Reply
    from navi_trio.core.turn.llm_call import stream_reply

    settings = Settings.from_env({}, answer_max_chars=500)
    reply = {"thinking": "hmm", "text": "la ", "endless": True, "delay_chunk": 0.01}
    with trio.fail_after(TIMEOUT):
        async with served([reply], dialect) as (server, backend):
            partial = Reply()
            with pytest.raises(LLMAnswerTooLongError, match="500 characters") as info:
                await stream_reply(backend, settings, request(), partial, None)
            await server.wait_disconnects(1)
    assert info.value.code == "answer_too_long"
    size = len(partial.content) + len(partial.thinking_text)
    assert 490 <= size <= 500 and partial.content.startswith("la la")


async def test_the_scripted_backend_plays_the_new_modes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from navi_trio.core.turn.llm_call import StreamedReply as Reply
    from navi_trio.core.turn.llm_call import stream_reply

    backend = ScriptedBackend(
        [
            {"empty_body": True},
            {"text": "x ", "endless": True},
            {"hang_up": True},
            {"text": "retried"},
            {"hang_up": True},
            {"hang_up": True},
        ]
    )
    settings = Settings.from_env({}, answer_max_chars=100)
    with trio.fail_after(TIMEOUT):
        with pytest.raises(LLMEmptyResponseError):
            await collect(backend)
        with pytest.raises(LLMAnswerTooLongError):
            await stream_reply(backend, settings, request(), Reply(), None)
        assert [c for c in await collect(backend) if isinstance(c, TextChunk)] == [
            TextChunk("retried")
        ]
        with pytest.raises(LLMConnectionError, match="twice"):
            await collect(backend)


# --- the same, end to end through the agent ---------------------------------------------


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_a_model_sending_1e400_gets_an_error_result_and_the_session_goes_on(
    tmp_path: Path, dialect: str
) -> None:
    # OpenAI sends arguments as text ("1e400" as written); Ollama as an object, where the
    # number is already inf (the fake writes it as Infinity, as Python's json would).
    args: Any = '{"text": 1e400}' if dialect == "openai" else {"text": math.inf}
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "echo", "arguments": args}]},
        {"text": "Sorry, a finite number then."},
        {"text": "Next turn works."},
    ]
    with trio.fail_after(TIMEOUT * 3):
        async with open_harness(
            tmp_path,
            replies=replies,
            dialect=dialect,
            tools=toolset(EchoTool()),
            profiles={"general": with_tools(["echo"])},
        ) as h:
            await seed(h)
            frames = await h.turn("s1", "Echo a huge number")
            (result,) = of_type(frames, "tool_result")
            assert result["ok"] is False and "not finite" in result["error"]
            assert "not finite" in tool_contents(h.chat_requests[1])[-1]
            assert frames[-1]["text"] == "Sorry, a finite number then."
            frames = await h.turn("s1", "again")
            assert of_type(frames, "error") == [] and frames[-1]["text"] == "Next turn works."
            for body in h.chat_requests:
                json.dumps(body, allow_nan=False)
            for saved in (
                await h.runtime.store.load_messages("s1"),
                await h.runtime.store.load_context("s1"),
            ):
                json.dumps(saved, allow_nan=False)
            assert_paired(await h.runtime.store.load_context("s1"))


async def test_an_empty_body_ends_the_turn_with_its_own_code(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT * 3):
        replies: list[dict[str, Any]] = [{"empty_body": True}, {"text": "Shorter prompt, fine."}]
        async with open_harness(tmp_path, replies=replies, dialect="openai") as h:
            await seed(h)
            frames = await h.turn("s1", "Find the answer to the question")
            (err,) = of_type(frames, "error")
            assert err["code"] == "llm_empty_response" and "OLLAMA_NUM_CTX" in err["message"]
            assert frames[-1]["reason"] == "error"
            frames = await h.turn("s1", "again")
            assert frames[-1]["text"] == "Shorter prompt, fine."


async def test_an_endless_answer_ends_the_turn_and_keeps_the_partial_answer(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT * 3):
        replies: list[dict[str, Any]] = [
            {"text": "la ", "endless": True},
            {"text": "Back to normal."},
        ]
        async with open_harness(tmp_path, replies=replies, answer_max_chars=3000) as h:
            await seed(h)
            frames = await h.turn("s1", "Find the answer to the question")
            (err,) = of_type(frames, "error")
            assert err["code"] == "answer_too_long" and "3000" in err["message"]
            end = frames[-1]
            assert end["reason"] == "error" and end["text"] == "la " * 1000
            assert h.fake is not None
            await h.fake.wait_disconnects(1)
            messages = await h.runtime.store.load_messages("s1")
            assert messages[-1]["partial"] is True and messages[-1]["content"] == "la " * 1000
            frames = await h.turn("s1", "again")
            assert frames[-1]["text"] == "Back to normal."


async def test_the_stream_timeouts_come_from_their_environment_variables(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from navi_trio.core.turn.llm_call import StreamedReply as Reply
    from navi_trio.core.turn.llm_call import stream_reply

    settings = Settings.from_env(
        {"LLM_STREAM_FIRST_CHUNK_TIMEOUT": "10", "LLM_STREAM_CHUNK_TIMEOUT": "0.3"}
    )
    replies = [
        {"delay_first": 1, "delay_chunk": 0.2, "text": "a b c"},
        {"delay_first": 11, "text": "late"},
        {"delay_chunk": 0.4, "text": "a b"},
    ]
    with trio.fail_after(1000):
        async with served(replies) as (_server, backend):
            done = await stream_reply(backend, settings, request(), Reply(), None)
            assert done.content == "a b c"
            with pytest.raises(LLMFirstChunkTimeout, match="10 s"):
                await stream_reply(backend, settings, request(), Reply(), None)
            with pytest.raises(LLMChunkTimeout, match="0.3 s"):
                await stream_reply(backend, settings, request(), Reply(), None)


# --- issue 9 quirks ---------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_a_server_hanging_up_on_a_reused_connection_is_retried_once(dialect: str) -> None:
    replies: list[dict[str, Any]] = [{"text": "one"}, {"hang_up": True}, {"text": "two"}]
    with trio.fail_after(TIMEOUT):
        async with served(replies, dialect) as (server, backend):
            first = await collect(backend)
            assert server.connections == 1
            second = await collect(backend)
    assert [c.text for c in first + second if isinstance(c, TextChunk)] == ["one", "two"]
    assert (server.hang_ups, server.connections) == (1, 2)


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_hanging_up_twice_is_a_connection_error_not_a_loop(dialect: str) -> None:
    replies: list[dict[str, Any]] = [{"hang_up": True}, {"hang_up": True}, {"text": "never"}]
    with trio.fail_after(TIMEOUT):
        async with served(replies, dialect) as (server, backend):
            with pytest.raises(LLMConnectionError, match="dropped"):
                await collect(backend)
    assert server.hang_ups == 2 and server.completed == 0


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_null_content_beside_tool_calls_is_sent_as_an_empty_string(dialect: str) -> None:
    history = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "name": "echo", "arguments": {"text": "x"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "echo", "content": "x"},
    ]
    with trio.fail_after(TIMEOUT):
        async with served([{"text": "ok"}], dialect) as (server, backend):
            await collect(backend, request(messages=history))
    sent = server.chat_requests[0]["body"]["messages"]
    assert sent[1]["content"] == "" and sent[1]["tool_calls"]
