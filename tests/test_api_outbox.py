"""A connection's outbox (api/outbox.py): bounded in bytes as well as frames.

A sender waits once what waits would pass `max_bytes`, until the writer takes enough;
a text bigger than the bound alone still goes into an empty outbox; senders take turns
in arrival order, so a big reply is not passed by small frames; `close()` drops what
waits at once and refuses the senders still waiting.

Rules: trio alone (no I/O, no threads): `wait_all_tasks_blocked` says when every sender
is stuck; the autojump clock's limit bounds each test.
"""

from __future__ import annotations

import sys

import pytest
import trio
import trio.testing

from navi_trio.api.outbox import Outbox

LIMIT = 60  # virtual seconds


def _text(kb: int, mark: str = "x") -> str:
    return mark * (kb * 1000)


def _bytes(*texts: str) -> int:
    return sum(sys.getsizeof(t) for t in texts)


async def _put(outbox: Outbox, text: str, done: list[str]) -> None:
    """A sender: puts `text`, then notes its first character in `done`."""
    await outbox.put(text)
    done.append(text[0])


async def test_a_sender_waits_past_the_byte_bound_until_the_writer_takes_enough(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outbox = Outbox(max_frames=100, max_bytes=_bytes(_text(100), _text(100)) + 10)
    sent: list[str] = []
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            for mark in "abc":
                nursery.start_soon(_put, outbox, _text(100, mark), sent)
                await trio.testing.wait_all_tasks_blocked()
            # Two fit; the third waits although only 3 of 100 frames are used.
            assert sent == ["a", "b"] and len(outbox) == 2
            assert outbox.bytes == _bytes(_text(100), _text(100))
            assert (await outbox.get())[0] == "a"
            await trio.testing.wait_all_tasks_blocked()
            assert sent == ["a", "b", "c"] and outbox.bytes <= outbox.max_bytes
            assert [(await outbox.get())[0] for _ in range(2)] == ["b", "c"]
            assert outbox.bytes == 0


async def test_a_text_bigger_than_the_bound_goes_alone_and_is_not_passed_by_small_ones(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outbox = Outbox(max_frames=100, max_bytes=_bytes(_text(10)) * 2)
    order: list[str] = []
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_put, outbox, _text(10, "s"), order)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(_put, outbox, _text(1000, "B"), order)  # 50 times the bound
            await trio.testing.wait_all_tasks_blocked()
            # "t" would fit beside "s", but "B" came first.
            nursery.start_soon(_put, outbox, _text(1, "t"), order)
            await trio.testing.wait_all_tasks_blocked()
            assert order == ["s"]
            assert (await outbox.get())[0] == "s"
            await trio.testing.wait_all_tasks_blocked()
            assert order == ["s", "B"] and len(outbox) == 1  # alone: "t" still waits
            assert (await outbox.get())[0] == "B"
            await trio.testing.wait_all_tasks_blocked()
            assert order == ["s", "B", "t"]


async def test_the_frame_bound_holds_too(autojump_clock: trio.testing.MockClock) -> None:
    outbox = Outbox(max_frames=3, max_bytes=10**9)
    with trio.fail_after(LIMIT):
        for _ in range(3):
            await outbox.put("a")
        with trio.move_on_after(1) as waited:
            await outbox.put("a")
        assert waited.cancelled_caught and len(outbox) == 3


async def test_close_drops_what_waits_and_refuses_the_waiting_senders(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outbox = Outbox(max_frames=1, max_bytes=10**9)
    refused: list[type[BaseException]] = []

    async def send() -> None:
        try:
            await outbox.put("late")
        except trio.ClosedResourceError as exc:
            refused.append(type(exc))

    with trio.fail_after(LIMIT):
        await outbox.put(_text(1000))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            await trio.testing.wait_all_tasks_blocked()
            outbox.close()
        assert refused == [trio.ClosedResourceError]
        assert len(outbox) == 0 and outbox.bytes == 0
        with pytest.raises(trio.EndOfChannel):
            await outbox.get()
        with pytest.raises(trio.ClosedResourceError):
            await outbox.put("after")


async def test_the_byte_bound_is_reached_not_passed(autojump_clock: trio.testing.MockClock) -> None:
    a, b = _text(1, "a"), _text(1, "b")
    outbox = Outbox(max_frames=100, max_bytes=_bytes(a, b))
    with trio.fail_after(LIMIT):
        await outbox.put(a)
        assert outbox.put_nowait(b)  # exactly at the bound: it fits
        assert not outbox.put_nowait("c")
        assert outbox.bytes == outbox.max_bytes


async def test_frames_sent_at_once_count_their_bytes_until_the_writer_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    text = _text(10)
    outbox = Outbox(max_frames=100, max_bytes=_bytes(text, text))
    got: list[str | None] = []
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:

            async def writer() -> None:
                got.append(await outbox.next())

            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(2):
                assert outbox.may_send_at_once(text)
                outbox.sent_at_once(text)
            assert not outbox.may_send_at_once(text)  # the bytes, not the frames, are full
            outbox.wake()
        assert got == [None]
        assert outbox.put_nowait(text) and outbox.put_nowait(text)  # the writer ran: room
