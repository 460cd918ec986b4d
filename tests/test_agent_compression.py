"""The compression paths of the loop: pre-turn, mid-turn (driven by the real prompt
baseline), the worker after StreamEnd (with the profile's overrides), and the
truthful-context path (the model counted far fewer prompt tokens than we sent).

Token numbers: num_ctx=2048, so compression starts at 1536 estimated tokens and a
built context may hold 1792. A filler of N words ("word word …") is ~N tokens. The
profiles cap summaries at 200 tokens so that one summary call holds the whole older
part (with the default 1024 the summariser would fold a 2048 window in chunks).

Rules: see tests/test_agent_basic.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import EchoTool, call, of_type, seed, toolset, with_tools

from navi_trio.core.turn import turn_state
from navi_trio.core.turn.compression import SUMMARY_PREFIX, Compressor
from navi_trio.testing import open_harness

TIMEOUT = 30
TASK = "Find the answer to the question"
NUM_CTX = 2048
SMALL_SUMMARY = {"compression_keep_recent": 2, "compression_max_tokens": 200}


def words(n: int, tag: str) -> str:
    return f"{tag}: " + "word " * n


async def _seed_big(h: Any, *sizes: int) -> list[dict[str, Any]]:
    """A session whose context holds alternating user/assistant messages of `sizes` words."""
    await seed(h)
    big = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": words(size, f"m{i}")}
        for i, size in enumerate(sizes)
    ]
    await h.runtime.store.append("s1", messages=big, context=big)
    return big


def _summary_request(body: dict[str, Any]) -> bool:
    return "Conversation to summarise" in body["messages"][-1]["content"]


async def test_pre_turn_compression(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [{"text": "SUMMARY-A"}, {"text": "answer"}]
        async with open_harness(
            tmp_path,
            replies=replies,
            num_ctx=NUM_CTX,
            context_message_token_budget=1000,
            profiles={"general": SMALL_SUMMARY},
        ) as h:
            # The kept part (the last message and the new one) is big, the older part
            # small enough for one summary call.
            big = await _seed_big(h, 200, 200, 200, 200, 700)
            frames = await h.turn("s1", TASK)
            started = of_type(frames, "compression_started")
            done = of_type(frames, "context_compressed")
            assert [f["reason"] for f in started + done] == ["pre_turn", "pre_turn"]
            assert started[0]["tokens_before"] >= 1536
            assert done[0]["tokens_after"] < done[0]["tokens_before"]
            assert done[0]["messages_summarised"] == 5  # "earlier" + m0..m3
            # The summary call came first, then the turn's call with the summary in it.
            reqs = h.chat_requests
            assert _summary_request(reqs[0]) and "m0: word" in reqs[0]["messages"][-1]["content"]
            sent = reqs[1]["messages"]
            assert sent[1]["content"] == f"{SUMMARY_PREFIX}\nSUMMARY-A"
            assert [m["content"] for m in sent[2:4]] == [big[-1]["content"], TASK]
            context = await h.runtime.store.load_context("s1")
            assert context[0]["summary"] is True
            assert [m["content"] for m in context[1:]] == [big[-1]["content"], TASK, "answer"]
            # The display history is never rewritten.
            messages = await h.runtime.store.load_messages("s1")
            assert len(messages) == 1 + 5 + 2


async def _mid_turn(tmp_path: Path, prompt_tokens: int | None) -> tuple[list[Any], list[Any]]:
    first: dict[str, Any] = call("echo", size=120)
    if prompt_tokens is not None:
        first["prompt_tokens"] = prompt_tokens
    replies = [first, {"text": "SUMMARY-M"}, {"text": "answer"}]
    async with open_harness(
        tmp_path,
        replies=replies,
        num_ctx=NUM_CTX,
        tools=toolset(EchoTool()),
        profiles={"general": with_tools(["echo"], **SMALL_SUMMARY)},
    ) as h:
        await seed(h)
        frames = await h.turn("s1", TASK)
        return frames, h.chat_requests


async def test_mid_turn_compression_uses_the_real_baseline(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        # The model says the first prompt was 1500 tokens (our estimate is a few
        # hundred): with the 120-word tool result the next one crosses 1536.
        frames, reqs = await _mid_turn(tmp_path / "real", 1500)
        started = of_type(frames, "compression_started")
        assert [f["reason"] for f in started] == ["mid_turn"]
        assert started[0]["tokens_before"] >= 1536
        assert not of_type(frames, "warning")
        assert len(reqs) == 3 and _summary_request(reqs[1])
        assert TASK in reqs[1]["messages"][-1]["content"]
        assert reqs[2]["messages"][1]["content"] == f"{SUMMARY_PREFIX}\nSUMMARY-M"
        # The tool call and its result are kept verbatim after the summary.
        assert [m["role"] for m in reqs[2]["messages"][2:4]] == ["assistant", "tool"]
        assert frames[-1]["text"] == "answer" and frames[-1]["iterations"] == 2

        # Same turn, but the model reports what we estimated: nothing to compress.
        frames, reqs = await _mid_turn(tmp_path / "estimate", None)
        assert not of_type(frames, "compression_started")
        assert len(reqs) == 2 and frames[-1]["text"] == "SUMMARY-M"


async def test_worker_compresses_after_stream_end_with_profile_overrides(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [{"text": "long " * 300}, {"text": "SUMMARY-W"}]
        profile: dict[str, Any] = {
            "compression_keep_recent": 2,
            "compression_max_tokens": 77,
            "compression_prompt_file": "prompts/compression_research.md",
        }
        async with open_harness(
            tmp_path,
            replies=replies,
            num_ctx=NUM_CTX,
            profiles={"general": profile},
        ) as h:
            await _seed_big(h, 300, 300, 300, 300)
            s = await h.session("s1")
            s.send(TASK)
            frames = await s.until_end()
            assert not of_type(frames, "compression_started")  # not before the answer
            after = await s.until_type("context_compressed")
            assert [(f["type"], f["reason"]) for f in after] == [
                ("compression_started", "worker"),
                ("context_compressed", "worker"),
            ]
            await s.idle()
            research = (
                h.runtime.config.current.base_dir / profile["compression_prompt_file"]
            ).read_text(encoding="utf-8")
            summary_req = h.chat_requests[1]["messages"]
            assert summary_req[0]["content"] == (
                f"{research.rstrip()}\n\nKeep the summary to at most 77 tokens."
            )
            context = await h.runtime.store.load_context("s1")
            assert context[0]["content"] == f"{SUMMARY_PREFIX}\nSUMMARY-W"
            assert [m["role"] for m in context[1:]] == ["user", "assistant"]
            assert context[1]["content"] == TASK


async def test_worker_compression_failure_does_not_end_the_stream_twice(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        replies: list[dict[str, Any]] = [
            {"text": "long " * 300},
            {"status": 500, "error_body": "no summary today"},
        ]
        async with open_harness(
            tmp_path,
            replies=replies,
            num_ctx=NUM_CTX,
            profiles={"general": SMALL_SUMMARY},
        ) as h:
            await _seed_big(h, 300, 300, 300, 300)
            s = await h.session("s1")
            s.send(TASK)
            await s.until_end()
            after = await s.until(lambda f: f["type"] in ("warning", "error", "stream_end"))
            assert after[-1]["type"] == "warning" and after[-1]["code"] == "compression_failed"
            assert "no summary today" in after[-1]["message"]
            await s.idle()
            _assert_nothing_more(s)
            # The turn's answer is saved; the context is left as it was.
            context = await h.runtime.store.load_context("s1")
            assert not any(m.get("summary") for m in context)
            assert context[-1]["content"] == "long " * 300


def _assert_nothing_more(s: Any) -> None:
    """No further frame is waiting on the subscription."""
    try:
        frame = s.subscription.frames.receive_nowait()
    except trio.WouldBlock:
        return
    raise AssertionError(f"unexpected frame after the run: {frame}")


async def test_truncated_prompt_warns_and_compresses_before_the_next_call(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [
            {**call("echo", text="x"), "prompt_tokens": 40},
            {"text": "SUMMARY-T"},
            {"text": "answer"},
        ]
        async with open_harness(
            tmp_path,
            replies=replies,
            num_ctx=NUM_CTX,
            tools=toolset(EchoTool()),
            profiles={"general": with_tools(["echo"], **SMALL_SUMMARY)},
        ) as h:
            await _seed_big(h, 520, 520)
            frames = await h.turn("s1", TASK)
            warn = [f for f in of_type(frames, "warning") if f["code"] == "prompt_truncated"]
            assert len(warn) == 1 and "40 prompt tokens" in warn[0]["message"]
            kinds = [f["type"] for f in frames]
            # Warning first, then compression, then the next call's output.
            assert (
                kinds.index("warning")
                < kinds.index("compression_started")
                < kinds.index("text_delta")
            )
            assert of_type(frames, "compression_started")[0]["reason"] == "truncated_prompt"
            reqs = h.chat_requests
            assert len(reqs) == 3 and _summary_request(reqs[1])
            assert reqs[2]["messages"][1]["content"] == f"{SUMMARY_PREFIX}\nSUMMARY-T"


async def test_a_low_prompt_count_for_a_small_prompt_is_not_truncation(tmp_path: Path) -> None:
    # Many tiny messages: our estimate (with per-message overhead) is far above a
    # server's rough count, but a prompt this far below the window cannot have been cut.
    with trio.fail_after(TIMEOUT):
        replies = [{"text": "ok", "prompt_tokens": 40}]
        async with open_harness(tmp_path, replies=replies, loop=True, num_ctx=NUM_CTX) as h:
            for _ in range(30):
                frames = await h.turn("s1", "hi")
                assert not of_type(frames, "warning"), frames
            assert len(h.chat_requests) == 30  # no compression call ever


async def test_truncated_final_answer_compresses_before_the_next_turns_first_call(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        replies: list[dict[str, Any]] = [
            {"text": "an answer", "prompt_tokens": 40},
            {"text": "SUMMARY-N"},
            {"text": "next answer"},
        ]
        async with open_harness(
            tmp_path,
            replies=replies,
            num_ctx=NUM_CTX,
            profiles={"general": SMALL_SUMMARY},
        ) as h:
            await _seed_big(h, 520, 520)
            frames = await h.turn("s1", TASK)
            assert [f["code"] for f in of_type(frames, "warning")] == ["prompt_truncated"]
            assert not of_type(frames, "compression_started")  # nothing left to call
            frames = await h.turn("s1", "and then?")
            started = of_type(frames, "compression_started")
            assert [f["reason"] for f in started] == ["truncated_prompt"]
            reqs = h.chat_requests
            assert _summary_request(reqs[1])
            assert reqs[2]["messages"][1]["content"] == f"{SUMMARY_PREFIX}\nSUMMARY-N"
            assert frames[-1]["text"] == "next answer"


async def test_stop_during_a_compression_leaves_the_context_as_it_was(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        replies = [{"text": "half a summ", "stall": True}]
        async with open_harness(
            tmp_path,
            replies=replies,
            num_ctx=NUM_CTX,
            context_message_token_budget=1000,
            profiles={"general": SMALL_SUMMARY},
        ) as h:
            await _seed_big(h, 200, 200, 200, 200, 700)
            before = await h.runtime.store.load_context("s1")
            s = await h.session("s1")
            s.send(TASK)
            await s.until_type("compression_started")
            assert h.fake is not None
            await h.fake.wait_requests(1)
            s.stop()
            frames = await s.until_end()
            assert frames[-1]["stopped"] is True
            assert not of_type(frames, "context_compressed") and not of_type(frames, "text_delta")
            await h.fake.wait_disconnects(1)
            context = await h.runtime.store.load_context("s1")
            assert context == [*before, context[-1]] and context[-1]["content"] == TASK


async def test_a_session_stuck_on_huge_recent_messages_recovers_after_compact(
    tmp_path: Path,
) -> None:
    # Recent messages too big for the window (a user message is never cut in the view):
    # every turn fails with context_too_large until a forced compaction cuts them.
    huge = "START " + "word " * 1500 + "END"
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "small answer"}], num_ctx=1024) as h:
            await seed(h)
            frames = await h.turn("s1", huge)
            assert frames[-1]["reason"] == "context_too_large"
            assert "navi compact --session s1" in frames[-1]["text"]
            frames = await h.turn("s1", "and now?")
            assert frames[-1]["reason"] == "context_too_large"  # stuck
            assert h.chat_requests == []

            s = await h.session("s1")
            await s.idle()  # the last run has fully ended: compact is not refused as busy
            s.compact()
            done = (await s.until_type("context_compressed"))[-1]
            await s.idle()
            assert done["reason"] == "forced" and done["tokens_after"] < done["tokens_before"]
            assert h.chat_requests == []  # nothing older to summarise: no LLM call

            frames = await h.turn("s1", "go on")
            assert frames[-1]["reason"] == "complete" and frames[-1]["text"] == "small answer"
            sent = h.chat_requests[0]["messages"]
            cut = [m["content"] for m in sent if m["content"].startswith("START")]
            assert len(cut) == 1 and cut[0].endswith("END") and "[…truncated ~" in cut[0]
            # The display history keeps every word.
            messages = await h.runtime.store.load_messages("s1")
            assert any(m["content"] == huge for m in messages)


async def test_rounds_under_the_threshold_make_no_compressor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every round after the first asks whether the context reached the threshold; under
    it, the round goes on without a Compressor made for the answer."""
    made: list[object] = []

    class Counted(Compressor):
        def __init__(self, *args: Any) -> None:
            made.append(self)
            super().__init__(*args)

    monkeypatch.setattr(turn_state, "Compressor", Counted)
    with trio.fail_after(TIMEOUT):
        replies = [call("echo", text="a"), call("echo", text="b"), {"text": "done"}]
        async with open_harness(
            tmp_path,
            replies=replies,
            num_ctx=NUM_CTX,
            tools=toolset(EchoTool()),
            profiles={"general": with_tools(["echo"])},
        ) as h:
            await seed(h)
            frames = await h.turn("s1", TASK)
            assert frames[-1]["text"] == "done" and frames[-1]["iterations"] == 3
            assert not of_type(frames, "compression_started")
            assert made == []
