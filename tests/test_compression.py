"""Compressor: threshold, the split that never orphans tool results, summaries that fold."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from quick_run import examples

from navi_trio.core.turn import TokenCounter
from navi_trio.core.turn.compression import (
    SUMMARY_PREFIX,
    Compressor,
    is_summary,
    over_threshold,
    split_index,
)
from navi_trio.errors import ConfigError, LLMError, NothingToCompactError
from navi_trio.profiles import AgentProfile, NaviConfig
from navi_trio.settings import REPO_ROOT, Settings

PROMPTS = REPO_ROOT / "config" / "prompts"
PROFILE = AgentProfile(id="general", system_prompt="Help.", compression_keep_recent=4)


class FakeLLM:
    """A `complete` that records what it was asked and answers from a script."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers) or ["the gist"]
        self.calls: list[tuple[list[dict[str, Any]], str]] = []

    async def __call__(self, messages: list[dict[str, Any]], purpose: str) -> str:
        self.calls.append((copy.deepcopy(messages), purpose))
        return self.answers[min(len(self.calls), len(self.answers)) - 1]


COUNTER = TokenCounter()


def config(base: Path = PROMPTS) -> NaviConfig:
    return NaviConfig(default_profile="general", profiles={"general": PROFILE}, base_dir=base)


def compressor(llm: FakeLLM, **overrides: Any) -> Compressor:
    return Compressor(Settings(**overrides), COUNTER, llm, PROMPTS)


def turn(i: int, calls: int = 1) -> list[dict[str, Any]]:
    ids = [f"c{i}_{k}" for k in range(calls)]
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": f"user request {i}"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": c, "name": "terminal", "arguments": {"n": i}} for c in ids],
        },
    ]
    msgs += [
        {"role": "tool", "tool_call_id": c, "name": "terminal", "content": f"r {c}"} for c in ids
    ]
    msgs.append({"role": "assistant", "content": f"answer {i}"})
    return msgs


def long_context(turns: int = 5) -> list[dict[str, Any]]:
    return [m for i in range(turns) for m in turn(i)]


def test_threshold_comes_from_the_model_window() -> None:
    window = Settings(num_ctx=10000, compression_threshold=0.75)
    assert Compressor(window, COUNTER, FakeLLM(), PROMPTS).threshold() == 7500
    assert not over_threshold(window, 7499)
    assert over_threshold(window, 7500)


def test_nothing_to_compress_in_a_short_context() -> None:
    comp = compressor(FakeLLM())
    short = turn(0)  # 4 messages, keep_recent 4
    assert not comp.would_compress(short, profile=PROFILE)
    assert not comp.would_compress([], profile=PROFILE)
    assert comp.would_compress(long_context(), profile=PROFILE)


def test_a_single_summary_before_the_kept_part_is_not_compressed_again() -> None:
    comp = compressor(FakeLLM())
    summary = {"role": "system", "content": f"{SUMMARY_PREFIX}\nold", "summary": True}
    assert not comp.would_compress([summary, *turn(9)], profile=PROFILE)
    # Stored system prompts (stripped from every built context) do not count either.
    stale = {"role": "system", "content": "old system prompt"}
    assert not comp.would_compress([stale, summary, *turn(9)], profile=PROFILE)
    assert comp.would_compress(
        [summary, {"role": "user", "content": "x"}, *turn(9)], profile=PROFILE
    )


async def test_compress_summarises_the_older_part_and_keeps_the_recent_verbatim() -> None:
    llm = FakeLLM("SUMMARY TEXT")
    ctx = long_context(5)  # 25 messages
    before = copy.deepcopy(ctx)
    out = await compressor(llm).compress(ctx, profile=PROFILE, config=config(), reason="forced")
    assert ctx == before
    assert out.context[0] == {
        "role": "system",
        "content": f"{SUMMARY_PREFIX}\nSUMMARY TEXT",
        "summary": True,
        "keep": True,
    }
    assert out.context[1:] == ctx[-4:]
    assert out.messages_summarised == len(ctx) - 4
    assert out.tokens_before == COUNTER.estimate_messages(ctx)
    assert out.tokens_after == COUNTER.estimate_messages(out.context)
    assert out.tokens_after < out.tokens_before
    [(messages, purpose)] = llm.calls
    assert purpose == "compression"
    transcript = messages[-1]["content"]
    for i in range(4):
        assert f"user request {i}" in transcript and f"answer {i}" in transcript
    assert "[called terminal(" in transcript and "r c0_0" in transcript
    assert "answer 4" not in transcript  # kept verbatim, not summarised


async def test_compact_twice_in_a_row_raises_nothing_to_compact() -> None:
    comp = compressor(FakeLLM())
    first = await comp.compress(long_context(), profile=PROFILE, config=config(), reason="forced")
    assert not comp.would_compress(first.context, profile=PROFILE)
    with pytest.raises(NothingToCompactError, match="nothing to compact"):
        await comp.compress(first.context, profile=PROFILE, config=config(), reason="forced")


async def test_an_existing_summary_is_folded_not_summarised_as_conversation() -> None:
    llm = FakeLLM("new summary")
    comp = compressor(llm)
    old = {"role": "system", "content": f"{SUMMARY_PREFIX}\nTHE OLD FACTS", "summary": True}
    out = await comp.compress([old, *long_context(3)], profile=PROFILE, config=config(), reason="x")
    request = llm.calls[0][0][-1]["content"]
    assert request.startswith("Summary of the earlier conversation so far")
    assert "THE OLD FACTS" in request and SUMMARY_PREFIX not in request
    assert sum(1 for m in out.context if is_summary(m)) == 1


async def test_default_prompt_carries_the_max_tokens() -> None:
    llm = FakeLLM()
    await compressor(llm, compression_max_tokens=321).compress(
        long_context(), profile=PROFILE, config=config(), reason="x"
    )
    system = llm.calls[0][0][0]["content"]
    assert system.startswith((PROMPTS / "compression.md").read_text()[:40])
    assert "at most 321 tokens" in system and "{max_tokens}" not in system


async def test_profile_prompt_file_and_max_tokens_are_used(tmp_path: Path) -> None:
    (tmp_path / "mine.md").write_text("CUSTOM RESEARCH PROMPT")
    profile = AgentProfile(
        id="r",
        compression_prompt_file="mine.md",
        compression_max_tokens=50,
        compression_keep_recent=2,
    )
    llm = FakeLLM("word " * 400)
    out = await compressor(llm).compress(
        long_context(), profile=profile, config=config(tmp_path), reason="x"
    )
    system = llm.calls[0][0][0]["content"]
    assert system.startswith("CUSTOM RESEARCH PROMPT") and "at most 50 tokens" in system
    body = out.context[0]["content"].removeprefix(SUMMARY_PREFIX)
    assert "[…truncated ~" in body
    assert COUNTER.count_text(body) <= 50 + 20  # capped (plus the cut marker)
    # keep 2 would start at a tool result: the kept part moves back to its call.
    assert out.context[1:] == long_context()[-3:]


async def test_a_missing_prompt_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    profile = AgentProfile(id="r", compression_prompt_file="gone.md")
    with pytest.raises(ConfigError, match=r"profile 'r' compression_prompt_file.*gone\.md"):
        await compressor(FakeLLM()).compress(
            long_context(), profile=profile, config=config(tmp_path), reason="x"
        )


async def test_an_empty_summary_leaves_the_context_alone() -> None:
    with pytest.raises(LLMError, match="empty summary"):
        await compressor(FakeLLM("  ")).compress(
            long_context(), profile=PROFILE, config=config(), reason="x"
        )


async def test_a_transcript_larger_than_the_window_is_folded_in_chunks() -> None:
    llm = FakeLLM("first part", "both parts")
    ctx = [m for i in range(40) for m in turn(i)]
    for m in ctx:
        if m["role"] == "tool":
            m["content"] = "tool output line. " * 40
    comp = compressor(llm, num_ctx=2048, compression_max_tokens=200)
    out = await comp.compress(ctx, profile=PROFILE, config=config(), reason="x")
    assert len(llm.calls) >= 2
    for messages, _ in llm.calls:
        assert COUNTER.estimate_messages(messages) <= 2048 - 200
    assert "first part" in llm.calls[1][0][-1]["content"]
    assert out.context[0]["content"] == f"{SUMMARY_PREFIX}\nboth parts"


async def test_kept_task_notes_are_summarised_but_stale_system_prompts_are_dropped() -> None:
    llm = FakeLLM()
    ctx: list[dict[str, Any]] = [
        {"role": "system", "content": "STALE SYSTEM PROMPT"},
        {"role": "system", "content": "TASK NOTE t1 done", "keep": True},
        *long_context(3),
    ]
    await compressor(llm).compress(ctx, profile=PROFILE, config=config(), reason="x")
    transcript = llm.calls[0][0][-1]["content"]
    assert "TASK NOTE t1 done" in transcript and "STALE SYSTEM PROMPT" not in transcript


def test_split_moves_back_to_keep_a_tool_call_with_its_results() -> None:
    ctx = [*turn(0), *turn(1, calls=3)]  # turn 1: user, call, 3 results, answer
    # keep 3 would start inside turn 1's results: move back to its assistant call.
    assert split_index(ctx, 3) == 5
    assert ctx[5]["tool_calls"]
    assert split_index(ctx, 0) == len(ctx)
    assert split_index(ctx, 100) == 0
    with pytest.raises(ValueError, match="keep_recent"):
        split_index(ctx, -1)


def test_split_follows_call_ids_across_interleaved_notes() -> None:
    ctx: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "name": "t"}]},
        {"role": "system", "content": "note", "keep": True},
        {"role": "tool", "tool_call_id": "a", "content": "ok"},
        {"role": "assistant", "content": "done"},
    ]
    assert split_index(ctx, 3) == 1


# Property: over random well-formed conversations, nothing is ever orphaned. -----------


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "text", "calls", "note", "summary"]))
        if kind == "user":
            msgs.append({"role": "user", "content": "u"})
        elif kind == "text":
            msgs.append({"role": "assistant", "content": "a"})
        elif kind == "note":
            msgs.append({"role": "system", "content": "n", "keep": draw(st.booleans())})
        elif kind == "summary":
            msgs.append({"role": "system", "content": f"{SUMMARY_PREFIX}\ns", "summary": True})
        else:
            ids = [f"id{len(msgs)}_{k}" for k in range(draw(st.integers(1, 4)))]
            msgs.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": i, "name": "t"} for i in ids],
                }
            )
            results = [{"role": "tool", "tool_call_id": i, "content": "r"} for i in ids]
            if draw(st.booleans()):
                results.insert(
                    draw(st.integers(0, len(results))), {"role": "system", "content": "n"}
                )
            msgs.extend(results)
    return msgs


def _caller_index(ctx: list[dict[str, Any]], call_id: str) -> int:
    return next(
        i for i, m in enumerate(ctx) if any(c["id"] == call_id for c in m.get("tool_calls") or ())
    )


@settings(max_examples=examples(150), deadline=None)
@given(conversations(), st.integers(0, 10))
def test_kept_part_never_holds_a_result_whose_call_was_summarised(
    ctx: list[dict[str, Any]], keep: int
) -> None:
    start = split_index(ctx, keep)
    assert 0 <= start <= max(0, len(ctx) - keep)
    if start < len(ctx) and start > 0:
        assert ctx[start]["role"] != "tool"
    for msg in ctx[start:]:
        if msg["role"] == "tool":
            assert _caller_index(ctx, msg["tool_call_id"]) >= start

    profile = AgentProfile(id="p", compression_keep_recent=keep)
    comp = compressor(FakeLLM("S"))
    if not comp.would_compress(ctx, profile=profile):
        with pytest.raises(NothingToCompactError):
            trio.run(lambda: comp.compress(ctx, profile=profile, config=config(), reason="x"))
        return
    out = trio.run(lambda: comp.compress(ctx, profile=profile, config=config(), reason="x"))
    assert out.context[1:] == ctx[start:]
    assert out.messages_summarised == start
    # Compacting the result again finds nothing new.
    assert not comp.would_compress(out.context, profile=profile)


# -- forced compression shrinks what it keeps (issue 7 #5) ---------------------------------


async def test_forced_compression_cuts_huge_kept_messages_to_fit() -> None:
    # Nothing older to summarise, but the two kept messages are far over the window.
    huge = [
        {"role": "user", "content": "START " + "word " * 3000 + "END"},
        {"role": "assistant", "content": "reply " * 2000},
    ]
    llm = FakeLLM()
    comp = compressor(llm, num_ctx=2048)
    assert not comp.would_compress(huge, profile=PROFILE)  # automatic: nothing older
    assert comp.would_compress(huge, profile=PROFILE, shrink=True)
    with pytest.raises(NothingToCompactError):
        await comp.compress(huge, profile=PROFILE, config=config(), reason="pre_turn")
    out = await comp.compress(huge, profile=PROFILE, config=config(), reason="forced", shrink=True)
    assert llm.calls == []  # no summary call: there was nothing older
    assert out.messages_summarised == 0
    assert out.tokens_after <= comp.threshold() < out.tokens_before
    user = out.context[0]["content"]
    assert user.startswith("START") and user.endswith("END") and "[…truncated ~" in user
    per = Settings(num_ctx=2048).message_token_budget
    assert all(COUNTER.estimate_message(m) <= per for m in out.context)
    assert huge[0]["content"].count("word") == 3000  # the input is not touched
    # Once it fits, there is nothing left to do.
    assert not comp.would_compress(out.context, profile=PROFILE, shrink=True)


async def test_forced_compression_summarises_and_cuts_many_kept_messages_to_the_threshold() -> None:
    # Eight kept messages, each under the per-message budget, together over the threshold.
    kept = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"k{i} " + "word " * 330}
        for i in range(8)
    ]
    profile = AgentProfile(id="general", compression_keep_recent=8)
    context = [*turn(0), *kept]
    comp = compressor(FakeLLM("GIST"), num_ctx=2048)
    out = await comp.compress(context, profile=profile, config=config(), reason="forced",
                              shrink=True)  # fmt: skip
    assert out.context[0]["content"] == f"{SUMMARY_PREFIX}\nGIST"
    assert [m["content"].split()[0] for m in out.context[1:]] == [f"k{i}" for i in range(8)]
    assert out.tokens_after <= comp.threshold()
    # Without shrink the kept part stays word for word (automatic compression).
    plain = await comp.compress(context, profile=profile, config=config(), reason="pre_turn")
    assert [m["content"] for m in plain.context[1:]] == [m["content"] for m in kept]


def test_shrink_keeps_a_small_call_whole_and_cuts_its_big_result() -> None:
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "name": "terminal", "arguments": {"cmd": "ls"}}],
    }
    result = {"role": "tool", "tool_call_id": "c1", "name": "terminal", "content": "x " * 4000}
    comp = compressor(FakeLLM(), num_ctx=2048)
    out = comp._shrink([call, result], budget=600)
    assert out[0] == call
    assert out[1]["tool_call_id"] == "c1" and len(out[1]["content"]) < 4000


def test_shrink_cuts_the_long_string_arguments_of_a_kept_call() -> None:
    call: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "name": "filesystem",
             "arguments": {"op": "write", "path": "a.txt", "content": "line " * 5000}},
        ],
    }  # fmt: skip
    result = {"role": "tool", "tool_call_id": "c1", "name": "filesystem", "content": "written"}
    comp = compressor(FakeLLM(), num_ctx=2048)
    assert comp.would_compress([call, result], profile=PROFILE, shrink=True)
    out = comp._shrink([call, result], budget=1000)
    args = out[0]["tool_calls"][0]["arguments"]
    assert (args["op"], args["path"]) == ("write", "a.txt")
    assert "[…truncated ~" in args["content"] and len(args["content"]) < 5000
    assert out[0]["tool_calls"][0]["id"] == "c1" and out[1] == result
    assert not comp.would_compress(out, profile=PROFILE, shrink=True)
    assert call["tool_calls"][0]["arguments"]["content"] == "line " * 5000  # input untouched
