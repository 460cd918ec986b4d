"""Fixed examples for `repair_dangling_tool_calls` with interleaved tool calls.

test_store.py has the hypothesis property (idempotent, pure, only inserts); these pin
down *where* each placeholder goes when calls and results of two assistant messages
interleave, which a property alone does not say.
"""

from __future__ import annotations

from typing import Any

from builders import assistant, call, result, user

from navi_trio.store.repair import PLACEHOLDER_CONTENT, repair_dangling_tool_calls


def shape(messages: list[dict[str, Any]]) -> list[str]:
    """A history in one line per message: ``a:c1,c2`` / ``t:c1`` / ``T:c1`` (placeholder)."""
    out = []
    for m in messages:
        if m["role"] == "assistant":
            out.append("a:" + ",".join(str(c.get("id")) for c in m.get("tool_calls") or []))
        elif m["role"] == "tool":
            mark = "T" if m.get("content") == PLACEHOLDER_CONTENT else "t"
            out.append(f"{mark}:{m.get('tool_call_id')}")
        else:
            out.append(m["role"][0])
    return out


def test_results_out_of_call_order_need_no_repair() -> None:
    history = [user("go"), assistant(call("c1"), call("c2")), result("c2"), result("c1")]
    fixed, inserted = repair_dangling_tool_calls(history)
    assert inserted == [] and fixed == history


def test_results_with_a_note_between_them_need_no_repair() -> None:
    note = {"role": "system", "content": "task note", "keep": True}
    history = [assistant(call("c1"), call("c2")), result("c1"), note, result("c2")]
    assert repair_dangling_tool_calls(history)[1] == []


def test_two_call_messages_interleaved_with_their_results() -> None:
    # a:c1, a:c2, t:c1, t:c2 — c1's result comes after the next assistant message, so
    # c1 was never answered in its own turn: a placeholder goes right after its call.
    history = [user("go"), assistant(call("c1")), assistant(call("c2")), result("c1"), result("c2")]
    fixed, inserted = repair_dangling_tool_calls(history)
    assert shape(fixed) == ["u", "a:c1", "T:c1", "a:c2", "t:c1", "t:c2"]
    assert [i for i, _ in inserted] == [2]
    assert repair_dangling_tool_calls(fixed)[1] == []


def test_a_result_of_the_second_message_between_the_first_ones() -> None:
    # a:c1,c2, t:c1, a:c3, t:c2, t:c3 — c2 answered too late; c3 answered in time.
    history = [
        assistant(call("c1"), call("c2")),
        result("c1"),
        assistant(call("c3")),
        result("c2"),
        result("c3"),
    ]
    fixed, inserted = repair_dangling_tool_calls(history)
    assert shape(fixed) == ["a:c1,c2", "t:c1", "T:c2", "a:c3", "t:c2", "t:c3"]
    assert [(i, ph["tool_call_id"], ph["name"]) for i, ph in inserted] == [(2, "c2", "shell")]


def test_interleaved_id_less_calls_pair_in_order_within_their_turn() -> None:
    # a:-, a:-, t:- — the first call's turn ends at the second assistant message.
    history = [assistant(call(None, "a")), assistant(call(None, "b")), result(None)]
    fixed, inserted = repair_dangling_tool_calls(history)
    assert [(i, ph["name"]) for i, ph in inserted] == [(1, "a")]
    assert inserted[0][1]["tool_call_id"] == "missing-id-0"
    assert repair_dangling_tool_calls(fixed)[1] == []


def test_every_call_of_a_parallel_batch_cut_by_a_crash_gets_one_placeholder() -> None:
    history = [
        user("go"),
        assistant(call("c1"), call("c2"), call("c3")),
        result("c2"),
        user("again"),
        assistant(text="hello"),
    ]
    fixed, inserted = repair_dangling_tool_calls(history)
    assert shape(fixed) == ["u", "a:c1,c2,c3", "t:c2", "T:c1", "T:c3", "u", "a:"]
    assert [i for i, _ in inserted] == [3, 4]
