"""Waiting text (thinking) deltas merge at every hop, but never across sources (issue 17
"Missing tests": two sub-agents' deltas in one subscriber queue were merged and no test
saw it). Each merge point is fed deltas of two sources in turn, and the same source's
deltas in a row as the control that it merges at all:

- the run's event channel (core/turn/channel.py): the source is (is_subagent, agent_id);
- a subscriber's frame queue (core/turn/channel.py) and the session's replay buffer
  (core/session/broadcast.py): the source is the session too.

All of them ask the one rule (core/turn/channel.py). Rules: unit tests on each merge point's
own channel or buffer, no clock, no sockets; what is checked is what a client could
tell apart: which source each character came from, and in which order.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from navi_trio.core.session import ReplayBuffer
from navi_trio.core.turn import open_frame_channel
from navi_trio.core.turn.channel import open_event_channel
from navi_trio.events import AgentEvent, TextDelta, ThinkingDelta

Frame = dict[str, Any]
BASE: Frame = {"session_id": "s1", "epoch": "e1", "is_subagent": False, "agent_id": None}
SUB_A1: Frame = {"is_subagent": True, "agent_id": "a1"}
AGENTS: dict[str, tuple[Frame, Frame]] = {
    "two sub-agents": (SUB_A1, {"is_subagent": True, "agent_id": "a2"}),
    "the main agent and a sub-agent": ({}, SUB_A1),
    "a sub-agent without an id": ({}, {"is_subagent": True}),
    "a sub-agent and the main agent with its id": (SUB_A1, {"agent_id": "a1"}),
}  # fmt: skip
SESSIONS: dict[str, tuple[Frame, Frame]] = {"two sessions": ({}, {"session_id": "s2"})}
PAIRS = {**AGENTS, **SESSIONS}
KINDS = ["text_delta", "thinking_delta"]


def _frames(kind: str, sources: list[Frame], texts: list[str]) -> list[Frame]:
    return [
        {**BASE, **source, "type": kind, "seq": i + 1, "text": text}
        for i, (source, text) in enumerate(zip(sources, texts, strict=True))
    ]


def _source(frame: Frame) -> tuple[Any, ...]:
    return tuple(frame.get(k) for k in BASE)


def _turns(kind: str, a: Frame, b: Frame) -> list[Frame]:
    """A, B, A, B, then A twice more (those two may merge)."""
    return _frames(kind, [a, b, a, b, a, a], ["a1", "b1", "a2", "b2", "a3", "a4"])


def _check(got: list[Frame], sent: list[Frame]) -> None:
    """The same characters per source, in order; no frame holds two sources' text; the
    last two deltas of A (in a row) did merge."""
    assert len(got) == len(sent) - 1, got
    for frame in got:
        first = next(s for s in sent if frame["text"].startswith(s["text"]))
        assert _source(frame) == _source(first), (frame, first)
    for source in {_source(f) for f in sent}:
        mine = [f for f in got if _source(f) == source]
        assert "".join(f["text"] for f in mine) == "".join(
            f["text"] for f in sent if _source(f) == source
        )
    assert got[-1]["text"] == "a3a4" and got[-1]["seq"] == sent[-1]["seq"]


# -- the run's event channel -----------------------------------------------------------


def _event(kind: str, source: Frame, text: str) -> AgentEvent:
    cls = TextDelta if kind == "text_delta" else ThinkingDelta
    return cls(text, is_subagent=bool(source.get("is_subagent")), agent_id=source.get("agent_id"))


def _as_frame(event: AgentEvent, seq: int) -> Frame:
    kind = "text_delta" if isinstance(event, TextDelta) else "thinking_delta"
    assert isinstance(event, TextDelta | ThinkingDelta)
    source = {"is_subagent": event.is_subagent, "agent_id": event.agent_id}
    return {**BASE, **source, "type": kind, "seq": seq, "text": event.text}


async def _through_events(sent: list[Frame], max_progress: int) -> list[Frame]:
    send, recv = open_event_channel(max_progress)
    with recv:
        for f in sent:
            send.send_nowait(_event(f["type"], f, f["text"]))
        send.close()
        got = [_as_frame(e, i + 1) async for i, e in _aenumerate(recv)]
    return got


async def _aenumerate(recv: Any) -> Any:
    i = 0
    async for event in recv:
        yield i, event
        i += 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pair", AGENTS, ids=str)
async def test_the_event_channel_keeps_two_agents_deltas_apart(kind: str, pair: str) -> None:
    a, b = AGENTS[pair]
    sent = _turns(kind, a, b)
    got = await _through_events(sent, max_progress=256)
    got[-1]["seq"] = sent[-1]["seq"]  # events carry no seq: the last one stands for it
    _check(got, sent)


@pytest.mark.parametrize("pair", AGENTS, ids=str)
async def test_the_event_channel_over_its_bound_merges_only_into_the_same_agent(
    pair: str,
) -> None:
    # One progress event may wait: the next ones merge into the latest waiting one of
    # their own source (past the other source's), or wait on their own.
    a, b = AGENTS[pair]
    sent = _frames("text_delta", [a, b, a, b], ["a1", "b1", "a2", "b2"])
    got = await _through_events(sent, max_progress=1)
    assert [(_source(f), f["text"]) for f in got] == [
        (_source(sent[0]), "a1a2"), (_source(sent[1]), "b1b2")
    ]  # fmt: skip


# -- a subscriber's frame queue --------------------------------------------------------


def _through_queue(sent: list[Frame]) -> list[Frame]:
    send, recv = open_frame_channel(len(sent), 10**9)
    for f in sent:
        send.send_nowait(f)
    send.close()
    got = []
    while True:
        try:
            got.append(recv.receive_nowait())
        except trio.EndOfChannel:
            return got


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pair", PAIRS, ids=str)
def test_a_subscriber_queue_keeps_two_sources_deltas_apart(kind: str, pair: str) -> None:
    a, b = PAIRS[pair]
    sent = _turns(kind, a, b)
    _check(_through_queue(sent), sent)


# -- the replay buffer -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pair", PAIRS, ids=str)
def test_the_replay_buffer_keeps_two_sources_deltas_apart(kind: str, pair: str) -> None:
    a, b = PAIRS[pair]
    sent = _turns(kind, a, b)
    buf = ReplayBuffer()
    for f in sent:
        buf.append(f)
    _check(list(buf), sent)
    # A client that saw the first A delta gets the rest, each source's apart.
    since = buf.since(1, sent[-1]["seq"])
    assert since is not None
    _check([sent[0], *since], sent)
