"""Counting a round costs only what is new: cached keys/estimates equal fresh ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quick_run import examples

from navi_trio.core.turn import ContextBuilder, TokenCounter
from navi_trio.core.turn import tokens as tokens_module
from navi_trio.core.turn.tokens import Baseline, message_key
from navi_trio.profiles import AgentProfile, NaviConfig
from navi_trio.settings import Settings

_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=30)
_args = st.one_of(
    _text, st.dictionaries(st.sampled_from(["cmd", "path", "n"]), st.one_of(_text, st.integers()))
)
_call = st.fixed_dictionaries(
    {"name": st.sampled_from(["echo", "terminal", ""]), "arguments": _args},
    optional={"id": _text},
)
_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "tool"]), "content": _text},
        optional={"name": _text, "tool_call_id": _text},
    ),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.one_of(st.none(), _text)},
        optional={"tool_calls": st.lists(_call, max_size=3)},
    ),
)

SHARED = TokenCounter()  # warm across examples, like a long-running daemon's counter


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(_message, max_size=12), st.lists(_message, max_size=4), st.integers(1, 5000))
def test_cached_counts_equal_fresh_counts(
    history: list[dict[str, Any]], added: list[dict[str, Any]], real: int
) -> None:
    # Rounds see shallow copies sharing the tool-call lists, as ContextBuilder.build makes.
    first = [dict(m) for m in history]
    second = [dict(m) for m in [*history, *added]]
    for msg in second:
        assert SHARED.key(msg) == message_key(msg)
    fresh = sum(TokenCounter().estimate_message(m) for m in second)
    assert SHARED.estimate_messages(first) == sum(TokenCounter().estimate_message(m) for m in first)
    assert SHARED.estimate_messages(second) == fresh
    assert SHARED.estimate_messages(second) == fresh  # all hits now
    baseline = Baseline()
    baseline.record_real_baseline(real, first)
    got = baseline.real_baseline_estimate(second, SHARED)
    if first:
        assert got == max(0, real + sum(TokenCounter().estimate_message(m) for m in added))
    else:
        assert got == fresh


def test_a_changed_tool_call_list_is_a_new_list_and_counts_anew() -> None:
    counter = TokenCounter()
    calls = [{"name": "echo", "arguments": {"text": "a"}}]
    msg = {"role": "assistant", "content": "", "tool_calls": calls}
    before = counter.estimate_message(msg)
    other = {**msg, "tool_calls": [{"name": "echo", "arguments": {"text": "a " * 50}}]}
    assert counter.estimate_message(other) == TokenCounter().estimate_message(other) > before


class _CountingJson:
    """Stands in for tokens.py's JSON encoder (`_KEYED_JSON`) and counts its calls."""

    def __init__(self, real: Callable[[Any], str]) -> None:
        self.real = real
        self.dumps_calls = 0

    def __call__(self, value: Any) -> str:
        self.dumps_calls += 1
        return self.real(value)


def _round(i: int) -> list[dict[str, Any]]:
    calls = [{"id": f"c{i}", "name": "echo", "arguments": {"text": f"ping {i}"}}]
    return [
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": f"ping {i}", "tool_call_id": f"c{i}", "name": "echo"},
    ]


def _recording(counter: TokenCounter, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts `counter` encodes from now on, in order."""
    encoded: list[str] = []
    real_encode = counter.encode

    def encode(text: str) -> list[int]:
        encoded.append(text)
        return real_encode(text)

    monkeypatch.setattr(counter, "encode", encode)
    return encoded


def _round_work(history_rounds: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """(json.dumps calls, texts encoded) of one tool-loop round after `history_rounds`."""
    counter = TokenCounter()
    encoded = _recording(counter, monkeypatch)
    builder = ContextBuilder(Settings(), counter)
    profile = AgentProfile(id="p", system_prompt="Help.")
    config = NaviConfig(persona="Navi.", default_profile="p", profiles={"p": profile})
    context: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    baseline = Baseline()
    spy = _CountingJson(tokens_module._KEYED_JSON)
    monkeypatch.setattr(tokens_module, "_KEYED_JSON", spy)

    def one_round(i: int) -> None:
        built = builder.build(config=config, profile=profile, context=context)
        baseline.real_baseline_estimate(built, counter)
        builder.check_context_size(built, num_ctx=10**9)
        baseline.record_real_baseline(1000 + i, built)
        context.extend(_round(i))

    for i in range(history_rounds):
        one_round(i)
    spy.dumps_calls, encoded[:] = 0, []
    one_round(history_rounds)
    return spy.dumps_calls, len(encoded)


def test_a_rounds_counting_work_does_not_grow_with_history(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    short = _round_work(5, monkeypatch)
    long = _round_work(200, monkeypatch)
    assert long == short
    assert short[0] <= 2  # the new round's tool calls only


def test_a_role_and_a_tool_name_are_encoded_once_a_counter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counter = TokenCounter()
    encoded = _recording(counter, monkeypatch)
    long_name = "n" * 100  # a name the model made long is counted, not kept
    messages = [
        {"role": "tool", "content": f"out {i}", "name": name, "tool_call_id": f"c{i}"}
        for i, name in enumerate(["echo", "echo", long_name, long_name])
    ]
    estimates = [counter.estimate_message(m) for m in messages]
    assert encoded.count("tool") == 1 and encoded.count("echo") == 1
    assert encoded.count(long_name) == 2
    assert estimates == [TokenCounter().estimate_message(m) for m in messages]
