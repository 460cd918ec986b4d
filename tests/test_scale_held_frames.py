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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql
from test_broadcast_relay import drained
from test_scale_relay import TIMEOUT, daemon

from navi_trio.core.history.rewind import Target
from navi_trio.core.session import Frame, SessionActor, Subscription
from navi_trio.core.turn import UserMessage
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

    def __init__(self, a: Runtime, b_actor: SessionActor, kind: str) -> None:
        assert a.cluster is not None
        self.b_actor = b_actor
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
            items: Sequence[tuple[str, str]], fences: Sequence[Fence | None] | None = None
        ) -> None:
            ours = any(json.loads(p).get("f", {}).get("type") == kind for _, p in items)
            if ours:
                await self.ending.wait()
            await notify(items, fences)
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
        if self.on_bus_at_release:
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
    tmp_path: Path, pg_url: str, replies: list[dict[str, Any]], test: Callable[..., Awaitable[None]]
) -> None:
    """B, with a client following the session, then A (it reads B's follow at its start)."""
    with trio.fail_after(TIMEOUT):
        async with daemon(tmp_path / "b", pg_url, replies) as b:
            assert b.cluster is not None
            await b.store.create_session(SID, profile_id="general")
            await b.cluster.follow(SID)
            b_actor = await b.sessions.get(SID)
            sub = b_actor.subscribe()
            async with daemon(tmp_path / "a", pg_url, []) as a:
                await test(a, b_actor, sub)


async def died_mid_turn(a: Runtime, pg_url: str) -> None:
    """A daemon of this machine saved its turn's message and died holding the lease."""
    gone = await trio.lowlevel.open_process(["true"])
    await gone.wait()  # its pid, reaped, is dead
    host = socket.gethostname() or "localhost"
    await a.store.claim_lease(SID, owner=f"{host}:{gone.pid}:dead", pid=gone.pid, host=host,
                              ttl=600)  # fmt: skip
    sql(pg_url, "INSERT INTO messages (session_id, position, role, content, is_plan, data,"
                " created_at) VALUES (%s, 0, 'user', 'run', false, %s, 0)",
        (SID, json.dumps({"role": "user", "content": "run"})))  # fmt: skip


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
