"""Fuzz the whole loop with what a model may really send: text, thinking, tool calls to
real and unknown tools with sensible, odd or cut arguments, garbage lines, dropped
connections, HTTP errors, an exhausted script — in any order.

Whatever arrives, every turn ends with exactly one top-level stream_end, no internal
error, every user message is stored, and every assistant tool call is paired with one
result in both the history and the context (so a reload repairs nothing).

Real HTTP to the fake LLM server on 127.0.0.1, a real SQLite file per example. Each
example runs its own `trio.run` inside hypothesis, with one harness (runtime, store and
fake LLM) for its three cases, each case a session of its own and the fake's script
set anew for it (`drop_unread`); bounded: a few dozen cases, an absolute timeout on each
example.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import trio
import trio.testing
from agent_tools import assert_paired
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quick_run import examples

from navi_trio.testing import Harness, open_harness

SAFE_TOOLS = ["todo", "scratchpad", "memory", "filesystem", "switch_profile"]

words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | words,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(words, inner, max_size=3),
    max_leaves=6,
)
arguments = st.one_of(
    st.dictionaries(
        st.sampled_from(
            ["action", "path", "content", "text", "index", "status", "profile_id", "fact"]
        ),
        json_values,
        max_size=4,
    ),
    st.fixed_dictionaries(
        {
            "action": st.sampled_from(["list", "read", "add", "write"]),
            "text": words,
            "path": st.just("notes.txt"),
            "content": words,
        }
    ),
    st.just('{"action": "li'),  # cut JSON, sent as-is
)
tool_call = st.fixed_dictionaries(
    {"name": st.sampled_from([*SAFE_TOOLS, "no_such_tool", ""]), "arguments": arguments}
)
reply = st.one_of(
    st.fixed_dictionaries({"text": words}),
    st.fixed_dictionaries({"thinking": words, "text": words}),
    st.fixed_dictionaries({"tool_calls": st.lists(tool_call, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"text": words, "malformed": st.just(True)}),
    st.fixed_dictionaries({"text": st.just("one two three"), "drop_after": st.integers(0, 2)}),
    st.fixed_dictionaries({"status": st.sampled_from([400, 404, 500, 503]), "error_body": words}),
    st.fixed_dictionaries({"text": words, "error_line": words}),
    st.fixed_dictionaries(
        {
            "tool_calls": st.lists(tool_call, min_size=1, max_size=2),
            "done_reason": st.just("length"),
        }
    ),
)


CASES = 3  # cases a harness runs, each in a session of its own
LIMIT = 60  # real seconds for an example's harness and its cases (a busy 2-core machine)

Case = tuple[list[dict[str, Any]], list[str]]


def _script(h: Harness, replies: list[dict[str, Any]]) -> None:
    """The fake LLM's script from now on: `replies`, whatever the last case left unread."""
    assert h.fake is not None
    h.fake.drop_unread()
    h.fake.add_replies(*replies)


async def _reloaded_repairs_nothing(db: Path, sids: list[str]) -> None:
    """A fresh load of the file (as after a restart) has nothing to repair."""
    from navi_trio.store import SQLiteStore

    async with SQLiteStore.open(db) as store:
        for sid in sids:
            loaded = await store.load_session(sid)
            assert loaded is not None and loaded.repaired == 0, sid


async def _check(cases: list[Case], dialect: str) -> None:
    sids = [f"s{i}" for i in range(len(cases))]
    with tempfile.TemporaryDirectory() as tmp, trio.fail_after(LIMIT):
        async with open_harness(
            Path(tmp),
            dialect=dialect,
            parallel_tool_calls=True,
            profiles={"general": {"max_iterations": 4}},
        ) as h:
            for sid, (replies, texts) in zip(sids, cases, strict=True):
                _script(h, replies)
                for text in texts:
                    frames = await h.turn(sid, text)
                    ends = [f for f in frames if f["type"] == "stream_end" and not f["is_subagent"]]
                    assert len(ends) == 1 and frames[-1] is ends[0], frames
                    codes = [f["code"] for f in frames if f["type"] == "error"]
                    assert "internal" not in codes, frames
                store = h.runtime.store
                messages = await store.load_messages(sid)
                users = [m["content"] for m in messages if m["role"] == "user"]
                assert users == texts
                assert_paired(messages)
                assert_paired(await store.load_context(sid))
        await _reloaded_repairs_nothing(Path(tmp) / "navi.db", sids)


case = st.tuples(
    st.lists(reply, min_size=1, max_size=6),
    st.lists(
        st.sampled_from(["hi", "Fix the bug in notes.txt", "thanks", "go on"]),
        min_size=1,
        max_size=2,
    ),
)


@settings(
    max_examples=examples(10),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    cases=st.lists(case, min_size=CASES, max_size=CASES),
    dialect=st.sampled_from(["ollama", "openai"]),
)
def test_no_reply_sequence_breaks_a_turn_or_the_history(cases: list[Case], dialect: str) -> None:
    trio.run(_check, cases, dialect)


async def _stop_after(cases: list[tuple[int, list[dict[str, Any]]]]) -> None:
    with tempfile.TemporaryDirectory() as tmp, trio.fail_after(LIMIT):
        async with open_harness(Path(tmp), parallel_tool_calls=True) as h:
            for i, (frames_before_stop, replies) in enumerate(cases):
                _script(h, [{"text": "DIRECT"}, *replies, {"text": "done"}])
                s = await h.session(f"s{i}")
                s.send("Fix the bug in notes.txt")
                seen: list[dict[str, Any]] = []
                while len(seen) < frames_before_stop and not any(
                    f["type"] == "stream_end" for f in seen
                ):
                    seen.append(await s.next())
                if not any(f["type"] == "stream_end" for f in seen):
                    s.stop()
                    seen += await s.until_end()
                assert sum(f["type"] == "stream_end" and not f["is_subagent"] for f in seen) == 1
                await s.idle()
                # A request the stop cut off has taken its reply before the next case's
                # script is set: the fake LLM runs in this loop.
                await trio.testing.wait_all_tasks_blocked()
                messages = await h.runtime.store.load_messages(s.session_id)
                assert [m["content"] for m in messages if m["role"] == "user"] == [
                    "Fix the bug in notes.txt"
                ]
                assert_paired(messages)
                assert_paired(await h.runtime.store.load_context(s.session_id))


@settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cases=st.lists(
        st.tuples(
            st.integers(0, 25),
            st.lists(
                st.one_of(
                    st.fixed_dictionaries(
                        {
                            "text": st.just("one two three four"),
                            "thinking": st.just("hmm let me see"),
                            "delay_chunk": st.just(0.001),
                        }
                    ),
                    st.fixed_dictionaries(
                        {"tool_calls": st.lists(tool_call, min_size=1, max_size=3)}
                    ),
                ),
                min_size=1,
                max_size=5,
            ),
        ),
        min_size=CASES,
        max_size=CASES,
    ),
)
def test_a_stop_at_any_point_ends_once_and_leaves_nothing_dangling(
    cases: list[tuple[int, list[dict[str, Any]]]],
) -> None:
    trio.run(_stop_after, cases)
