"""Frames a daemon publishes as its hold of a session's lease ends (the end of a dead
daemon's turn, a rewind's ``rewound``) reach the clients of another daemon whose run
claims the lease right after the release: they are on the bus before the release, so
that daemon hears them before its run, not as a replaced owner's late frames.

Two runtimes joined as daemons on one PostgreSQL, in one process (its LISTEN / NOTIFY
carries the frames), the fake LLM over real HTTP on 127.0.0.1. The order is forced, not
waited for: A's release of the lease starts B's run and returns only once B's run holds
the lease, so whatever A sends after its release comes while B's run holds it. No
sleeps; every test under `trio.fail_after`.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql
from test_broadcast_relay import drained
from test_scale_relay import TIMEOUT, daemon

from navi_trio.core.cluster import cluster as cluster_module
from navi_trio.core.cluster.cluster import MARK_PREFIX, session_channel
from navi_trio.core.history.rewind import Target
from navi_trio.core.session import Frame, SessionActor, Subscription
from navi_trio.core.turn import UserMessage
from navi_trio.errors import SessionBusyError, StoreError
from navi_trio.runtime import Runtime
from navi_trio.store.fence import Fence

pytestmark = pytest.mark.slow  # its PostgreSQL server is a process

SID = "s1"
STALLED = {"text": "two", "stall": True}  # B's run: it holds the lease until stopped


class ClaimAfterRelease:
    """A's next release of the session's lease lets B's run claim it before A goes on.

    Once armed: A's frame of `kind` goes on the bus no sooner than A's hold of the lease
    starts to end (the latest a busy publisher could send it); A's release is made; then,
    when that frame was on the bus by then (PostgreSQL delivers it to B before anything
    committed after it), B hears it; then B's run of a new message starts, and the release
    returns once that run streams: it holds the lease. Whatever A sends after its release
    reaches B meanwhile."""

    def __init__(
        self, a: Runtime, b_actor: SessionActor, kind: str, *, heard_first: bool = True
    ) -> None:
        assert a.cluster is not None
        self.b_actor = b_actor
        self.heard_first = heard_first  # B's run starts once B heard A's frame
        self.armed = False
        self.ending = trio.Event()  # A's hold of the lease ends: its frames may go out
        self.on_bus = trio.Event()  # A's frame of `kind` was sent on the bus
        self.on_bus_at_release: bool | None = None
        self.heard = trio.Event()  # B's cluster handed it to B's actor
        self.watch = b_actor.subscribe()  # B's run streams: it holds the lease
        release, notify, relay = a.store.release_lease, a.cluster.bus.notify, b_actor.relay
        flush = getattr(a.agent.leases, "before_release", None)

        async def flushing() -> None:
            if self.armed:
                self.ending.set()
            assert flush is not None
            await flush()

        async def releasing(session_id: str, **kwargs: Any) -> None:
            if session_id == SID and self.armed:
                self.armed = False
                self.on_bus_at_release = self.on_bus.is_set()
                self.ending.set()
                await release(session_id, **kwargs)
                await self._b_claims()
                return
            await release(session_id, **kwargs)

        async def notifying(
            items: Sequence[tuple[str, str]],
            fences: Sequence[Fence | None] | None = None,
            ended: Sequence[Fence] = (),
        ) -> None:
            ours = any(json.loads(p).get("f", {}).get("type") == kind for _, p in items)
            if ours:
                await self.ending.wait()
            await notify(items, fences, ended)
            if ours:
                self.on_bus.set()

        def hearing(frame: Frame) -> None:
            relay(frame)
            if frame.get("type") == kind:
                self.heard.set()

        if flush is not None:
            a.agent.leases.before_release = flushing
        a.store.release_lease = releasing  # type: ignore[method-assign]
        a.cluster.bus.notify = notifying  # type: ignore[method-assign]
        b_actor.relay = hearing  # type: ignore[method-assign]

    async def _b_claims(self) -> None:
        if self.on_bus_at_release and self.heard_first:
            await self.heard.wait()
        self.b_actor.send_message(UserMessage("two"))
        async for frame in self.watch.frames:
            if frame["type"] == "text_delta":
                return

    async def then_b_stops(self, sub: Subscription) -> list[tuple[str, Any]]:
        """Once B heard A's frame: B's run stopped, and what B's client got."""
        await self.heard.wait()
        assert self.b_actor.running is not None  # B's run still holds the lease
        self.b_actor.stop()
        await self.b_actor.idle.wait()
        return [(f["type"], f.get("code") or f.get("reason")) for f in drained(sub)]


async def two_daemons(
    tmp_path: Path,
    pg_url: str,
    replies: list[dict[str, Any]],
    test: Callable[..., Awaitable[None]],
    a_replies: list[dict[str, Any]] | None = None,
) -> None:
    """B, with a client following the session, then A (it reads B's follow at its start)."""
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "b", pg_url, replies) as b:
            assert b.cluster is not None
            await b.store.create_session(SID, profile_id="general")
            await b.cluster.follow(SID)
            b_actor = await b.sessions.get(SID)
            sub = b_actor.subscribe()
            async with daemon(tmp_path / "a", pg_url, a_replies or []) as a:
                await test(a, b_actor, sub)


async def died_mid_turn(a: Runtime, pg_url: str) -> Fence:
    """A daemon of this machine saved its turn's message and died holding the lease (its
    save left the lease owing the turn's end, as `append(owes_end=True)` does); its
    lease's fence."""
    gone = await trio.lowlevel.open_process(["true"])
    await gone.wait()  # its pid, reaped, is dead
    host = socket.gethostname() or "localhost"
    lease = await a.store.claim_lease(SID, owner=f"{host}:{gone.pid}:dead", pid=gone.pid,
                                      host=host, ttl=600)  # fmt: skip
    sql(pg_url, "INSERT INTO messages (session_id, position, role, content, is_plan, data,"
                " created_at) VALUES (%s, 0, 'user', 'run', false, %s, 0)",
        (SID, json.dumps({"role": "user", "content": "run"})))  # fmt: skip
    sql(pg_url, "UPDATE leases SET end_owed = true WHERE session_id = %s", (SID,))
    return Fence(SID, lease.owner, lease.generation)


async def test_a_dead_turns_end_reaches_a_daemon_whose_run_claims_the_lease_at_its_release(
    tmp_path: Path, pg_url: str
) -> None:
    """A dead daemon left a turn open under its lease; A takes the lease over and ends the
    turn. B's run claims the lease as A releases it: B's client gets the dead turn's end,
    once, before B's own run (before, A published it after its release and B's run, then
    holding the lease, turned it away)."""

    async def test(a: Runtime, b_actor: SessionActor, sub: Subscription) -> None:
        await died_mid_turn(a, pg_url)
        a_actor = await a.sessions.get(SID)
        order = ClaimAfterRelease(a, b_actor, "error")
        order.armed = True
        await a_actor.take_over()
        got = await order.then_b_stops(sub)
        assert [g for g in got if g[0] != "resync"][:2] == [
            ("error", "daemon_died"),
            ("stream_end", "error"),
        ], got
        assert got.count(("error", "daemon_died")) == 1, got
        assert [r for t, r in got if t == "stream_end"] == ["error", "stopped"], got
        assert order.on_bus_at_release, "the dead turn's end was sent after the release"

    await two_daemons(tmp_path, pg_url, [STALLED], test)


async def test_a_rewinds_rewound_reaches_a_daemon_whose_run_claims_the_lease_at_its_release(
    tmp_path: Path, pg_url: str
) -> None:
    """A rewinds the session B ran; B's run of the next message claims the lease as A's
    rewind releases it: B's client gets ``rewound`` once (before, A published it after its
    release and B's run, then holding the lease, turned it away)."""

    async def test(a: Runtime, b_actor: SessionActor, sub: Subscription) -> None:
        b_actor.send_message(UserMessage("one"))
        await b_actor.idle.wait()
        first = next(m for m in await a.store.load_messages(SID) if m["role"] == "user")
        target = Target(to=first["id"], restore="chat")
        preview = await a.rewinds.preview(SID, target)
        order = ClaimAfterRelease(a, b_actor, "rewound")
        order.armed = True
        await a.rewinds.apply(SID, target, preview.token)
        got = await order.then_b_stops(sub)
        assert got.count(("rewound", None)) == 1, got
        assert [r for t, r in got if t == "stream_end"] == ["complete", "stopped"], got
        assert order.on_bus_at_release, "the rewind's rewound was sent after the release"

    await two_daemons(tmp_path, pg_url, [{"text": "answer one"}, STALLED], test)


async def test_a_message_sent_after_the_dead_turns_end_waits_for_no_other_end(
    tmp_path: Path, pg_url: str
) -> None:
    """A message that reaches the daemon after it said the dead turn's end, while it still
    lets that turn's lease go, is queued at position 0: the end before it was said, and
    the next end its client hears is its own run's."""
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "a", pg_url, [{"text": "two done"}]) as a:
            await a.store.create_session(SID, profile_id="general")
            await died_mid_turn(a, pg_url)
            actor = await a.sessions.get(SID)
            sub = actor.subscribe()
            release = a.store.release_lease
            sent: list[object] = []  # what the message's send said

            async def releasing(session_id: str, **kwargs: Any) -> None:
                if not sent:  # the dead turn's lease: its end was said
                    sent.append(actor.send_message(UserMessage("two")))
                await release(session_id, **kwargs)

            a.store.release_lease = releasing  # type: ignore[method-assign]
            await actor.take_over()
            await actor.idle.wait()
            got = [(f["type"], f.get("code") or f.get("reason") or f.get("position"))
                   for f in drained(sub) if f["type"] != "text_delta"]  # fmt: skip
    assert sent == ["enqueue"], sent
    assert got[:3] == [
        ("error", "daemon_died"),
        ("stream_end", "error"),
        ("message_queued", 0),
    ], got
    assert [r for t, r in got if t == "stream_end"] == ["error", "complete"], got


async def test_a_failed_runs_end_reaches_a_daemon_whose_run_claims_the_lease_at_its_release(
    tmp_path: Path, pg_url: str
) -> None:
    """A's run fails after its message was saved (an internal error out of the turn); B's run
    claims the lease as A's run releases it: B's client gets A's run's ``error`` and its
    ``stream_end``, once, before B's own run (before, A said them after its release and B's
    run, then holding the lease, turned them away)."""

    async def test(a: Runtime, b_actor: SessionActor, sub: Subscription) -> None:
        def broken(request: object) -> Any:
            raise RuntimeError("the model's client broke")

        a.agent.parts.backend.stream_chat = broken  # type: ignore[method-assign]
        a_actor = await a.sessions.get(SID)
        order = ClaimAfterRelease(a, b_actor, "error")
        order.armed = True
        a_actor.send_message(UserMessage("one"))
        await a_actor.idle.wait()  # (its release returned once B's run held the lease)
        got = await order.then_b_stops(sub)
        ends = [g for g in got if g[0] in ("error", "stream_end")]
        assert ends == [("error", "internal"), ("stream_end", "error"), ("stream_end", "stopped")]
        assert order.on_bus_at_release, "the failed run's end was sent after the release"

    await two_daemons(tmp_path, pg_url, [STALLED], test)


async def test_a_fork_of_a_session_another_daemons_run_holds_is_refused_as_busy(
    tmp_path: Path, pg_url: str
) -> None:
    """B's run holds the session's lease; a fork of it on A is refused (``session_busy``), as
    on one daemon while a run is active. Before, A forked the half-written turn, and its
    ``forked`` never reached B's clients: B's run took it for a replaced owner's late frame."""

    async def test(a: Runtime, b_actor: SessionActor, sub: Subscription) -> None:
        b_actor.send_message(UserMessage("two"))
        async for frame in sub.frames:
            if frame["type"] == "text_delta":
                break  # B's run holds the lease
        await a.store.create_session("s2", profile_id="general")
        with pytest.raises(SessionBusyError):
            await a.rewinds.fork(SID, "s2")
        assert await a.store.get_session("s2") is None  # nothing left of it
        b_actor.stop()
        await b_actor.idle.wait()

    await two_daemons(tmp_path, pg_url, [STALLED], test)


async def test_a_forks_forked_reaches_a_daemon_whose_run_claims_the_lease_at_its_release(
    tmp_path: Path, pg_url: str
) -> None:
    """A forks the session B ran; B's run of the next message claims the lease as the fork
    lets it go: B's client gets ``forked`` once, ahead of its run."""

    async def test(a: Runtime, b_actor: SessionActor, sub: Subscription) -> None:
        b_actor.send_message(UserMessage("one"))
        await b_actor.idle.wait()
        await a.store.create_session("s2", profile_id="general")
        order = ClaimAfterRelease(a, b_actor, "forked")
        order.armed = True
        await a.rewinds.fork(SID, "s2")
        got = await order.then_b_stops(sub)
        assert got.count(("forked", None)) == 1, got
        assert [r for t, r in got if t == "stream_end"] == ["complete", "stopped"], got
        assert order.on_bus_at_release, "the fork's forked was sent after the release"

    await two_daemons(tmp_path, pg_url, [{"text": "answer one"}, STALLED], test)


async def test_a_runs_end_its_daemon_publishes_late_still_goes_out_before_its_release(
    tmp_path: Path, pg_url: str
) -> None:
    """A's actor publishes what A's run says from its own task, after the run said it; here
    each event a few scheduling rounds late (it asks the lease first). A's run lets the
    lease go only once its actor is done with its events: its end is on the bus before B's
    run claims the lease at the release, and B's client gets it (before, the run's hold
    ended first, its end went out after the release, and B's run turned it away)."""

    async def test(a: Runtime, b_actor: SessionActor, sub: Subscription) -> None:
        a_actor = await a.sessions.get(SID)
        may_publish = a_actor._may_publish

        async def late(msg: UserMessage, control: Any) -> bool:
            for _ in range(20):  # far more rounds than the hold's end takes to its release
                await trio.lowlevel.checkpoint()
            return await may_publish(msg, control)

        a_actor._surely_publishes = lambda msg, control: None  # type: ignore[method-assign]
        a_actor._may_publish = late  # type: ignore[method-assign]
        order = ClaimAfterRelease(a, b_actor, "stream_end")
        order.armed = True
        a_actor.send_message(UserMessage("one"))
        await a_actor.idle.wait()
        got = await order.then_b_stops(sub)
        assert [r for t, r in got if t == "stream_end"] == ["complete", "stopped"], got
        assert order.on_bus_at_release, "A's end was sent after the release"

    await two_daemons(tmp_path, pg_url, [STALLED], test, a_replies=[{"text": "one done"}])


async def test_a_runs_end_heard_late_by_the_daemon_claiming_at_its_release_still_reaches_it(
    tmp_path: Path, pg_url: str
) -> None:
    """A's run ends and lets the lease go, its ``stream_end`` on the bus first; B's run claims
    the lease at once, and B's listener hands that frame on only after B's claim returned
    (nothing orders the listener's connection against the claim's). B's claim waits until
    what was sent before it is handed to its actor: B's client gets A's end, before its
    own run (before, B's run held the lease by then and turned it away)."""
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "b", pg_url, [STALLED]) as b:
            assert b.cluster is not None
            await b.store.create_session(SID, profile_id="general")
            await b.cluster.follow(SID)
            b_actor = await b.sessions.get(SID)
            sub = b_actor.subscribe()
            claim, handle, claimed = b.store.claim_lease, b.cluster._handle, trio.Event()

            async def claiming(session_id: str, **kwargs: Any) -> Any:
                holder = await claim(session_id, **kwargs)
                claimed.set()
                return holder

            async def handling(channel: str, payload: str) -> None:
                if '"stream_end"' in payload:
                    await claimed.wait()  # the listener late: B's claim is back first
                await handle(channel, payload)

            b.store.claim_lease = claiming  # type: ignore[method-assign]
            b.cluster._handle = handling  # type: ignore[method-assign]
            async with daemon(tmp_path / "a", pg_url, [{"text": "one done"}]) as a:
                a_actor = await a.sessions.get(SID)
                order = ClaimAfterRelease(a, b_actor, "stream_end", heard_first=False)
                order.armed = True
                a_actor.send_message(UserMessage("one"))
                await a_actor.idle.wait()
                got = await order.then_b_stops(sub)
    ends = [r for t, r in got if t == "stream_end"]
    assert ends == ["complete", "stopped"], got
    assert order.on_bus_at_release, "A's end was sent after the release"


async def stuck_on(b: Runtime, session_id: str) -> tuple[trio.Event, trio.Event]:
    """B's handler takes a notification of `session_id` and stays on it until the second
    event is set; the first is set once it is stuck there."""
    assert b.cluster is not None
    handle, stuck, gate = b.cluster._handle, trio.Event(), trio.Event()

    async def handling(channel: str, payload: str) -> None:
        if channel == session_channel(session_id) and not gate.is_set():
            stuck.set()
            await gate.wait()
        await handle(channel, payload)

    b.cluster._handle = handling  # type: ignore[method-assign]
    note = json.dumps({"f": {"type": "x", "session_id": session_id}, "d": "another"})
    await b.cluster.bus.notify([(session_channel(session_id), note)])
    await stuck.wait()
    return stuck, gate


def marks_heard(cluster: Any) -> trio.Event:
    """Set once a mark of `caught_up` came back to `cluster` and the NOTIFY that sent it
    has returned: the catch-up is then at its wait (or past it), never still in the
    store's thread, where a test's `wait_all_tasks_blocked` would count it as blocked."""
    mark_back, notify = cluster._mark_back, cluster.bus.notify
    heard, sent, said = trio.Event(), trio.Event(), trio.Event()

    def back(payload: str) -> None:
        mark_back(payload)
        heard.set()
        if sent.is_set():
            said.set()

    async def notify_then_say(items: Any, *args: Any, **kwargs: Any) -> None:
        await notify(items, *args, **kwargs)
        if any(str(payload).startswith(MARK_PREFIX) for _, payload in items):
            sent.set()
            if heard.is_set():
                said.set()

    cluster._mark_back = back
    cluster.bus.notify = notify_then_say
    return said


@asynccontextmanager
async def catching_up(cluster: Any, order: list[str]) -> AsyncIterator[None]:
    """A claim's catch-up of SID under way, entered once its mark is back and its NOTIFY
    returned (`marks_heard`); "caught up" goes into `order` when it returns, and the
    block's end waits for that."""
    said = marks_heard(cluster)
    async with trio.open_nursery() as nursery:

        async def catch_up() -> None:
            await cluster.caught_up(SID)
            order.append("caught up")

        nursery.start_soon(catch_up)
        await said.wait()
        yield


async def test_a_claims_catch_up_waits_for_no_other_sessions_backlog(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's handler is stuck on a notification of session s2; the catch-up of a claim of s1
    (which B follows too) is back at once: nothing of s1's waits. Before, its mark waited
    behind the handler's whole backlog, up to its bound (made endless here)."""
    monkeypatch.setattr(cluster_module, "CAUGHT_UP_SEC", 3600.0)
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "b", pg_url, []) as b:
            assert b.cluster is not None
            await b.cluster.follow(SID)
            await b.cluster.follow("s2")
            _, gate = await stuck_on(b, "s2")
            await b.cluster.caught_up(SID)
            gate.set()


async def test_a_claims_catch_up_still_waits_for_its_own_sessions_earlier_frames(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's handler is stuck on a notification of s1 sent before the claim: the claim's
    catch-up comes back only once that one is handled, though its mark came back first."""
    monkeypatch.setattr(cluster_module, "CAUGHT_UP_SEC", 3600.0)
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "b", pg_url, []) as b:
            assert b.cluster is not None
            cluster = b.cluster
            await cluster.follow(SID)
            _, gate = await stuck_on(b, SID)
            order: list[str] = []
            async with catching_up(cluster, order):  # the session's frame not handled
                await trio.testing.wait_all_tasks_blocked()
                order.append("released")
                gate.set()
    assert order == ["released", "caught up"]


async def test_a_claims_catch_up_waits_for_every_earlier_frame_of_its_session(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two notifications of s1 sent before the claim, B's handler stuck on each in turn:
    the claim's catch-up comes back once both are handled, not once the first is."""
    monkeypatch.setattr(cluster_module, "CAUGHT_UP_SEC", 3600.0)
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "b", pg_url, []) as b:
            assert b.cluster is not None
            cluster = b.cluster
            await cluster.follow(SID)
            handle = cluster._handle
            names = ("first", "second")
            gates = {name: trio.Event() for name in names}
            stuck = {name: trio.Event() for name in names}

            async def holding(channel: str, payload: str) -> None:
                for name in names:
                    if f'"{name}"' in payload:
                        stuck[name].set()
                        await gates[name].wait()
                await handle(channel, payload)

            cluster._handle = holding  # type: ignore[method-assign]
            notes = [
                (session_channel(SID), json.dumps({"f": {"type": "x", "n": name}, "d": "x"}))
                for name in names
            ]
            await cluster.bus.notify(notes)
            await stuck["first"].wait()
            order: list[str] = []
            async with catching_up(cluster, order):  # neither frame handled
                gates["first"].set()
                await stuck["second"].wait()
                await trio.testing.wait_all_tasks_blocked()
                order.append("the second released")
                gates["second"].set()
    assert order == ["the second released", "caught up"]


async def test_a_claims_catch_up_is_not_held_by_its_sessions_notification_that_failed(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's handling of a notification of s1 fails (a store error, logged): it is handled
    all the same, and the catch-up of a claim of s1 does not wait for it (its bound made
    endless here)."""
    monkeypatch.setattr(cluster_module, "CAUGHT_UP_SEC", 3600.0)
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "b", pg_url, []) as b:
            assert b.cluster is not None
            cluster = b.cluster
            await cluster.follow(SID)
            handle, failed = cluster._handle, trio.Event()

            async def failing(channel: str, payload: str) -> None:
                if channel == session_channel(SID) and not failed.is_set():
                    failed.set()
                    raise StoreError("the store did not answer")
                await handle(channel, payload)

            cluster._handle = failing  # type: ignore[method-assign]
            note = json.dumps({"f": {"type": "x", "session_id": SID}, "d": "another"})
            await cluster.bus.notify([(session_channel(SID), note)])
            await failed.wait()
            await cluster.caught_up(SID)


async def died_after_its_answer(
    a: Runtime, pg_url: str, frames: list[Frame], *, answered: bool = True
) -> None:
    """A daemon of this machine saved its turn's answer (unless not `answered`) and died
    holding the lease, its `frames` (its epoch "dead") heard by the daemons following the
    session: sent as its publisher sends them, its end (if among them) clearing its
    lease's debt in their commit."""
    fence = await died_mid_turn(a, pg_url)
    if answered:
        sql(pg_url, "INSERT INTO messages (session_id, position, role, content, is_plan,"
                    " data, created_at) VALUES (%s, 1, 'assistant', 'the answer', false, %s, 0)",
            (SID, json.dumps({"role": "assistant", "content": "the answer"})))  # fmt: skip
    assert a.cluster is not None
    notes = [(session_channel(SID), json.dumps({"f": f, "d": "dead"})) for f in frames]
    ended = [fence] if any(f["type"] == "stream_end" for f in frames) else []
    await a.cluster.bus.notify(notes, [fence] * len(notes), ended)


def dead_frame(seq: int, type_: str, **fields: Any) -> Frame:
    return {"type": type_, "session_id": SID, "seq": seq, "epoch": "dead", **fields}


async def dead_turn_heard_on_b(
    tmp_path: Path, pg_url: str, frames: list[Frame], *, b_takes_it: bool, answered: bool = True
) -> list[tuple[Any, ...]]:
    """A dead daemon's turn, its answer saved and `frames` of it heard on B, whose client
    follows the session: taken over (twice) by B, or else by A. What B's client gets."""
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "b", pg_url, []) as b:
            assert b.cluster is not None
            await b.store.create_session(SID, profile_id="general")
            await b.cluster.follow(SID)
            sub = (await b.sessions.get(SID)).subscribe()
            async with daemon(tmp_path / "a", pg_url, []) as a:
                await died_after_its_answer(a, pg_url, frames, answered=answered)
                await b.cluster.caught_up(SID)  # B heard the dead daemon's frames
                finder = b if b_takes_it else a
                actor = await finder.sessions.get(SID)
                await actor.take_over()
                await actor.take_over()  # (again: nothing more to end)
                await b.cluster.caught_up(SID)  # and what A said before its release
                return [(f["type"], f.get("reason"), f.get("text")) for f in drained(sub)]


async def test_a_dead_daemons_turn_saved_but_never_ended_is_ended_by_the_daemon_taking_it(
    tmp_path: Path, pg_url: str
) -> None:
    """A daemon saved its turn's answer and died before its ``stream_end`` went out. B's
    client heard the turn's text, then nothing: A, which takes the dead lease over, says
    that turn's end, once, as the history has it (before, nobody said it: a client
    waiting for the end, `navi run`, waited for ever)."""
    text = dead_frame(1, "text_delta", text="the answer")
    got = await dead_turn_heard_on_b(tmp_path, pg_url, [text], b_takes_it=False)
    assert got == [
        ("resync", None, None),  # the dead daemon's epoch, new to B
        ("text_delta", None, "the answer"),
        ("resync", None, None),
        ("stream_end", "complete", "the answer"),
    ], got


@pytest.mark.parametrize("b_takes_it", [True, False], ids=["b-takes-it", "a-takes-it"])
async def test_a_dead_daemons_turn_ended_on_this_daemon_is_not_ended_again(
    tmp_path: Path, pg_url: str, b_takes_it: bool
) -> None:
    """Its ``stream_end`` went out before it died: B heard it, and the daemon taking the
    lease over says no second one: B, or A, which did not follow the session and heard
    nothing (before, A said it again, and B's client got a second end after a resync)."""
    text = dead_frame(1, "text_delta", text="the answer")
    end = dead_frame(2, "stream_end", reason="complete", text="the answer")
    got = await dead_turn_heard_on_b(tmp_path, pg_url, [text, end], b_takes_it=b_takes_it)
    assert got == [
        ("resync", None, None),  # the dead daemon's epoch, new to B
        ("text_delta", None, "the answer"),
        ("stream_end", "complete", "the answer"),
    ], got


async def test_a_dead_daemons_open_turn_is_ended_though_its_turn_before_was_heard_ended(
    tmp_path: Path, pg_url: str
) -> None:
    """B heard the end of the dead daemon's turn before; of its next turn it saved the
    message, and died before any frame of it went out. B, taking the lease over, ends
    that open turn (its error, its end) though B's last word was a turn's end: only the
    end of a turn the history shows ended is left out when heard."""
    end = dead_frame(1, "stream_end", reason="complete", text="an earlier answer")
    got = await dead_turn_heard_on_b(tmp_path, pg_url, [end], b_takes_it=True, answered=False)
    assert got == [
        ("resync", None, None),  # the dead daemon's epoch, new to B
        ("stream_end", "complete", "an earlier answer"),
        ("resync", None, None),  # B's own frames
        ("error", None, None),  # the dead turn's: daemon_died
        ("stream_end", "error", ""),
    ], got
