"""The bounded event path of a run (`core/turn/channel.py`): a reader that keeps up sees exactly
what was sent; a slow one costs merged or dropped progress, never memory, and never
loses any other event.

The channel tests are synchronous sends with no reader; the end-to-end test runs a
real `terminal run` through `agent.run_stream` and reads nothing until the turn has
moved on (the fake LLM got its second request). Counts are asserted, never time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from navi_trio.core.turn.channel import frame_size, open_event_channel
from navi_trio.events import (
    AgentEvent,
    StreamEnd,
    TextDelta,
    ThinkingDelta,
    ToolEvent,
    ToolResultEvent,
    ToolStarted,
)
from navi_trio.testing import open_harness

TIMEOUT = 60
# Events a stalled reader leaves waiting, of each kind: thousands of times the bound of
# what may wait (the progress bound is 8), and 20 tool notes among the output.
STALLED = 20_000


def output(call_id: str, first: int, count: int) -> ToolEvent:
    text = "\n".join(str(i) for i in range(first, first + count))
    data = {"stream": "output", "text": text, "lines": count, "dropped_lines": 0}
    return ToolEvent(call_id=call_id, name="terminal", data=data)


async def drain(recv: Any) -> list[AgentEvent]:
    got: list[AgentEvent] = []
    async for event in recv:
        got.append(event)
    return got


async def test_a_reader_that_keeps_up_sees_every_event_unchanged() -> None:
    send, recv = open_event_channel(max_progress=4)
    sent = [TextDelta("a"), TextDelta("b"), ThinkingDelta("c"), output("c1", 0, 2)]
    got: list[AgentEvent] = []
    with recv:
        for event in sent:
            send.send_nowait(event)
            got.append(await recv.receive())
        send.close()
        got += await drain(recv)
    assert got == sent
    assert recv.statistics().merged == recv.statistics().dropped == 0


async def test_a_stalled_reader_costs_merged_progress_not_memory() -> None:
    send, recv = open_event_channel(max_progress=8, max_chars=500)
    send.send_nowait(ToolStarted(call_id="c1", name="terminal"))
    for i in range(STALLED):
        send.send_nowait(output("c1", i * 3, 3))
        if i % 1000 == 0:
            send.send_nowait(ToolEvent(call_id="c1", name="terminal", data={"note": i}))
    send.send_nowait(ToolResultEvent(call_id="c1", name="terminal", ok=True, output="done"))
    for i in range(STALLED):
        send.send_nowait(TextDelta(f"{i} "))
        send.send_nowait(TextDelta("x", is_subagent=True, agent_id="sub"))
    send.send_nowait(StreamEnd(text="end"))
    send.close()
    stats = recv.statistics()
    assert stats.queued <= 3 + 8 + 2, stats  # three others, the progress bound, merges
    got = await drain(recv)
    # Every non-progress event, in order.
    assert [type(e) for e in got if not isinstance(e, ToolEvent | TextDelta)] == [
        ToolStarted,
        ToolResultEvent,
        StreamEnd,
    ]
    # Text is merged, never lost, and each source keeps its order.
    top = "".join(e.text for e in got if isinstance(e, TextDelta) and not e.is_subagent)
    sub = "".join(e.text for e in got if isinstance(e, TextDelta) and e.is_subagent)
    assert top == "".join(f"{i} " for i in range(STALLED)) and sub == "x" * STALLED
    # Tool output: bounded events, each small; merged lines counted as dropped.
    outputs = [e for e in got if isinstance(e, ToolEvent) and "text" in e.data]
    assert all(len(e.data["text"]) <= 500 for e in outputs)
    assert outputs[-1].data["text"].endswith(str(3 * STALLED - 1))
    assert stats.merged > 0 and stats.dropped > 0
    # Nothing after the result: the tool's events all come before it.
    result_at = next(i for i, e in enumerate(got) if isinstance(e, ToolResultEvent))
    assert all(i < result_at for i, e in enumerate(got) if isinstance(e, ToolEvent))


async def test_a_delta_sent_while_one_waits_is_merged_into_it() -> None:
    send, recv = open_event_channel()
    with recv:
        for i in range(100):
            send.send_nowait(TextDelta(f"{i} "))
        send.send_nowait(ThinkingDelta("t1"))
        send.send_nowait(ThinkingDelta("t2"))
        send.send_nowait(TextDelta("sub", is_subagent=True, agent_id="a"))
        send.send_nowait(TextDelta("end"))
        assert recv.statistics().queued == 4
        send.close()
        got = await drain(recv)
    assert got == [
        TextDelta("".join(f"{i} " for i in range(100))), ThinkingDelta("t1t2"),
        TextDelta("sub", is_subagent=True, agent_id="a"), TextDelta("end"),
    ]  # fmt: skip
    assert recv.statistics().merged == 100


async def test_sending_after_the_reader_left_raises_broken() -> None:
    send, recv = open_event_channel()
    recv.close()
    try:
        send.send_nowait(TextDelta("late"))
    except trio.BrokenResourceError:
        pass
    else:
        raise AssertionError("expected BrokenResourceError")


async def _ends_story(send: Any, recv: Any) -> list[str]:
    """What a reader sees of a fixed script of sends, closes and waits, as words."""
    seen: list[str] = []

    async def read(n: int) -> None:
        for _ in range(n):
            try:
                seen.append(repr(await recv.receive()))
            except (trio.EndOfChannel, trio.ClosedResourceError) as exc:
                seen.append(type(exc).__name__)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read, 3)  # waits on an empty queue first
        await trio.testing.wait_all_tasks_blocked()
        send.send_nowait(TextDelta("a"))
        send.send_nowait(StreamEnd(text="a"))
        send.close()
    await read(1)  # after the end: the end again
    recv.close()
    await read(1)  # after its own close
    return seen


async def test_the_readers_end_behaves_as_a_trio_memory_channels(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The reader's waits, the sender's close and the reader's close come out of
    `receive` exactly as out of trio's own memory channel."""
    with trio.fail_after(TIMEOUT):
        ours = await _ends_story(*open_event_channel())
        theirs = await _ends_story(*trio.open_memory_channel[AgentEvent](10))
    assert ours == theirs
    assert ours[-2:] == ["EndOfChannel", "ClosedResourceError"]


def _plain_size(value: Any) -> int:
    """`frame_size` as first written: strings count, the rest a little."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_plain_size(v) + 8 for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_plain_size(v) + 2 for v in value)
    return 8


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=8), _JSON, max_size=8))
def test_a_frames_size_is_the_plain_definitions(frame: dict[str, Any]) -> None:
    """The subscriber's byte bound counts a frame the same with the flat-dict shortcut."""
    assert frame_size(frame) == _plain_size(frame)


@pytest.mark.slow
async def test_a_slow_reader_of_a_chatty_run_gets_bounded_progress(tmp_path: Path) -> None:
    # ~1,000,000 lines, a progress event per block read, and a reader that reads
    # nothing until the turn is done with the tool.
    args = {"action": "run", "command": "yes | head -c 2000000"}
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "terminal", "arguments": args}]},
        {"text": "done"},
    ]
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, event_buffer_max=8, tool_progress_interval_sec=1e-6
        ) as h:
            async with h.runtime.agent.run_stream("s1", "hi") as events:
                assert h.fake is not None
                await h.fake.wait_requests(2)  # the tool is done: its result went back
                stats = events.statistics()
                got = await drain(events)
    kinds = [type(e) for e in got]
    assert ToolStarted in kinds and ToolResultEvent in kinds and kinds[-1] is StreamEnd
    outputs = [e for e in got if isinstance(e, ToolEvent)]
    assert stats.merged > 0, stats
    assert len(outputs) <= 8, len(outputs)
    assert sum(e.data["lines"] + e.data["dropped_lines"] for e in outputs) == 1_000_000
    assert "".join(e.text for e in got if isinstance(e, TextDelta)) == "done"
