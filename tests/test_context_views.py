"""A turn's `ContextViews`: a round builds and counts only what is new, and never goes stale.

Against fresh builds and a fresh `TokenCounter` after every change a turn can make to
its context: messages appended (a round, a queued message), a compression (a new list),
the last entry replaced, an explicit invalidation (a profile switch, an edit).
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quick_run import examples

from navi_trio.core.turn import ContextBuilder, ContextViews, TokenCounter
from navi_trio.core.turn import context as context_module
from navi_trio.core.turn import tokens as tokens_module
from navi_trio.core.turn.tokens import Baseline
from navi_trio.profiles import AgentProfile, NaviConfig
from navi_trio.settings import Settings

_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40)
_call = st.fixed_dictionaries({"id": _text, "name": st.sampled_from(["echo", "terminal"]),
                               "arguments": st.dictionaries(st.just("text"), _text)})  # fmt: skip
_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "tool", "system"]), "content": _text},
        optional={"keep": st.booleans(), "tool_call_id": _text},
    ),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": _text},
        optional={"tool_calls": st.lists(_call, max_size=2)},
    ),
)
_op = st.one_of(
    st.tuples(st.just("append"), st.lists(_message, min_size=1, max_size=3)),
    st.tuples(st.just("compress"), st.integers(0, 4)),
    st.tuples(st.just("edit_last"), _text),
    st.tuples(st.just("edit_and_invalidate"), _text),
    st.tuples(st.just("shrink"), st.integers(1, 3)),
    st.tuples(st.just("nothing"), st.none()),
)

PROFILE = AgentProfile(id="p", system_prompt="Help.")
CONFIG = NaviConfig(persona="Navi.", default_profile="p", profiles={"p": PROFILE})
SHARED = TokenCounter()  # warm across examples, like a daemon's counter


def _apply(op: tuple[str, Any], context: list[dict[str, Any]], views: ContextViews) -> list[Any]:
    kind, arg = op
    if kind == "append":
        context.extend(dict(m) for m in arg)
    elif kind == "compress":  # what the turn does: the context becomes a new list
        summary = {"role": "system", "content": "summary", "summary": True}
        context = [summary, *context[len(context) - arg :]] if arg else [summary]
    elif kind == "edit_last" and context:
        context[-1] = {**context[-1], "content": arg}
    elif kind == "edit_and_invalidate" and context:
        context[0] = {**context[0], "content": arg}
        views.invalidate()
    elif kind == "shrink":
        del context[max(0, len(context) - arg) :]
    return context


@settings(max_examples=examples(80), deadline=None)
@given(
    st.lists(_message, max_size=6),
    st.lists(st.tuples(_op, st.lists(_message, max_size=2)), max_size=8),
    st.lists(_text, max_size=2),
    st.integers(8, 60),
)
def test_views_build_and_count_what_a_fresh_build_does(
    start: list[dict[str, Any]],
    ops: list[tuple[tuple[str, Any], list[dict[str, Any]]]],
    memories: list[str],
    budget: int,
) -> None:
    # A small budget makes some views head/tail cuts, which must be kept too.
    builder = ContextBuilder(Settings(context_message_token_budget=budget), SHARED)
    views = ContextViews()
    context = [dict(m) for m in start]
    for op, extra in [(("nothing", None), []), *ops]:
        context = _apply(op, context, views)
        kw: dict[str, Any] = {"config": CONFIG, "profile": PROFILE, "memories": memories}
        built = builder.build(context=context, extra=extra, views=views, **kw)
        fresh = builder.build(context=context, extra=extra, **kw)
        assert built == fresh
        counter = TokenCounter()
        assert builder.estimate(built, views) == counter.estimate_messages(fresh)
        assert builder.bound(built, views) == counter.bound_messages(fresh)
        assert builder.check_context_size(built, num_ctx=10**9, views=views) == (
            counter.estimate_messages(fresh)
        )


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(_message, max_size=8), st.lists(_message, max_size=4), st.integers(1, 5000))
def test_the_baseline_estimate_with_views_equals_a_fresh_one(
    history: list[dict[str, Any]], added: list[dict[str, Any]], real: int
) -> None:
    builder = ContextBuilder(Settings(), SHARED)
    views = ContextViews()
    context = [dict(m) for m in history]
    note = [{"role": "system", "content": "[Iteration 1 of 9]"}]
    kw: dict[str, Any] = {"config": CONFIG, "profile": PROFILE}
    first = builder.build(context=context, extra=note, views=views, **kw)
    baseline = Baseline()
    baseline.record_real_baseline(real, first)
    context.extend(dict(m) for m in added)
    note2 = [{"role": "system", "content": "[Iteration 2 of 9]"}]
    second = builder.build(context=context, extra=note2, views=views, **kw)
    fresh = Baseline()
    earlier = builder.build(context=context[: len(history)], extra=note, **kw)
    fresh.record_real_baseline(real, earlier)
    expected = fresh.real_baseline_estimate(
        builder.build(context=context, extra=note2, **kw), TokenCounter()
    )
    total = lambda: builder.estimate(second, views)  # noqa: E731
    assert baseline.real_baseline_estimate(second, SHARED, total) == expected


def _round(i: int) -> list[dict[str, Any]]:
    calls = [{"id": f"c{i}", "name": "echo", "arguments": {"text": f"ping {i}"}}]
    return [
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": f"ping {i}", "tool_call_id": f"c{i}", "name": "echo"},
    ]


def _round_work(history_rounds: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, int]:
    """(messages checked, messages keyed, lines run in context.py and tokens.py) in one
    round after `history_rounds` rounds, doing what a turn does each round: build, size
    check, baseline estimate, record. The line count catches any loop over the history."""
    counter = TokenCounter()
    builder = ContextBuilder(Settings(), counter)
    views = ContextViews()
    baseline = Baseline()
    checked, keyed = [0], [0]
    real_check, real_key = context_module._check_message, counter.key

    def check(msg: Any, where: str) -> None:
        checked[0] += 1
        real_check(msg, where)

    def key(msg: Any) -> Any:
        keyed[0] += 1
        return real_key(msg)

    monkeypatch.setattr(context_module, "_check_message", check)
    monkeypatch.setattr(counter, "key", key)
    context: list[dict[str, Any]] = [{"role": "user", "content": "go"}]

    def one_round(i: int) -> None:
        note = [{"role": "system", "content": f"[Iteration {i}]"}]
        built = builder.build(config=CONFIG, profile=PROFILE, context=context, extra=note,
                              views=views)  # fmt: skip
        baseline.real_baseline_estimate(built, counter, lambda: builder.estimate(built, views))
        builder.check_context_size(built, num_ctx=10**9, views=views)
        builder.estimate(built, views)  # the truncation check after the call
        baseline.record_real_baseline(1000 + i, built)
        context.extend(_round(i))

    for i in range(history_rounds):
        one_round(i)
    checked[0] = keyed[0] = 0
    lines = [0]
    watched = {context_module.__file__, tokens_module.__file__}

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename not in watched:
            return None

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            lines[0] += event == "line"
            return local

        return local

    sys.settrace(tracer)
    try:
        one_round(history_rounds)
    finally:
        sys.settrace(None)
    return checked[0], keyed[0], lines[0]


def test_a_rounds_build_and_count_do_not_grow_with_history(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    short = _round_work(5, monkeypatch)
    long = _round_work(300, monkeypatch)
    assert long == short
    assert short[0] <= 3  # the round's two new messages and the note


def test_a_new_list_or_an_invalidation_starts_over() -> None:
    builder = ContextBuilder(Settings(), SHARED)
    views = ContextViews()
    context = [{"role": "user", "content": "one"}]
    kw: dict[str, Any] = {"config": CONFIG, "profile": PROFILE, "views": views}
    builder.build(context=context, **kw)
    kept = views.views[0]
    context.append({"role": "assistant", "content": "two"})
    builder.build(context=context, **kw)
    assert views.views[0] is kept  # reused, not copied again
    builder.build(context=list(context), **kw)
    assert views.views[0] is not kept  # another list: compression or a reload
    kept = views.views[0]
    views.invalidate()
    builder.build(context=context, **kw)
    assert views.views[0] is not kept


def test_the_system_and_memory_messages_are_the_same_dicts_while_their_text_is() -> None:
    builder = ContextBuilder(Settings(), SHARED)
    views = ContextViews()
    context = [{"role": "user", "content": "one"}]
    kw: dict[str, Any] = {"config": CONFIG, "profile": PROFILE, "views": views}
    first = builder.build(context=context, memories=["likes tea"], project="# AGENTS", **kw)
    context.append({"role": "assistant", "content": "two"})
    again = builder.build(context=context, memories=["likes tea"], project="# AGENTS", **kw)
    assert again[0] is first[0] and again[1] is first[1]  # sent as kept JSON, counted once
    other = builder.build(context=context, memories=["likes tea"], project="# CHANGED", **kw)
    assert other[0] is not first[0] and "# CHANGED" in other[0]["content"]
    assert other[1] is first[1]
    fewer = builder.build(context=context, project="# CHANGED", **kw)  # memories gone
    assert fewer[0] is other[0]
    assert fewer == builder.build(
        context=context, project="# CHANGED", config=CONFIG, profile=PROFILE
    )
