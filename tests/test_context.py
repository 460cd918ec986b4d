"""ContextBuilder: system prompt (cached per profile), memory, stripping, view truncation."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from agent_tools import seed

from navi_trio.core.turn import ContextBuilder, TokenCounter
from navi_trio.core.turn.context import MEMORY_HEADER, PARALLEL_CALLS_NOTE
from navi_trio.errors import ContextTooLargeError
from navi_trio.profiles import AgentProfile, NaviConfig
from navi_trio.settings import Settings
from navi_trio.testing import open_harness

PERSONA = "You are Navi."
GENERAL = AgentProfile(
    id="general", system_prompt="Help the user.", subagent_system_prompt="Do the sub-task."
)
PLAIN = AgentProfile(id="plain", system_prompt="Plain prompt.")


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


@pytest.fixture
def config() -> NaviConfig:
    return NaviConfig(
        persona=PERSONA, default_profile="general", profiles={"general": GENERAL, "plain": PLAIN}
    )


@pytest.fixture
def builder(counter: TokenCounter) -> ContextBuilder:
    return ContextBuilder(Settings(num_ctx=6000), counter)


def conversation() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "an old stored system prompt"},
        {"role": "user", "content": "list my files"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "filesystem", "arguments": {"op": "ls"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "filesystem", "content": "a.txt b.txt"},
        {"role": "system", "content": "[Background task t1 completed] result: 42", "keep": True},
        {"role": "assistant", "content": "You have a.txt and b.txt."},
    ]


def test_system_message_is_persona_separator_profile_prompt(
    builder: ContextBuilder, config: NaviConfig
) -> None:
    assert builder.system_prompt(config, GENERAL) == f"{PERSONA}\n\n---\n\nHelp the user."
    assert builder.system_prompt(config, GENERAL, subagent=True).endswith("Do the sub-task.")
    # A profile without a sub-agent prompt falls back to its system prompt.
    assert builder.system_prompt(config, PLAIN, subagent=True).endswith("Plain prompt.")
    no_persona = attrs.evolve(config, persona="")
    assert ContextBuilder(Settings(), TokenCounter()).system_prompt(no_persona, PLAIN) == (
        "Plain prompt."
    )


def test_system_prompt_is_cached_per_profile_until_invalidated(
    builder: ContextBuilder, config: NaviConfig
) -> None:
    assert builder.system_prompt(config, GENERAL).endswith("Help the user.")
    builder.system_prompt(config, PLAIN)
    edited = attrs.evolve(GENERAL, system_prompt="Help the user, briefly.")
    assert builder.system_prompt(config, edited).endswith("Help the user.")  # cached
    builder.invalidate("plain")  # another profile: no effect on general
    assert builder.system_prompt(config, edited).endswith("Help the user.")
    builder.invalidate("general")
    assert builder.system_prompt(config, edited).endswith("Help the user, briefly.")
    builder.invalidate()
    assert builder.system_prompt(config, PLAIN).endswith("Plain prompt.")


def test_a_cached_system_prompt_serves_only_the_config_it_was_built_from(
    builder: ContextBuilder, config: NaviConfig
) -> None:
    """A reloaded config is a new object: a prompt cached for the older one (by a turn
    still running on it) is not handed to the newer one, and the other way round."""
    new = attrs.evolve(config, persona="You are Navi 2.")
    assert builder.system_prompt(config, GENERAL).startswith(PERSONA)
    assert builder.system_prompt(new, GENERAL).startswith("You are Navi 2.")
    assert builder.system_prompt(config, GENERAL).startswith(PERSONA)
    assert builder.system_prompt(new, GENERAL, subagent=True).startswith("You are Navi 2.")


def test_override_is_used_verbatim_and_not_cached(
    builder: ContextBuilder, config: NaviConfig
) -> None:
    built = builder.build(config=config, profile=GENERAL, context=[], system_override="Custom.")
    assert built == [{"role": "system", "content": "Custom."}]
    assert builder.system_prompt(config, GENERAL).endswith("Help the user.")


def test_memory_message_follows_the_system_message(
    builder: ContextBuilder, config: NaviConfig
) -> None:
    built = builder.build(
        config=config,
        profile=GENERAL,
        context=[{"role": "user", "content": "hi"}],
        memories=["likes tea", "  ", "works in Lyon "],
    )
    assert [m["role"] for m in built] == ["system", "system", "user"]
    assert built[1]["content"] == f"{MEMORY_HEADER}\n- likes tea\n- works in Lyon"
    without = builder.build(config=config, profile=GENERAL, context=[], memories=[" "])
    assert len(without) == 1


def test_stored_system_messages_are_stripped_but_keep_marked_notes_stay(
    builder: ContextBuilder, config: NaviConfig
) -> None:
    ctx = conversation()
    built = builder.build(config=config, profile=GENERAL, context=ctx)
    contents = [m["content"] for m in built]
    assert "an old stored system prompt" not in contents
    assert "[Background task t1 completed] result: 42" in contents
    assert built[1:] == [m for m in ctx if m["role"] != "system" or m.get("keep")]
    assert sum(1 for m in built if m["content"].startswith(PERSONA)) == 1


def test_summary_messages_survive_stripping(builder: ContextBuilder, config: NaviConfig) -> None:
    summary = {"role": "system", "content": "[Summary of earlier conversation]\nx", "summary": True}
    built = builder.build(config=config, profile=GENERAL, context=[summary])
    assert built[1] == summary


def test_extra_notes_are_appended_at_the_end(builder: ContextBuilder, config: NaviConfig) -> None:
    extra = [{"role": "system", "content": "You have 3 iterations left."}]
    built = builder.build(
        config=config, profile=GENERAL, context=conversation(), memories=["x"], extra=extra
    )
    assert built[-1] == extra[0]
    assert built[-1] is not extra[0]


def test_huge_tool_result_is_cut_in_the_view_only(
    counter: TokenCounter, config: NaviConfig
) -> None:
    settings = Settings(num_ctx=6000)  # budget: 6000 // 6 = 1000 tokens
    builder = ContextBuilder(settings, counter)
    huge = "HEAD-LINE\n" + "\n".join(f"line {i}: some output here" for i in range(3000)) + "\nTAIL"
    ctx: list[dict[str, Any]] = [
        {"role": "user", "content": "run it"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "terminal", "arguments": {"cmd": "build"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "terminal", "content": huge},
        {"role": "assistant", "content": "It built. " * 900},
        {"role": "user", "content": "user text is never cut " * 300},
    ]
    before = copy.deepcopy(ctx)
    built = builder.build(config=config, profile=GENERAL, context=ctx)
    assert ctx == before  # deep equality: the stored messages are untouched
    assert ctx[2]["content"] is huge
    tool_view, answer_view, user_view = built[3], built[4], built[5]
    assert tool_view["content"].startswith("HEAD-LINE") and tool_view["content"].endswith("TAIL")
    assert "[…truncated ~" in tool_view["content"] and "tokens…]" in tool_view["content"]
    assert counter.estimate_message(tool_view) <= settings.message_token_budget
    assert tool_view["tool_call_id"] == "c1" and tool_view["name"] == "terminal"
    assert "[…truncated ~" in answer_view["content"]
    assert counter.estimate_message(answer_view) <= settings.message_token_budget
    assert user_view == ctx[4]


def test_budget_setting_overrides_the_automatic_one(
    counter: TokenCounter, config: NaviConfig
) -> None:
    msg = {"role": "tool", "tool_call_id": "c", "content": "word " * 500}
    auto = ContextBuilder(Settings(num_ctx=8192), counter)
    assert auto.build(config=config, profile=GENERAL, context=[msg])[1] == msg
    tight = ContextBuilder(Settings(num_ctx=8192, context_message_token_budget=100), counter)
    view = tight.build(config=config, profile=GENERAL, context=[msg])[1]
    assert "[…truncated ~" in view["content"]
    assert counter.estimate_message(view) <= 100


def test_a_message_of_exactly_the_budget_is_sent_whole(
    counter: TokenCounter, config: NaviConfig
) -> None:
    """agent-loop.md, "Per-message view truncation": only a message whose size *exceeds*
    CONTEXT_MESSAGE_TOKEN_BUDGET is cut; one at the budget goes whole."""
    msg = {"role": "tool", "tool_call_id": "c", "content": "word " * 500}
    size = counter.estimate_message(msg)
    at = ContextBuilder(Settings(num_ctx=8192, context_message_token_budget=size), counter)
    assert at.build(config=config, profile=GENERAL, context=[msg])[1] == msg
    over = ContextBuilder(Settings(num_ctx=8192, context_message_token_budget=size - 1), counter)
    assert (
        "[…truncated ~" in over.build(config=config, profile=GENERAL, context=[msg])[1]["content"]
    )


def test_check_context_size_raises_when_it_will_not_fit(
    builder: ContextBuilder, counter: TokenCounter, config: NaviConfig
) -> None:
    small = builder.build(config=config, profile=GENERAL, context=conversation())
    assert builder.check_context_size(small, num_ctx=8192) == counter.estimate_messages(small)
    big = [{"role": "user", "content": f"sentence number {i}. " * 20} for i in range(60)]
    tokens = counter.estimate_messages(big)
    with pytest.raises(ContextTooLargeError) as info:
        builder.check_context_size(big, num_ctx=tokens + 100)  # default reserve: 1024
    assert info.value.tokens == tokens
    assert info.value.limit == tokens + 100 - min(1024, (tokens + 100) // 8)
    assert builder.check_context_size(big, num_ctx=tokens + 100, reserve=100) == tokens
    with pytest.raises(ValueError, match="num_ctx"):
        builder.check_context_size(big, num_ctx=0)


@pytest.mark.parametrize(
    ("context", "error", "words"),
    [
        (["hello"], TypeError, r"context\[0\] must be a message dict"),
        ([{"role": "bot", "content": "x"}], ValueError, r"context\[0\] has role 'bot'"),
    ],
)
def test_bad_context_entries_are_named(
    builder: ContextBuilder, config: NaviConfig, context: Any, error: type, words: str
) -> None:
    with pytest.raises(error, match=words):
        builder.build(config=config, profile=GENERAL, context=context)


def test_memories_must_be_strings(builder: ContextBuilder, config: NaviConfig) -> None:
    with pytest.raises(TypeError, match=r"memories\[1\] must be a string"):
        builder.build(config=config, profile=GENERAL, context=[], memories=["a", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not one string"):
        builder.build(config=config, profile=GENERAL, context=[], memories="likes tea")


# -- the parallel-calls rule (issue 7 #19) -------------------------------------------------


def test_the_batching_rule_is_in_the_system_message_only_with_parallel_calls(
    counter: TokenCounter, config: NaviConfig
) -> None:
    off = ContextBuilder(Settings(), counter)
    on = ContextBuilder(Settings(parallel_tool_calls=True), counter)
    msgs = [{"role": "user", "content": "hi"}]
    plain = off.build(config=config, profile=GENERAL, context=msgs)[0]["content"]
    assert PARALLEL_CALLS_NOTE not in plain
    for builder, profile in (
        (on, GENERAL),  # the setting turns it on
        (off, attrs.evolve(GENERAL, parallel_tool_calls=True)),  # the profile does
    ):
        for kwargs in ({}, {"subagent": True}, {"system_override": "Custom sub-agent."}):
            system = builder.build(config=config, profile=profile, context=msgs, **kwargs)[0]
            assert system["content"].endswith(PARALLEL_CALLS_NOTE), kwargs
    system = on.build(
        config=config, profile=attrs.evolve(GENERAL, parallel_tool_calls=False), context=msgs
    )[0]
    assert PARALLEL_CALLS_NOTE not in system["content"]


async def test_the_coder_profile_sends_the_batching_rule_to_the_model(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_harness(tmp_path, replies=[{"text": "ok"}]) as h:
            await seed(h, "s-coder", profile_id="coder")
            await seed(h, "s-general", profile_id="general")
            h.add_replies({"text": "ok"})
            await h.turn("s-coder", "hi")  # casual: no planning call
            await h.turn("s-general", "hi")
            coder, general = (r["messages"][0]["content"] for r in h.chat_requests)
            assert "Batch only calls that are independent" in coder
            assert "Batch only calls that are independent" not in general


def test_check_context_size_needs_no_encoding_while_a_bound_fits(
    counter: TokenCounter, config: NaviConfig
) -> None:
    # The first LLM request of `navi run` must not wait for the cl100k load.
    fresh = TokenCounter()
    builder = ContextBuilder(Settings(), fresh)
    small = builder.build(config=config, profile=GENERAL, context=conversation())
    assert builder.check_context_size(small, num_ctx=32768) >= counter.estimate_messages(small)
    assert not fresh.loaded
    # When the bound does not fit, the real count decides (and loads the encoding).
    big = [{"role": "user", "content": f"sentence number {i}. " * 20} for i in range(60)]
    tokens = counter.estimate_messages(big)
    assert builder.check_context_size(big, num_ctx=tokens + 100, reserve=100) == tokens
    assert fresh.loaded
