"""Every effect of a run is fenced by its lease, not only its history (core/turn/lease.py).

Another process took the session over under a live run (in these tests: the lease row
rewritten to another owner and the next generation, as a takeover by another daemon
leaves it): the run
- runs no tool call more: its lease is confirmed in the store before each one;
- ends, as a run taken over, when a tool's own write meets the fence, in a parallel
  batch too (the batch's other calls are stopped);
- stops at its next renewal, even while it waits inside a tool;
- publishes nothing once its lease could have run out without a renewal answering:
  each frame waits for the lease to be known its own, and a run found taken over says
  only that (one ``session_busy`` error and its ``stream_end``).

And in a cluster, the run that takes over a lease another runtime left unreleased and
run out ends that runtime's turn first, however long ago its actor last looked.

Real parts: the fake LLM over HTTP on 127.0.0.1, a real SQLite file. Tests on the
autojump clock jump only once every task has waited 10 ms of real time, and never while
the store's thread works (tests/realtime.py `held`); each has an absolute real-time
limit.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import rewind_kit as kit
import trio
import trio.testing
from agent_tools import EchoTool, GateTool, call, toolset, with_tools
from realtime import held, paced, real_time_limit

from navi_trio.core.turn.agent import DEAD_TURN
from navi_trio.core.turn.session_state import last_turn_open
from navi_trio.errors import StorageError
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import open_harness, virtual_wall
from navi_trio.testing.harness import Harness
from navi_trio.tools.base import ToolContext, ToolResult

TIMEOUT = 30
FAR = 1e5  # every deadline these tests do not look at: out of the way


class Gate2(GateTool):
    name = "gate2"


class NoteTool(GateTool):
    """Waits for the test, then writes to the kv table, as a scratchpad or todo does."""

    name = "note"

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.entered.set()
        await self.gate.wait()
        await ctx.kv.kv_set("scratch", "note", "written")
        return ToolResult.success("noted")


def calls(*names: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "arguments": {}} for n in names]}


def profile(*tools: str) -> dict[str, Any]:
    return {"general": with_tools(tools, planning_first_message=False)}


async def take_over(h: Harness, sid: str) -> None:
    """What another daemon's takeover leaves in the lease row: its owner, the next
    generation, a live expiry."""

    def write(db: Any) -> None:
        db.execute(
            "UPDATE leases SET owner = 'another-daemon', pid = 1, generation = generation + 1,"
            " expires_at = ? WHERE session_id = ?",
            [time.time() + 300, sid],
        )

    store = h.runtime.store
    assert isinstance(store, SQLiteStore)
    await store.run_raw_for_tests("take the lease over", write)


def count_renewals(h: Harness) -> list[int | None]:
    """The lease renewals the store is asked for from now on (the generation each names)."""
    store = h.runtime.store
    renew, renewals = store.renew_lease, []

    async def counted(*args: Any, **kwargs: Any) -> bool:
        renewals.append(kwargs.get("generation"))
        return await renew(*args, **kwargs)

    store.renew_lease = counted  # type: ignore[method-assign]
    return renewals


def said(frames: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(f["type"], f.get("code")) for f in frames if f["type"] in ("error", "stream_end")]


async def test_a_run_taken_over_under_it_runs_no_further_tool_call(tmp_path: Any) -> None:
    gate, gate2 = GateTool(), Gate2()
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[calls("gate", "gate2"), {"text": "never"}],
            tools=[gate, gate2], profiles=profile("gate", "gate2"),
        ) as h:  # fmt: skip
            s = await h.session("s1")
            s.send("go")
            await gate.entered.wait()
            await take_over(h, "s1")
            gate.gate.set()  # the first call ends: the second would start now
            frames = await s.until_end()
            assert not gate2.entered.is_set()
            assert said(frames)[-2:] == [("error", "session_busy"), ("stream_end", None)]
            errors = [f for f in frames if f["type"] == "error"]
            assert len(errors) == 1 and "taken over" in errors[0]["message"], errors
            started = [f["name"] for f in frames if f["type"] == "tool_started"]
            assert started == ["gate"], started
            assert len(h.chat_requests) == 1
            saved = await h.runtime.store.load_messages("s1")
            assert [m["role"] for m in saved] == ["user", "assistant"]  # the calls only


@pytest.mark.parametrize("parallel", [False, True])
async def test_the_save_of_a_rounds_calls_confirms_the_lease_for_its_first_call(
    tmp_path: Any, parallel: bool
) -> None:
    """The call message's save renews the lease in its transaction: the first call of
    each round (a parallel batch: all its calls) needs no renewal of its own; a second
    call of a batch run one after the other still gets one (the first may have taken
    long)."""
    profiles = {"general": with_tools(["echo"], planning_first_message=False,
                                      parallel_tool_calls=parallel)}  # fmt: skip
    replies = [calls("echo"), calls("echo", "echo"), {"text": "done"}]
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, tools=[EchoTool()], profiles=profiles,
            lease_ttl_sec=FAR,  # no renewal on the lease's own schedule
        ) as h:  # fmt: skip
            renewals = count_renewals(h)
            frames = await h.turn("s1", "go")
            assert frames[-1]["reason"] == "complete", said(frames)
            assert len([f for f in frames if f["type"] == "tool_result"]) == 3
            assert len(renewals) == (0 if parallel else 1), renewals  # round two's 2nd call


async def test_a_round_that_snapshots_its_folders_confirms_the_lease_after_the_snapshot(
    tmp_path: Any,
) -> None:
    """A snapshot of the folders (a call that may write) waits between the call
    message's save and the call: the call then gets its own confirmation."""
    folder = tmp_path / "work"
    folder.mkdir()
    replies = [kit.calls(kit.write("a.txt", "a\n")), kit.say("ok")]
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=replies, profiles=kit.PROFILES, lease_ttl_sec=FAR
        ) as h:
            renewals = count_renewals(h)
            frames = await kit.turn(h, "s1", "write", cwd=folder, **kit.FULL)
            assert frames[-1]["reason"] == "complete", said(frames)
            assert [f for f in frames if f["type"] == "checkpoint_created"]
            assert (folder / "a.txt").read_text() == "a\n"
            assert len(renewals) == 1, renewals


async def test_a_run_taken_over_before_its_calls_are_saved_runs_none_of_them(
    tmp_path: Any,
) -> None:
    gate = GateTool()
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[calls("gate"), {"text": "never"}], tools=[gate],
            profiles=profile("gate"),
        ) as h:  # fmt: skip
            store = h.runtime.store
            append = store.append

            async def taken_first(*args: Any, **kwargs: Any) -> None:
                if kwargs.get("renew") is not None:  # the save of the round's calls
                    await take_over(h, "s1")
                await append(*args, **kwargs)

            store.append = taken_first  # type: ignore[method-assign]
            s = await h.session("s1")
            s.send("go")
            frames = await s.until_end()
            assert not gate.entered.is_set()
            assert said(frames)[-2:] == [("error", "session_busy"), ("stream_end", None)]
            assert not [f for f in frames if f["type"] == "tool_started"]
            saved = await store.load_messages("s1")
            assert [m["role"] for m in saved] == ["user"]


async def test_a_fenced_write_in_a_parallel_batch_ends_the_run_as_taken_over(
    tmp_path: Any,
) -> None:
    note, gate2 = NoteTool(), Gate2()
    profiles = {"general": with_tools(["note", "gate2"], planning_first_message=False,
                                      parallel_tool_calls=True)}  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[calls("note", "gate2"), {"text": "never"}],
            tools=[note, gate2], profiles=profiles,
        ) as h:  # fmt: skip
            s = await h.session("s1")
            s.send("go")
            await note.entered.wait()
            await gate2.entered.wait()
            await take_over(h, "s1")
            note.gate.set()  # its write meets the fence; gate2 never opens
            frames = await s.until_end()
            assert said(frames)[-2:] == [("error", "session_busy"), ("stream_end", None)]
            errors = [f for f in frames if f["type"] == "error"]
            assert len(errors) == 1 and "taken over" in errors[0]["message"], errors
            assert len(h.chat_requests) == 1
            assert await h.runtime.store.kv_get("scratch", "note") is None


async def test_a_run_taken_over_stops_at_its_next_renewal_even_inside_a_tool(
    tmp_path: Any, autojump_clock: trio.testing.MockClock
) -> None:
    gate = GateTool()
    with held(autojump_clock), real_time_limit(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[calls("gate"), {"text": "never"}], tools=[gate],
            profiles=profile("gate"), lease_ttl_sec=3.0, first_chunk_timeout=FAR,
            chunk_timeout=FAR, session_idle_sec=FAR, llm_connect_timeout=FAR,
        ) as h:  # fmt: skip
            s = await h.session("s1")
            s.send("go")
            await gate.entered.wait()
            started = trio.current_time()
            await take_over(h, "s1")
            frames = await s.until_end()  # the gate never opens: the renewal stops it
            assert trio.current_time() - started < 3.0  # at a renewal (every TTL/3)
            assert said(frames)[-2:] == [("error", "session_busy"), ("stream_end", None)]
            assert len(h.chat_requests) == 1


async def test_frames_wait_for_the_lease_and_a_run_taken_over_meanwhile_publishes_none(
    tmp_path: Any, autojump_clock: trio.testing.MockClock
) -> None:
    """The store does not answer the renewals (a paused daemon, a cut-off network): once
    the lease could have run out, the run's frames wait; another daemon takes it over
    meanwhile, and when the store answers, none of what the run said since goes out."""
    words = " ".join(f"w{n}" for n in range(30))
    reply = {"text": words, "delay_chunk": 0.5}  # 15 s of virtual time, one word each 0.5 s
    with held(autojump_clock), real_time_limit(TIMEOUT):
        async with open_harness(
            tmp_path, replies=[reply, {"text": "never"}], profiles=profile(),
            lease_ttl_sec=3.0, first_chunk_timeout=FAR, chunk_timeout=FAR,
            session_idle_sec=FAR, llm_connect_timeout=FAR,
        ) as h:  # fmt: skip
            store = h.runtime.store
            renew = store.renew_lease
            answers = trio.Event()

            async def unanswered(*args: Any, **kwargs: Any) -> bool:
                await answers.wait()
                return await renew(*args, **kwargs)

            store.renew_lease = unanswered  # type: ignore[method-assign]
            s = await h.session("s1")
            s.send("go")
            await s.until_type("text_delta")
            await take_over(h, "s1")
            assert h.fake is not None
            await h.fake.wait_completed(1)  # the model said all of it meanwhile
            answers.set()
            frames = await s.until_end()
            text = "".join(f["text"] for f in frames if f["type"] == "text_delta")
            # Only what was said while the lease was surely the run's (less than its TTL).
            assert 0 < len(text.split()) <= 6, text
            assert said(frames)[-2:] == [("error", "session_busy"), ("stream_end", None)]
            assert await store.load_messages("s1") == [
                m for m in await store.load_messages("s1") if m["role"] == "user"
            ]  # the answer was not saved either


def two_daemons(tmp_path: Any) -> dict[str, Any]:
    """The settings of two runtimes on one SQLite file as two daemons: leases of 3 s,
    no other deadline in the way."""
    return {
        "lease_ttl_sec": 3.0, "first_chunk_timeout": FAR, "chunk_timeout": FAR,
        "session_idle_sec": FAR, "llm_connect_timeout": FAR, "profiles": profile(),
        "db_path": tmp_path / "navi.db",  # SQLite's leases: judged by the store's clock
    }  # fmt: skip


@asynccontextmanager
async def a_paused_and_b(
    tmp_path: Any, b_replies: list[dict[str, Any]]
) -> AsyncIterator[tuple[Harness, Harness, trio.Event, Callable[[], float]]]:
    """Two runtimes on one SQLite file and one wall clock (trio's virtual one), as two
    daemons, with leases of 3 s: A's model takes its time, and A's lease renewals go
    unanswered (a paused daemon) until the event is set. (A, B, that event, the wall.)"""
    wall = virtual_wall()
    knobs = two_daemons(tmp_path)
    slow = {"text": "late answer from A", "delay_first": 10.0}
    async with (
        open_harness(tmp_path, replies=[slow], wall_clock=wall, **knobs) as a,
        open_harness(tmp_path, replies=b_replies, wall_clock=wall, **knobs) as b,
    ):
        renew = a.runtime.store.renew_lease
        answers = trio.Event()

        async def unanswered(*args: Any, **kwargs: Any) -> bool:
            await answers.wait()
            return await renew(*args, **kwargs)

        a.runtime.store.renew_lease = unanswered  # type: ignore[method-assign]
        yield a, b, answers, wall


async def test_a_run_paused_past_its_lease_is_taken_over_by_a_second_runtime_and_saves_nothing(
    tmp_path: Any, autojump_clock: trio.testing.MockClock
) -> None:
    """Two runtimes on one SQLite file and one wall clock (trio's virtual one), as two
    daemons: A's renewals go unanswered (a paused daemon) while its model takes its
    time. B is refused while A's lease lasts; once it has run out by the wall clock, B
    takes the session over, and A's run, told at its next renewal, ends as taken over:
    the history holds B's answer, never A's."""
    async with paced(autojump_clock, TIMEOUT):
        async with a_paused_and_b(tmp_path, [{"text": "answer from B"}]) as (a, b, answers, _):
            on_a = await a.session("s1")
            on_a.send("one")
            assert a.fake is not None
            await a.fake.wait_requests(1)  # A's run holds the lease, its model thinking
            early = await b.turn("s1", "too early")
            assert said(early)[-2:] == [("error", "session_busy"), ("stream_end", None)]
            await trio.sleep(3.5)  # A's lease runs out on the wall clock
            took = await b.turn("s1", "two")
            assert took[-1]["reason"] == "complete", said(took)
            answers.set()
            late = await on_a.until_end()
            errors = [f for f in late if f["type"] == "error"]
            assert [e["code"] for e in errors] == ["session_busy"], errors
            assert "taken over" in errors[0]["message"], errors
            saved = await b.runtime.store.load_messages("s1")
    contents = [m["content"] for m in saved]
    assert "answer from B" in contents and "late answer from A" not in contents, contents


class AbandonedLeases:
    """A cluster's look for a dead daemon's turn (`Cluster.dead_turn`), on one SQLite
    file and the wall clock its stores share: another owner's lease, never released and
    run out, is taken over (the next generation, as this runtime's), once."""

    def __init__(self, h: Harness, wall: Any) -> None:
        store = h.runtime.store
        assert isinstance(store, SQLiteStore)
        self.store, self.wall, self.leases = store, wall, h.runtime.agent.leases
        self.taken: list[int] = []

    async def dead_turn(self, session_id: str) -> int | None:
        leases, now = self.leases, self.wall()

        def take(db: Any) -> int | None:
            row = db.execute(
                "SELECT generation FROM leases WHERE session_id = ? AND owner != ?"
                " AND expires_at <> 0 AND expires_at <= ?",
                [session_id, leases.owner, now],
            ).fetchone()
            if row is None:
                return None
            db.execute(
                "UPDATE leases SET owner = ?, pid = ?, host = ?, expires_at = ?,"
                " generation = ? WHERE session_id = ?",
                [leases.owner, leases.pid, leases.host, now + leases.ttl, row[0] + 1,
                 session_id],
            )  # fmt: skip
            return int(row[0]) + 1

        generation = await self.store.run_raw_for_tests("take an abandoned lease", take)
        if generation is not None:
            self.taken.append(generation)
        return generation


async def test_a_turn_left_by_a_runtime_paused_past_its_lease_is_ended_by_a_later_run_here(
    tmp_path: Any, autojump_clock: trio.testing.MockClock
) -> None:
    """B (a daemon of a cluster) ran the session, having looked for a dead daemon's turn
    (none). Then A took the session, saved its message and stopped answering (paused)
    while B was busy (a rewind): a message that reaches B then gets no look of its own
    before it is queued. Once A's lease has run out, that message's run must end A's
    turn first (the history says its daemon died), not take A's lease over as a live
    one's: A's message would be left in the history neither answered nor ended."""
    replies = [{"text": "zero done"}, {"text": "two done"}]
    async with paced(autojump_clock, TIMEOUT):
        async with a_paused_and_b(tmp_path, replies) as (a, b, answers, wall):
            looks = AbandonedLeases(b, wall)
            b.runtime.sessions.dead_turn = looks.dead_turn
            on_b = await b.session("s1")
            on_b.send("zero")
            assert (await on_b.until_end())[-1]["text"] == "zero done"
            await on_b.idle()
            rewound, busy = trio.Event(), trio.Event()

            async def rewind() -> None:  # B busy with the session, holding no lease
                busy.set()
                await rewound.wait()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(on_b.actor.exclusive, rewind)
                await busy.wait()
                on_a = await a.session("s1")
                on_a.send("one")
                assert a.fake is not None
                await a.fake.wait_requests(1)  # A saved "one", its model thinking
                await trio.sleep(3.5)  # A's lease runs out on the wall clock
                on_b.send("two")  # queued behind the rewind
                rewound.set()
            frames = await on_b.until_end()
            assert said(frames)[-2:] == [("error", "daemon_died"), ("stream_end", None)]
            assert (await on_b.until_end())[-1]["text"] == "two done"
            assert len(looks.taken) == 1
            answers.set()
            assert said(await on_a.until_end())[-2:] == [("error", "session_busy"),
                                                        ("stream_end", None)]  # fmt: skip
            saved = await b.runtime.store.load_messages("s1")
    assert [(m["role"], m["content"], m.get("error")) for m in saved] == [
        ("user", "zero", None), ("assistant", "zero done", None),
        ("user", "one", None), ("assistant", "", DEAD_TURN),
        ("user", "two", None), ("assistant", "two done", None),
    ]  # fmt: skip


async def test_a_daemon_dead_after_its_turns_last_save_leaves_no_turn_to_end(
    tmp_path: Any, autojump_clock: trio.testing.MockClock
) -> None:
    """A answered and died before it released its lease (the last thing its run does, after
    the stream_end): the lease row stays unreleased and runs out, as a dead daemon's. B's
    next message takes that lease over and finds A's turn ended in the history: it ends
    nothing (no dead-turn mark, no daemon_died frames), says that turn's end as saved (B
    cannot tell whether A said it before it died: nothing of A's reached B), and runs."""
    wall = virtual_wall()
    knobs = two_daemons(tmp_path)
    async with (
        paced(autojump_clock, TIMEOUT),
        open_harness(tmp_path, replies=[{"text": "one done"}], wall_clock=wall, **knobs) as a,
        open_harness(tmp_path, replies=[{"text": "two done"}], wall_clock=wall, **knobs) as b,
    ):
        died = trio.Event()

        async def dies(session_id: str, *, owner: str) -> None:
            died.set()  # A is killed here: its lease is never released

        a.runtime.store.release_lease = dies  # type: ignore[method-assign]
        looks = AbandonedLeases(b, wall)
        b.runtime.sessions.dead_turn = looks.dead_turn
        assert (await a.turn("s1", "one"))[-1]["text"] == "one done"
        await died.wait()
        await trio.sleep(3.5)  # A's lease runs out on the wall clock
        on_b = await b.session("s1")
        on_b.send("two")
        ends = [await on_b.until_end(), await on_b.until_end()]
        assert [said(frames) for frames in ends] == [[("stream_end", None)]] * 2, ends
        assert [(f[-1]["text"], f[-1]["reason"]) for f in ends] == [
            ("one done", "complete"),
            ("two done", "complete"),
        ]
        assert len(looks.taken) == 1  # A's lease, taken over as a dead daemon's
        saved = await b.runtime.store.load_messages("s1")
    assert [(m["role"], m["content"], m.get("error")) for m in saved] == [
        ("user", "one", None), ("assistant", "one done", None),
        ("user", "two", None), ("assistant", "two done", None),
    ]  # fmt: skip


USER = {"role": "user", "content": "q"}
ANSWER = {"role": "assistant", "content": "a"}
CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "r"}


@pytest.mark.parametrize(
    ("messages", "open_"),
    [
        ([], False),
        ([USER], True),
        ([USER, CALL, RESULT], True),
        ([USER, {"role": "assistant", "content": "plan", "is_plan": True}], True),
        ([USER, CALL, RESULT, {"role": "user", "content": "s", "steered": True}], True),
        ([USER, ANSWER, {"role": "system", "content": "note", "wake": True}], True),
        ([USER, CALL, RESULT, ANSWER], False),
        ([USER, {"role": "assistant", "content": "", "error": DEAD_TURN}], False),
    ],
)
def test_the_last_turn_is_open_until_an_answer_or_an_end_notice_follows_its_start(
    messages: list[dict[str, Any]], open_: bool
) -> None:
    assert last_turn_open(messages) is open_


async def test_frames_after_a_runs_clean_release_carry_no_fence(tmp_path: Any) -> None:
    """The run's frames carry its lease's fence to other daemons while it holds the lease;
    once the hold ended cleanly (the run's end, before the actor is idle), what it still
    publishes is not the hold's: a daemon that claimed the session since must get it."""
    seen: list[tuple[bool, object]] = []
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[{"text": "done"}]) as h:
            sessions = h.runtime.sessions
            before = sessions.on_run_end

            def ended(session_id: str, msg: Any, last: Any) -> None:
                actor = sessions.actor(session_id)
                assert actor is not None
                seen.append((actor.running is not None, actor.frame_fence()))
                if before is not None:
                    before(session_id, msg, last)

            sessions.on_run_end = ended
            await h.turn("s1", "hi")
            actor = sessions.actor("s1")
            assert actor is not None
            await actor.idle.wait()
    assert seen == [(True, None)]


async def test_a_dead_turn_is_ended_only_under_the_generation_taken_over(tmp_path: Any) -> None:
    """`end_dead_turn` ends the turn under the lease generation this runtime took over;
    its hold finding another one (another daemon took the lease and let it go since)
    means that daemon dealt with the turn: nothing is ended or said here."""
    said: list[list[Any]] = []
    with trio.fail_after(TIMEOUT):
        async with open_harness(tmp_path, replies=[]) as h:
            store = h.runtime.store
            await store.create_session("s1", profile_id="general")
            await store.append("s1", messages=[USER], context=[USER])  # a turn left open
            await h.runtime.agent.end_dead_turn("s1", 99, said.append)
            assert said == [] and await store.load_messages("s1") == [USER]
            # Its hold just took generation 1 and let it go: under it, the turn ends.
            await h.runtime.agent.end_dead_turn("s1", 1, said.append)
            assert [[type(e).__name__ for e in events] for events in said] == [
                ["ErrorEvent", "StreamEnd"]
            ]
            saved = await store.load_messages("s1")
            assert [m.get("error") for m in saved] == [None, DEAD_TURN]


async def test_a_queued_message_run_again_after_its_save_landed_unheard_owes_its_end(
    tmp_path: Any, autojump_clock: trio.testing.MockClock
) -> None:
    """A queued message's save (its turn's start, which sets the lease's end debt) lands
    but the store's answer is lost: the run ends in error, and that end, sent, pays the
    debt (on PostgreSQL the commit that sends it to the other daemons clears it; SQLite has
    no such commit, so the test clears it where that commit would have, before the retry
    reads the session). The message, acknowledged, runs again; the history has it already,
    so its retry has nothing new to save, yet its turn starts again: its lease must owe
    that turn's end as the first try's did (store/base.py `end_owed`), or a daemon that
    died before that end went out would leave the clients following the session on
    another daemon waiting for ever. The run's release finds its turn's end owed."""
    gate = GateTool()
    replies = [call("gate"), {"text": "first done"}, {"text": "queued done"}]
    async with (
        paced(autojump_clock, TIMEOUT),
        open_harness(tmp_path, replies=replies, tools=toolset(gate), profiles=profile("gate")) as h,
    ):
        store = h.runtime.store
        assert isinstance(store, SQLiteStore)
        append, load, release = store.append, store.load_session, store.release_lease
        lost: list[str] = []
        paid: list[bool] = []
        owed: list[bool] = []

        async def answer_lost(session_id: str, **kwargs: Any) -> None:
            await append(session_id, **kwargs)
            if kwargs.get("dequeue") is not None and not lost:
                lost.append(kwargs["dequeue"])  # landed: only its answer is lost
                raise StorageError("the store's answer was lost", session_id=session_id)

        def pay(db: Any) -> None:
            db.execute("UPDATE leases SET end_owed = 0 WHERE session_id = 's1'")

        async def loaded(session_id: str) -> Any:
            if lost and not paid:  # the retry reads the session: the failed end went out
                paid.append(await store.end_owed(session_id))
                await store.run_raw_for_tests("the failed try's end sent", pay)
            return await load(session_id)

        async def released(session_id: str, *, owner: str) -> None:
            owed.append(await store.end_owed(session_id))
            await release(session_id, owner=owner)

        store.append = answer_lost  # type: ignore[method-assign]
        store.load_session = loaded  # type: ignore[method-assign]
        store.release_lease = released  # type: ignore[method-assign]
        s = await h.session("s1")
        s.send("first")
        await gate.entered.wait()
        s.send("queued")
        await s.actor.pending[0].accepted.wait()  # stored in the queue: acknowledged
        gate.gate.set()
        assert (await s.until_end())[-1]["text"] == "first done"
        assert (await s.until_end())[-1]["reason"] == "error"  # its save "failed"
        assert (await s.until_end())[-1]["text"] == "queued done"  # run again: once
        await s.idle()
        saved = await store.load_messages("s1")
    assert paid == [True]  # the first try's start owed its end
    assert [(m["role"], m.get("content")) for m in saved][-2:] == [
        ("user", "queued"), ("assistant", "queued done"),
    ]  # fmt: skip
    assert [m.get("content") for m in saved].count("queued") == 1
    assert owed[-1], owed  # the retry's turn owed its end to its release
