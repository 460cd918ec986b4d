"""Request bodies joined from kept message JSON are byte for byte the plain bodies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quick_run import examples

from navi_trio.llm.base import ChatRequest
from navi_trio.llm.body_cache import BodyCache
from navi_trio.llm.http import json_body, json_text
from navi_trio.llm.ollama import ollama_body, to_ollama_message
from navi_trio.llm.openai import openai_body, to_openai_message

_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=20)
_value = st.one_of(_text, st.integers(), st.floats(allow_nan=True, allow_infinity=True))
_call = st.fixed_dictionaries(
    {"name": _text, "arguments": st.one_of(_text, st.dictionaries(_text, _value, max_size=2))},
    optional={"id": _text},
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _text},
    optional={
        "tool_calls": st.lists(_call, max_size=2),
        "name": _text,
        "tool_call_id": _text,
        "thinking": _text,
        "images": st.lists(_text, max_size=1),
    },
)
_request = st.builds(
    ChatRequest,
    messages=st.lists(_message, max_size=6),
    model=_text,
    tools=st.lists(st.fixed_dictionaries({"type": st.just("function"), "x": _value}), max_size=3),
    think=st.booleans(),
    options=st.fixed_dictionaries({}, optional={"num_ctx": st.integers(1, 9), "x": _value}),
)
OLLAMA = BodyCache(to_ollama_message)  # warm across examples, like a backend's
OPENAI = BodyCache(to_openai_message)


def _cached(
    cache: BodyCache, body: Callable[[ChatRequest], dict[str, Any]], request: ChatRequest
) -> bytes:
    return cache.body(body(attrs.evolve(request, messages=[])), request.messages)


@settings(max_examples=examples(150), deadline=None)
@given(_request, st.lists(_message, max_size=3), st.booleans())
def test_a_joined_body_is_the_plain_body(
    request: ChatRequest, added: list[dict[str, Any]], stream: bool
) -> None:
    dialects: list[tuple[BodyCache, Callable[[ChatRequest], dict[str, Any]]]] = [
        (OLLAMA, lambda r: ollama_body(r, "30m")),
        (OPENAI, lambda r: openai_body(r, stream=stream)),
    ]
    later = attrs.evolve(request, messages=[*request.messages, *added])
    # What the backends hand the cache: the body without its messages, made directly.
    empty = attrs.evolve(request, messages=[])
    assert ollama_body(request, "30m", messages=False) == ollama_body(empty, "30m")
    assert openai_body(request, stream=stream, messages=False) == openai_body(empty, stream=stream)
    for cache, body in dialects:
        for req in (request, later, later):  # new, partly kept, all kept
            assert _cached(cache, body, req) == json_body(body(req))


def test_each_message_is_converted_once_and_a_new_dict_anew() -> None:
    converted: list[str] = []

    def convert(msg: dict[str, Any]) -> dict[str, Any]:
        converted.append(msg["content"])
        return to_ollama_message(msg)

    cache = BodyCache(convert)
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    request = ChatRequest(messages=history, model="m")
    cache.body(ollama_body(attrs.evolve(request, messages=[]), ""), history)
    history.append({"role": "tool", "content": "c"})
    cache.body(ollama_body(attrs.evolve(request, messages=[]), ""), history)
    assert converted == ["a", "b", "c"]
    history[0] = {"role": "user", "content": "a2"}  # replaced, never edited in place
    body = cache.body(ollama_body(attrs.evolve(request, messages=[]), ""), history)
    assert converted == ["a", "b", "c", "a2"]
    assert body == json_body(ollama_body(attrs.evolve(request, messages=history), ""))


def test_the_cache_is_bounded_and_stays_right() -> None:
    cache = BodyCache(to_ollama_message, max_entries=3)
    history = [{"role": "user", "content": str(i)} for i in range(10)]
    request = ChatRequest(messages=history, model="m")
    for _ in range(2):
        body = cache.body(ollama_body(attrs.evolve(request, messages=[]), ""), history)
        assert body == json_body(ollama_body(request, ""))
        assert len(cache) == 3
    by_size = BodyCache(to_ollama_message, max_chars=100)
    big = [{"role": "tool", "content": "x" * 40} for _ in range(5)]
    for _ in range(2):
        body = by_size.body(ollama_body(attrs.evolve(request, messages=[]), ""), big)
        assert body == json_body(ollama_body(attrs.evolve(request, messages=big), ""))
        assert len(by_size) == 1 and 0 < by_size.chars <= 100  # one ~70-char entry fits
    huge = {"role": "tool", "content": "y" * 200}
    assert by_size.message(huge) == json_body(to_ollama_message(huge)).decode()
    assert by_size.chars <= 100
    with pytest.raises(ValueError, match="at least 1"):
        BodyCache(to_ollama_message, max_entries=0)
    with pytest.raises(ValueError, match="model and messages"):
        cache.body({"messages": [], "model": "m"}, history)


def test_each_tool_schema_is_encoded_once_while_it_is_offered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import navi_trio.llm.body_cache as body_cache

    encoded: list[Any] = []

    def spy(value: Any) -> str:
        encoded.append(value)
        return json_text(value)

    monkeypatch.setattr(body_cache, "_text", spy)
    schema = {"type": "function", "function": {"name": "echo", "parameters": {}}}
    other = {"type": "function", "function": {"name": "read", "parameters": {}}}
    cache = BodyCache(to_ollama_message)
    request = ChatRequest(messages=[{"role": "user", "content": "a"}], model="m", tools=[schema])

    def carried(value: Any, tool: dict[str, Any]) -> bool:
        """Whether encoding `value` wrote `tool`'s JSON (the tool itself, or a dict of
        the body holding it)."""
        return value is tool or (isinstance(value, dict) and tool in value.get("tools", ()))

    for req in (request, request, attrs.evolve(request, tools=[schema, other])):
        expected = json_body(ollama_body(req, "30m"))
        assert _cached(cache, lambda r: ollama_body(r, "30m"), req) == expected
    assert [v for v in encoded if carried(v, schema)] == [schema]
    assert [v for v in encoded if carried(v, other)] == [other]


def test_a_round_joins_only_its_new_messages_onto_the_last_rounds() -> None:
    looked: list[str] = []

    class Counting(BodyCache):
        def message(self, msg: dict[str, Any]) -> str:
            looked.append(msg["content"])
            return super().message(msg)

    cache = Counting(to_ollama_message)

    def sent(messages: list[dict[str, Any]]) -> list[str]:
        looked.clear()
        empty = ChatRequest(messages=[], model="m")
        body = cache.body(ollama_body(empty, ""), messages)
        assert body == json_body(ollama_body(attrs.evolve(empty, messages=messages), ""))
        return list(looked)

    def note(text: str) -> dict[str, Any]:
        return {"role": "system", "content": text}

    system = note("s")
    history = [system, {"role": "user", "content": "u"}]
    assert sent([*history, note("n1")]) == ["s", "u", "n1"]
    history.append({"role": "assistant", "content": "a"})
    # The round's note is not kept: the next round's differs.
    assert sent([*history, note("n2")]) == ["a", "n2"]
    assert sent(history) == []
    history[1] = {"role": "user", "content": "u2"}  # replaced in the middle: all again
    assert sent(history) == ["s", "u2", "a"]
    assert sent(history[:2]) == ["s", "u2"]  # a shorter list: not the kept one
    # Another conversation whose first message is equal, not the same dict: its own.
    assert sent([dict(system), {"role": "user", "content": "x"}]) == ["s", "x"]
    assert sent([note("only"), note("notes")]) == ["only", "notes"]
    assert sent([]) == []


def test_the_kept_joins_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import navi_trio.llm.body_cache as body_cache

    monkeypatch.setattr(body_cache, "MAX_PREFIXES", 2)
    cache = BodyCache(to_ollama_message, max_chars=200)
    empty = ChatRequest(messages=[], model="m")
    for i in range(5):  # five conversations: never more than two kept
        history = [{"role": "user", "content": f"{i}"}, {"role": "tool", "content": "x" * 20}]
        for _ in range(2):
            body = cache.body(ollama_body(empty, ""), history)
            assert body == json_body(ollama_body(attrs.evolve(empty, messages=history), ""))
        assert len(cache._prefixes) <= 2 and 0 < cache.prefix_chars <= 200
    big = [{"role": "tool", "content": "y" * 300}]  # its join alone is over the bound
    body = cache.body(ollama_body(empty, ""), big)
    assert body == json_body(ollama_body(attrs.evolve(empty, messages=big), ""))
    assert cache.prefix_chars <= 200


def test_kept_messages_are_taken_by_identity_and_their_characters_counted_once() -> None:
    cache = BodyCache(to_ollama_message)
    empty = ChatRequest(messages=[], model="m")

    def sent(messages: list[dict[str, Any]]) -> None:
        body = cache.body(ollama_body(empty, ""), messages)
        assert body == json_body(ollama_body(attrs.evolve(empty, messages=messages), ""))

    history: list[dict[str, Any]] = [{"role": "user", "content": "u"}]
    for i in range(3):  # one conversation, kept again each round: its own text counted once
        history.append({"role": "assistant", "content": f"a{i}"})
        sent(history)
        assert cache.prefix_chars == len(", ".join(map(cache.message, history)))
    # Equal to the kept message, not the same: its arguments' keys in another order are
    # other JSON, so the body is made of the new one.
    call = {"id": "c1", "name": "f", "arguments": {"a": 1, "b": 2}}
    history[1] = {"role": "assistant", "content": "", "tool_calls": [call]}
    sent(history)
    swapped = {**call, "arguments": {"b": 2, "a": 1}}
    history[1] = {"role": "assistant", "content": "", "tool_calls": [swapped]}
    assert history[1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    sent(history)


def test_the_kept_joins_are_bounded_by_characters_below_the_count() -> None:
    cache = BodyCache(to_ollama_message, max_chars=200)
    empty = ChatRequest(messages=[], model="m")
    for i in range(8):  # far fewer conversations than MAX_PREFIXES, more characters
        history = [{"role": "user", "content": f"{i}"}, {"role": "tool", "content": "x" * 20}]
        body = cache.body(ollama_body(empty, ""), history)
        assert body == json_body(ollama_body(attrs.evolve(empty, messages=history), ""))
        assert 0 < cache.prefix_chars <= 200


def test_the_kept_joins_are_bounded_in_count(monkeypatch: pytest.MonkeyPatch) -> None:
    import navi_trio.llm.body_cache as body_cache

    monkeypatch.setattr(body_cache, "MAX_PREFIXES", 2)
    cache = BodyCache(to_ollama_message)  # characters far from their bound
    empty = ChatRequest(messages=[], model="m")
    for i in range(5):
        history = [{"role": "user", "content": f"{i}"}]
        cache.body(ollama_body(empty, ""), history)
        assert 1 <= len(cache._prefixes) <= 2
