"""The session actor: the message queue (queued while a run is active, bounded, oldest
dropped and counted, drained in submit order, also with nobody connected), stop with a
queue, /compact (twice: nothing_to_compact; while busy: an error), replay by seq, and
a clean shutdown with work in flight.

Rules: see tests/test_agent_basic.py. A run is held open by the `gate` test tool, so
the test decides when it ends: no clocks involved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from agent_tools import GateTool, gated_harness, of_type, seed

from navi_trio.testing import open_harness

TIMEOUT = 30


async def _users(h: Any) -> list[str]:
    return [m["content"] for m in await h.runtime.store.load_messages("s1") if m["role"] == "user"]


async def test_messages_queue_while_a_run_is_active(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        replies = [{"text": "first done"}, {"text": "B done"}, {"text": "C done"}]
        async with gated_harness(tmp_path, gate, replies, message_queue_max=2) as h:
            s = await h.session("s1")
            s.send("hi")
            await gate.entered.wait()
            for text in ("msg A", "msg B", "msg C"):
                s.send(text)
            queued = [(await s.until_type("message_queued"))[-1] for _ in range(3)]
            assert [(f["text"], f["position"], f["dropped_total"]) for f in queued] == [
                ("msg A", 1, 0),
                ("msg B", 2, 0),
                ("msg C", 3, 0),
            ]
            # The store kept the newest two when C's row went in: A is dropped, by name.
            (dropped,) = (await s.until_type("warning"))[-1:]
            assert dropped["code"] == "message_dropped", dropped
            assert "'msg A'" in dropped["message"] and "1 dropped so far" in dropped["message"]
            assert [m.text for m in s.actor.pending] == ["msg B", "msg C"]
            gate.gate.set()
            ends = [(await s.until_end())[-1]["text"] for _ in range(3)]
            assert ends == ["first done", "B done", "C done"]
            await s.idle()
            # The oldest was dropped; the others ran in submit order, each on its own.
            assert await _users(h) == ["hi", "msg B", "msg C"]
            last_user = [
                [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
                for body in h.chat_requests
            ]
            assert last_user == ["hi", "hi", "msg B", "msg C"]


async def test_queue_drains_with_nobody_connected(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with gated_harness(tmp_path, gate, [{"text": "1"}, {"text": "2"}]) as h:
            actor = await h.runtime.sessions.get("s1")
            actor.send_message("hi")
            await gate.entered.wait()
            actor.send_message("queued while nobody listens")
            gate.gate.set()
            await actor.idle.wait()
            assert await _users(h) == ["hi", "queued while nobody listens"]
            assert actor.busy is False and not actor.pending


async def test_stop_ends_the_run_and_keeps_the_queue(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with gated_harness(tmp_path, gate, [{"text": "queued answer"}]) as h:
            s = await h.session("s1")
            s.send("hi")
            await gate.entered.wait()
            s.send("next please")
            assert s.stop() is True
            first = await s.until_end()
            assert first[-1]["stopped"] is True
            second = await s.until_end()
            assert second[-1]["text"] == "queued answer"
            await s.idle()
            assert await _users(h) == ["hi", "next please"]


async def test_compact_twice_gives_nothing_to_compact(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        profile = {"compression_keep_recent": 2, "compression_max_tokens": 200}
        async with open_harness(
            tmp_path, replies=[{"text": "THE SUMMARY"}], profiles={"general": profile}
        ) as h:
            await seed(h)
            older = [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
                for i in range(4)
            ]
            await h.runtime.store.append("s1", messages=older, context=older)
            s = await h.session("s1")
            s.compact()
            frames = await s.until_type("context_compressed")
            assert [(f["type"], f["reason"]) for f in frames] == [
                ("compression_started", "forced"),
                ("context_compressed", "forced"),
            ]
            await s.idle()
            context = await h.runtime.store.load_context("s1")
            assert context[0]["content"].endswith("THE SUMMARY")
            assert [m["content"] for m in context[1:]] == ["m2", "m3"]
            s.compact()
            err = (await s.until_type("error"))[-1]
            assert err["code"] == "nothing_to_compact" and "nothing to compact" in err["message"]
            await s.idle()
            assert len(h.chat_requests) == 1


async def test_nothing_to_compact_is_said_before_the_compactions_hold_of_the_lease_ends(
    tmp_path: Path,
) -> None:
    """As a run's end is: a daemon that claims the session at the release has it before
    its own run (docs/pages/scaling.md), and no daemon gets it late, behind that run's
    frames. The seq the session had when the lease was let go covers the error."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[]) as h:
            await seed(h)
            s = await h.session("s1")
            leases = h.runtime.agent.leases
            released: list[int] = []

            async def note_the_seq() -> None:
                released.append(s.actor.seq)

            leases.before_release = note_the_seq
            s.compact()
            err = (await s.until_type("error"))[-1]
            await s.idle()
    assert err["code"] == "nothing_to_compact", err
    assert len(released) == 1 and err["seq"] <= released[0], (err["seq"], released)


async def test_a_message_sent_during_a_compaction_waits_for_no_run_end(
    tmp_path: Path,
) -> None:
    """A compaction (or a rewind, a fork) says no ``stream_end``: a message queued behind
    it has no run ahead (position 0). Red before: position 1, so a client following its
    message (api/our_run.py) took its own run's end for the one ahead and waited on."""
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "the answer"}]) as h:
            await seed(h)
            s = await h.session("s1")
            holding, go = trio.Event(), trio.Event()

            async def hold_the_first() -> None:
                if not holding.is_set():
                    holding.set()
                    await go.wait()

            h.runtime.agent.leases.before_release = hold_the_first
            s.compact()
            await holding.wait()  # the compaction holds the session
            s.send("sent while it compacts")
            queued = (await s.until_type("message_queued"))[-1]
            assert queued["text"] == "sent while it compacts"
            assert queued["position"] == 0, queued
            go.set()
            assert (await s.until_end())[-1]["text"] == "the answer"
            await s.idle()


async def test_compact_while_a_run_is_active_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with gated_harness(tmp_path, gate, [{"text": "done"}]) as h:
            s = await h.session("s1")
            s.send("hi")
            await gate.entered.wait()
            s.compact()
            err = (await s.until_type("error"))[-1]
            assert err["code"] == "busy"
            gate.gate.set()
            assert (await s.until_end())[-1]["text"] == "done"


async def test_a_subscriber_replays_what_it_missed(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "one two"}, {"text": "three"}]) as h:
            first = await h.turn("s1", "hi")
            second = await h.turn("s1", "hello")
            actor = h.runtime.sessions.actor("s1")
            assert actor is not None
            with actor.subscribe(last_seq=first[-1]["seq"]) as sub:
                missed = [sub.frames.receive_nowait() for _ in range(len(second))]
                assert missed == second
                assert of_type(missed, "stream_end")[0]["text"] == "three"
                try:
                    extra = sub.frames.receive_nowait()
                except trio.WouldBlock:
                    extra = None
                assert extra is None


async def test_shutdown_with_a_run_active_and_messages_queued(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        async with gated_harness(tmp_path, gate, [{"text": "never"}]) as h:
            s = await h.session("s1")
            s.send("hi")
            await gate.entered.wait()
            s.send("queued at shutdown")
        # Leaving the harness stopped the run and did not start the queued one.
        async with open_harness(tmp_path, replies=[]) as h2:
            messages = await h2.runtime.store.load_messages("s1")
            assert [m["content"] for m in messages if m["role"] == "user"] == ["hi"]
            context = await h2.runtime.store.load_context("s1")
            assert context[-1]["role"] == "tool" and "stopped by the user" in context[-1]["content"]


async def test_stop_right_after_send_is_not_lost(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "should not stream"}]) as h:
            s = await h.session("s1")
            s.send("hi")
            # Same tick: the run's task has not started yet, the stop must still land.
            assert s.stop() is True
            frames = await s.until_end()
            assert frames[-1]["stopped"] is True and not of_type(frames, "text_delta")
            assert await _users(h) == ["hi"]


# --- Retirement of idle actors (MockClock without autojump: time moves only when the
# test jumps it, so the store's thread waits cannot race a deadline) -------------------


async def test_an_idle_actor_retires_and_its_successor_goes_on(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    replies = [{"text": "one"}, {"text": "two"}]
    async with open_harness(tmp_path, replies=replies, session_idle_sec=60) as h:
        first = await h.turn("s1", "hi")
        actor = h.runtime.sessions.actor("s1")
        assert actor is not None and "s1" in h.runtime.agent.cache
        await actor.idle.wait()  # the run's last save may still be on the store's thread
        await trio.testing.wait_all_tasks_blocked()  # the countdown has started
        mock_clock.jump(59)
        await trio.testing.wait_all_tasks_blocked()
        assert not actor.retired.is_set()
        mock_clock.jump(2)
        await trio.testing.wait_all_tasks_blocked()
        assert actor.retired.is_set()
        assert h.runtime.sessions.actor("s1") is None
        assert "s1" not in h.runtime.agent.cache  # its history left memory
        second = await h.turn("s1", "hi again")
        assert second[-1]["text"] == "two"
        # The successor's seq goes on from the retired actor's last one.
        assert second[0]["seq"] == first[-1]["seq"] + 1
        # And the history came back from the store.
        sent = h.chat_requests[-1]["messages"]
        assert [m["content"] for m in sent if m["role"] != "system"] == ["hi", "one", "hi again"]


async def test_an_actor_with_a_subscriber_a_run_or_a_queue_does_not_retire(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    gate = GateTool()
    async with gated_harness(tmp_path, gate, [{"text": "done"}], session_idle_sec=60) as h:
        s = await h.session("s1")
        actor = s.actor
        await trio.testing.wait_all_tasks_blocked()  # the actor saw the subscriber come
        mock_clock.jump(600)  # subscribed: stays
        await trio.testing.wait_all_tasks_blocked()
        assert not actor.retired.is_set()
        s.send("hi")
        await gate.entered.wait()
        s.subscription.close()
        mock_clock.jump(600)  # a run in flight: stays
        await trio.testing.wait_all_tasks_blocked()
        assert not actor.retired.is_set()
        gate.gate.set()
        await actor.idle.wait()
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(61)  # now idle and alone: retires
        await trio.testing.wait_all_tasks_blocked()
        assert actor.retired.is_set()


async def test_a_steer_the_queues_cap_dropped_never_joins_the_turn(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        gate = GateTool()
        replies = [{"text": "first done"}, {"text": "kept done"}]
        async with gated_harness(tmp_path, gate, replies, message_queue_max=1) as h:
            s = await h.session("s1")
            s.send("hi")
            await gate.entered.wait()
            s.send("steered", on_busy="steer")
            s.send("kept", on_busy="enqueue")  # the cap (1) drops the steer's row
            (dropped,) = (await s.until_type("warning"))[-1:]
            assert dropped["code"] == "message_dropped" and "'steered'" in dropped["message"]
            gate.gate.set()
            ends = [(await s.until_end())[-1]["text"] for _ in range(2)]
            assert ends == ["first done", "kept done"]
            await s.idle()
            assert await _users(h) == ["hi", "kept"]
            # The round after the gate asked the model without it.
            last_user = [
                [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
                for body in h.chat_requests
            ]
            assert last_user == ["hi", "hi", "kept"]
