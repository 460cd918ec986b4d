"""Pieces of the cluster on their own (issue 20): the bus carries a frame too large for
one NOTIFY through the frames table, in order with the small ones; a dead daemon's
background jobs are reported lost while a live daemon's on another machine are not,
and this supervisor's own running jobs never are.

Real PostgreSQL for the bus (two stores on one database: two daemons); the kv store of
the supervisor is the in-memory one of the other supervisor tests. No sleeps; every
test under `trio.fail_after`.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing
from kvfake_tasks import MemoryKV
from pg_server import pg_url_with_schema as pg_url_with_schema
from pg_server import sql

from navi_trio.core.cluster import Cluster
from navi_trio.core.cluster.cluster import session_channel
from navi_trio.core.cluster.owner_calls import ASK_TIMEOUT_SEC, OwnerCalls
from navi_trio.core.jobs import NOTES_SCOPE, RUNNING_SCOPE, Job, TaskSupervisor
from navi_trio.core.turn import SessionLeases
from navi_trio.errors import NaviError, NotFoundError, StorageError, UnavailableError
from navi_trio.events import StreamEnd, TextDelta
from navi_trio.settings import Settings
from navi_trio.store.base import ClusterBus, LeaseRow
from navi_trio.store.fence import Fence, fenced
from navi_trio.store.methods import SessionStore
from navi_trio.store.postgres import PostgresStore
from navi_trio.store.postgres._bus import NOTIFY_MAX, PgBus
from navi_trio.tools.base import ToolResult

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 30


@asynccontextmanager
async def sent_over_the_bus(pg_url: str, payloads: list[str]) -> AsyncIterator[
    tuple[list[str], PgBus]
]:  # fmt: skip
    """`payloads` notified on one channel by one store's bus and heard by another's:
    what arrived, in order, and the hearing bus, while both stores are open."""
    got: list[str] = []
    done = trio.Event()

    def received(channel: str, payload: str) -> None:
        got.append(payload)
        if len(got) == len(payloads):
            done.set()

    async with PostgresStore.open(pg_url) as one, PostgresStore.open(pg_url) as two:
        follower, owner = one.bus(), two.bus()
        follower.on_message(received)
        async with follower.listening():
            await follower.listen("ns_test")
            await owner.notify([("ns_test", p) for p in payloads])
            await done.wait()
        yield got, follower


async def test_frames_over_the_notify_limit_arrive_whole_and_in_order(pg_url: str) -> None:
    big = json.dumps({"f": {"type": "tool_result", "output": "x" * (3 * NOTIFY_MAX)}})
    with trio.fail_after(TIMEOUT):
        async with sent_over_the_bus(pg_url, ['{"n": 1}', big, '{"n": 3}']) as (got, follower):
            assert got[0::2] == ['{"n": 1}', '{"n": 3}']
            ref = json.loads(got[1])["ref"]
            assert await follower.fetch_frame(ref) == big
    assert sql(pg_url, "SELECT count(*) FROM frames") == [(1,)]


async def test_a_frame_under_the_limit_in_characters_over_it_in_bytes_arrives_whole(
    pg_url: str,
) -> None:
    """The limit is PostgreSQL's, in bytes: a frame of fewer characters than that, most
    of them two bytes in UTF-8, goes through the frames table too."""
    text = "é" * (NOTIFY_MAX // 2 + 100)
    wide = json.dumps({"f": {"type": "text_delta", "text": text}}, ensure_ascii=False)
    assert len(wide) <= NOTIFY_MAX < len(wide.encode())
    with trio.fail_after(TIMEOUT):
        async with sent_over_the_bus(pg_url, [wide]) as (got, follower):
            assert await follower.fetch_frame(json.loads(got[0])["ref"]) == wide


async def test_frames_with_quotes_backslashes_and_braces_arrive_as_sent(pg_url: str) -> None:
    """A batch of small frames goes out as one statement, its payloads a text[] literal
    the store writes (`_tables.text_array`): each arrives as it was sent, in order."""
    texts = ['say "hi"', "a\\b", "{}", "a,b", "NULL", "", "é ☃ 𝄞", '\\"{,}\\', "line\nnext"]
    payloads = [json.dumps({"f": {"type": "text_delta", "text": t}}, ensure_ascii=False)
                for t in texts] + ["NULL", '"quoted"', "\\"]  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with sent_over_the_bus(pg_url, payloads) as (got, _):
            assert got == payloads


async def test_frames_of_a_run_taken_over_are_not_sent_checked_in_the_notify(
    pg_url: str,
) -> None:
    """A frame carries its run's lease fence: sent only while the lease row still names
    that owner and generation, checked in the statement that notifies (small frames) or
    its transaction (large ones). Unfenced frames (a task update) always go."""
    big = "x" * (3 * NOTIFY_MAX)
    host = socket.gethostname() or "localhost"
    got: list[str] = []
    done = trio.Event()

    def received(channel: str, payload: str) -> None:
        got.append(payload)
        if len(got) == 3:
            done.set()

    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as one, PostgresStore.open(pg_url) as two:
            await two.claim_lease("s1", owner="a", pid=os.getpid(), host=host, ttl=-1)
            taken = await two.claim_lease("s1", owner="b", pid=os.getpid(), host=host, ttl=60)
            stale, live = Fence("s1", "a", taken.generation - 1), Fence("s1", "b", taken.generation)
            follower, owner = one.bus(), two.bus()
            follower.on_message(received)
            async with follower.listening():
                await follower.listen("ns_test")
                small = [("late a", stale), ("task update", None), ("b says", live)]
                await owner.notify([("ns_test", p) for p, _ in small], [f for _, f in small])
                large = [(big + "late", stale), (big, live)]
                await owner.notify([("ns_test", p) for p, _ in large], [f for _, f in large])
                await done.wait()
            # In order, one transaction each: a stale frame sent would come first.
            assert got[:2] == ["task update", "b says"], got
            assert await follower.fetch_frame(json.loads(got[2])["ref"]) == big


async def test_a_turns_end_sent_pays_only_the_debt_of_its_own_hold(pg_url: str) -> None:
    """`notify`'s `ended` clears the debt of the lease its fence names, owner and
    generation: an end of the owner's earlier hold (the lease since taken over and
    taken back) leaves the debt of its hold now."""
    host = socket.gethostname() or "localhost"
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="general")
            first = await store.claim_lease("s1", owner="a", pid=os.getpid(), host=host, ttl=-1)
            await store.claim_lease("s1", owner="b", pid=os.getpid(), host=host, ttl=-1)
            now = await store.claim_lease("s1", owner="a", pid=os.getpid(), host=host, ttl=60)
            assert now.generation == first.generation + 2
            with fenced(Fence("s1", "a", now.generation)):
                await store.append(
                    "s1", messages=[{"role": "user", "content": "hi"}], owes_end=True
                )
            bus = store.bus()
            await bus.notify([], [], ended=[Fence("s1", "a", first.generation)])
            assert await store.end_owed("s1")
            await bus.notify([], [], ended=[Fence("s1", "a", now.generation)])
            assert not await store.end_owed("s1")


def _marker(sid: str, tid: str, pid: int, host: str) -> dict[str, object]:
    return {"session_id": sid, "task_id": tid, "tool": "terminal", "args_summary": "",
            "is_spawn": False, "pid": pid, "host": host}  # fmt: skip


async def test_only_dead_daemons_jobs_are_reported_lost() -> None:
    kv = MemoryKV()
    await kv.kv_set(RUNNING_SCOPE, "s1:bt-live", _marker("s1", "bt-live", 42, "other-host"))
    await kv.kv_set(RUNNING_SCOPE, "s2:bt-dead", _marker("s2", "bt-dead", 43, "other-host"))
    release = trio.Event()

    async def runner(job: Job) -> ToolResult:
        await release.wait()
        return ToolResult.success("done")

    with trio.fail_after(TIMEOUT):
        sup = TaskSupervisor(Settings(), kv, lambda sid, ev: None)
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)  # at start-up nothing is known of other hosts
            assert [k for k, _ in await kv.kv_list(RUNNING_SCOPE)] == []
            await kv.kv_set(RUNNING_SCOPE, "s1:bt-live", _marker("s1", "bt-live", 42, "other-host"))
            await kv.kv_set(RUNNING_SCOPE, "s2:bt-dead", _marker("s2", "bt-dead", 43, "other-host"))
            job = sup.submit("s3", "terminal", {}, runner)
            await trio.testing.wait_all_tasks_blocked()
            # The cluster knows: pid 42 on other-host is a live daemon, 43 is not.
            lost = await sup.report_lost_jobs({(42, "other-host")})
            assert lost == 1
            running = sorted(k for k, _ in await kv.kv_list(RUNNING_SCOPE))
            assert running == ["s1:bt-live", f"s3:{job.task_id}"]
            notes = await kv.kv_list(NOTES_SCOPE)
            assert any("bt-dead" in json.dumps(v) and "lost" in json.dumps(v) for _, v in notes)
            release.set()
            await job.done.wait()
            nursery.cancel_scope.cancel()


async def test_a_dead_daemon_elsewhere_leaves_its_queue_to_the_others(pg_url: str) -> None:
    """Another machine's pid means nothing here: its ``daemons`` row says whether it lives."""
    me = os.getpid()
    host = socket.gethostname() or "localhost"
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            await store.create_session("s1", profile_id="general")
            bus = store.bus()
            await bus.heartbeat("far-live", 11, "far", 60)
            await bus.heartbeat("far-dead", 12, "far", 60)
            await bus.leave("far-dead")  # stopped (or its heartbeat ran out)
            for key, pid in (("live", 11), ("dead", 12), ("no-row", 13)):
                await store.enqueue("s1", key, {"text": key}, pid=pid, host="far")
            got = await store.adopt_queued("s1", pid=me, host=host)
            assert [k for k, _ in got] == ["dead"]


class _SlowListenBus:
    """What Cluster.follow/unfollow use of the bus; a listen waits for its channel's gate."""

    def __init__(self) -> None:
        self.gates: dict[str, trio.Event] = {}
        self.said: list[tuple[str, str]] = []

    async def listen(self, channel: str) -> None:
        self.said.append(("listen", channel))
        await self.gates.setdefault(channel, trio.Event()).wait()

    async def unlisten(self, channel: str) -> None:
        self.said.append(("unlisten", channel))

    async def follow(self, session_id: str, owner: str, on: bool) -> None:
        self.said.append(("follow" if on else "unfollow", session_id))

    async def notify(self, items: Sequence[tuple[str, str]]) -> None:
        self.said.append(("notify", json.loads(items[0][1])["s"]))


async def test_sessions_are_followed_side_by_side_and_one_sessions_steps_in_order() -> None:
    """Many sessions starting at once: one waiting on the database holds up no other's
    follow (one lock for all made 500 of them take turns for 30 s); the same session's
    follow and unfollow still go one after the other, and no lock is kept after."""
    bus = _SlowListenBus()
    leases = cast(SessionLeases, SimpleNamespace(owner="d-1"))
    cluster = Cluster(cast(ClusterBus, bus), cast(SessionStore, None), leases, 60.0)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cluster.follow, "s1")
            await trio.testing.wait_all_tasks_blocked()
            bus.gates[session_channel("s2")] = trio.Event()
            bus.gates[session_channel("s2")].set()
            await cluster.follow("s2")  # s1 still waits for its listen
            assert ("notify", "s2") in bus.said and ("notify", "s1") not in bus.said
            nursery.start_soon(cluster.unfollow, "s1")  # waits for s1's follow to end
            await trio.testing.wait_all_tasks_blocked()
            assert ("unlisten", session_channel("s1")) not in bus.said
            bus.gates[session_channel("s1")].set()
        s1 = [what for what, about in bus.said if about in ("s1", session_channel("s1"))]
        assert s1 == ["listen", "follow", "notify", "unlisten", "unfollow", "notify"]
        assert cluster._follow_locks == {}


async def test_the_scan_finds_what_dead_owners_left_and_leaves_live_ones_alone(
    pg_url: str,
) -> None:
    """`orphans`: a queue nobody runs; a lease its owner never released, when the owner is
    known dead or its lease and daemon row both ran out (a live daemon late to renew
    one lease keeps it); messages handed to this daemon under its own lease."""
    with trio.fail_after(TIMEOUT):
        async with PostgresStore.open(pg_url) as store:
            bus = store.bus()
            for sid in ("queued", "dead", "expired", "late", "released", "mine", "handed"):
                await store.create_session(sid, profile_id="general")
            for owner in ("live", "late-daemon", "me"):
                await bus.heartbeat(owner, 1, "far", 60)

            async def lease(sid: str, owner: str, ttl: float) -> None:
                await store.claim_lease(sid, owner=owner, pid=1, host="far", ttl=ttl)

            await store.enqueue("queued", "k1", {"text": "x"}, pid=1, host="far")
            await lease("dead", "dead-here", 60)  # its pid gone: `dead` says so
            await lease("expired", "gone", -1)  # no daemons row: a navi run, or long gone
            await lease("late", "late-daemon", -1)  # its daemon renews its row still
            await lease("released", "live", 60)
            await store.release_lease("released", owner="live")
            await lease("mine", "me", -1)
            await lease("handed", "me", 60)
            await store.enqueue("handed", "k2", {"text": "y"}, pid=0, host="*")
            found = await bus.orphans("me", ["dead-here"])
            assert found == ["dead", "expired", "handed", "queued"], found
            # Taking one over: only while it is still that lease, once.
            got = await bus.lease("expired")
            assert got is not None
            first = await bus.take_abandoned(got[0], "me", 2, "far", 60, dead=False)
            again = await bus.take_abandoned(got[0], "other", 3, "far", 60, dead=False)
            assert (first, again) == (got[0].generation + 1, None)
            late = await bus.lease("late")
            assert late is not None
            assert await bus.take_abandoned(late[0], "me", 2, "far", 60, dead=False) is not None


class LoopBus:
    """Two daemons' channels in memory: a notification on a daemon's channel is handed
    to its `OwnerCalls`, in a task of its own, unless `deaf` (nobody answers)."""

    up = True

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.calls: dict[str, OwnerCalls] = {}
        self.deaf = False

    async def notify(self, items: Sequence[tuple[str, str]]) -> None:
        for channel, payload in items:
            target = self.calls.get(channel)
            if target is not None and not self.deaf:
                self.nursery.start_soon(target.received, json.loads(payload))

    async def live_daemons(self) -> list[tuple[str, int, str]]:
        return [("owner", 42, "far")]


class Answers:
    async def answer(
        self, session_id: str, call_id: str, *, approve: bool, scope: str, user_id: str
    ) -> None:
        if call_id == "gone":
            raise NotFoundError(f"no approval request {call_id!r} is waiting")


class Cancels:
    def cancel(self, session_id: str, task_id: str) -> bool:
        return task_id == "bt-1"


async def test_the_asking_daemon_keeps_nothing_of_an_ask_once_it_is_answered(
    autojump_clock: Any,
) -> None:
    """Approvals, task cancels and stops asked of another daemon: answered, refused,
    unanswered (the ask times out) or not asked at all (the listener down), the asker
    keeps no pending entry for them."""
    kv = MemoryKV()
    marker = {"session_id": "s-1", "task_id": "bt-1", "tool": "terminal", "pid": 42,
              "host": "far", "started": 0.0}  # fmt: skip
    await kv.kv_set(RUNNING_SCOPE, "s-1:bt-1", marker)
    with trio.fail_after(TIMEOUT * 10):
        async with trio.open_nursery() as nursery:
            bus = LoopBus(nursery)
            store = cast(SessionStore, kv)
            asker = OwnerCalls(cast(ClusterBus, bus), store, "asker", lambda o: f"nd_{o}")
            owner = OwnerCalls(cast(ClusterBus, bus), store, "owner", lambda o: f"nd_{o}")
            owner.attach(Answers(), Cancels(), lambda sid: sid == "s-1")
            bus.calls = {"nd_asker": asker, "nd_owner": owner}

            await asker.approve("owner", "s-1", "call-1", approve=True, scope="once", user_id="u-1")
            assert asker._asked == {}
            with pytest.raises(NotFoundError):
                await asker.approve(
                    "owner", "s-1", "gone", approve=False, scope="once", user_id="u-1"
                )
            assert asker._asked == {}
            answer = await asker.task("cancel", ["s-1"], "bt-1")
            assert answer == {"task_id": "bt-1", "cancelled": True}
            assert asker._asked == {}
            assert await asker.stop("owner", "s-1") is True
            assert await asker.stop("owner", "s-2") is False
            assert asker._asked == {}

            bus.deaf = True
            before = trio.current_time()
            with pytest.raises(UnavailableError, match="did not answer"):
                await asker.approve(
                    "owner", "s-1", "call-2", approve=True, scope="once", user_id="u-1"
                )
            assert trio.current_time() - before == pytest.approx(ASK_TIMEOUT_SEC)
            assert asker._asked == {}
            bus.up = False
            with pytest.raises(StorageError, match="listener is not connected"):
                await asker.stop("owner", "s-1")
            assert asker._asked == {}


async def test_an_unanswered_ask_ends_after_the_clusters_ask_timeout(
    autojump_clock: Any,
) -> None:
    """The ask timeout is the cluster's setting: a stop nobody answers is an error after
    that long, which names it (NAVI_CLUSTER_ASK_TIMEOUT_SEC reaches it through Cluster)."""
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            bus = LoopBus(nursery)
            bus.deaf = True
            leases = cast(SessionLeases, SimpleNamespace(owner="asker"))
            cluster = Cluster(
                cast(ClusterBus, bus), cast(SessionStore, MemoryKV()), leases, 60.0,
                ask_timeout=2.5,
            )  # fmt: skip
            before = trio.current_time()
            with pytest.raises(UnavailableError, match=r"did not answer within 2\.5 s"):
                await cluster.calls.stop("owner", "s-1")
            assert trio.current_time() - before == pytest.approx(2.5)


class _SlowFollowsBus:
    """What the cluster's resume reads of the bus: `follows` waits for `gate`, then
    gives the rows it had when asked (older than what was said meanwhile)."""

    def __init__(self) -> None:
        self.gate = trio.Event()

    async def follows(self) -> list[tuple[str, str]]:
        rows = [("s-old", "d-2")]
        await self.gate.wait()
        return rows


async def test_follow_notes_heard_while_the_listener_resumes_are_not_lost() -> None:
    """Back after a failure, the cluster reads who follows what again; a follow said
    on the channel meanwhile is newer than the rows it read, and kept."""
    bus = _SlowFollowsBus()
    leases = cast(SessionLeases, SimpleNamespace(owner="d-1"))
    cluster = Cluster(cast(ClusterBus, bus), cast(SessionStore, None), leases, 60.0)
    cluster._followers = {"s-gone": {"d-3"}}  # unfollowed while the listener was down
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cluster._resume)
            await trio.testing.wait_all_tasks_blocked()
            await cluster._handle("navi_follow", json.dumps({"s": "s-new", "o": "d-4", "on": True}))
            bus.gate.set()
        assert cluster._followers == {"s-old": {"d-2"}, "s-new": {"d-4"}}


class _LeaseBus:
    """What `lease_state` reads of the bus: the session's lease row and the server's now."""

    def __init__(self, lease: LeaseRow | None, now: float = 1000.0) -> None:
        self.found = None if lease is None else (lease, now)

    async def lease(self, session_id: str) -> tuple[LeaseRow, float] | None:
        return self.found


class _Releases:
    """A store that notes the rows handed on (`release_queued`)."""

    def __init__(self) -> None:
        self.released: list[list[str]] = []

    async def release_queued(self, session_id: str, keys: list[str], *, pid: int, host: str) -> int:
        self.released.append(keys)
        return len(keys)


def _cluster(bus: Any, store: Any = None) -> Cluster:
    host = socket.gethostname() or "localhost"
    leases = cast(SessionLeases, SimpleNamespace(owner="d-1", pid=os.getpid(), host=host))
    return Cluster(cast(ClusterBus, bus), cast(SessionStore, store), leases, 60.0)


async def test_a_released_lease_is_nobodys_and_no_dead_daemons_turn() -> None:
    """A lease let go (expired at 0) says nobody runs the session and no turn was left
    open; one unreleased past its time is a dead owner's; a live one names its owner."""
    host = socket.gethostname() or "localhost"
    released = LeaseRow("s1", "d-2", os.getpid(), host, 0.0, 3)
    ran_out = LeaseRow("s1", "d-2", os.getpid(), host, 999.0, 3)
    live = LeaseRow("s1", "d-2", os.getpid(), host, 1060.0, 3)
    with trio.fail_after(TIMEOUT):
        assert await _cluster(_LeaseBus(released)).lease_state("s1") == (None, None)
        assert await _cluster(_LeaseBus(ran_out)).lease_state("s1") == (None, ran_out)
        assert await _cluster(_LeaseBus(live)).lease_state("s1") == ("d-2", None)
        assert await _cluster(_LeaseBus(None)).lease_state("s1") == (None, None)


async def test_a_hand_back_with_nobody_else_running_the_session_keeps_the_rows() -> None:
    """`hand_back` leaves the rows to the daemon that runs the session now; with none (the
    lease released, or a dead owner's), it refuses and hands nothing on."""
    host = socket.gethostname() or "localhost"
    store = _Releases()
    released = LeaseRow("s1", "d-2", os.getpid(), host, 0.0, 3)
    with trio.fail_after(TIMEOUT):
        with pytest.raises(NaviError, match="no other daemon runs it"):
            await _cluster(_LeaseBus(released), store).hand_back("s1", ["k1"])
        assert store.released == []


async def test_a_daemons_own_frames_heard_back_are_not_relayed_to_its_clients() -> None:
    """A daemon listens to the sessions it runs too: a frame it published itself comes
    back on the channel and is not passed on a second time; another daemon's is."""
    relayed: list[dict[str, Any]] = []
    cluster = _cluster(SimpleNamespace())
    actor = SimpleNamespace(relay=relayed.append)
    cluster.registry = cast(Any, SimpleNamespace(actor=lambda session_id: actor))
    frame = {"type": "text_delta", "session_id": "s1", "seq": 1, "epoch": "e1", "text": "a"}
    with trio.fail_after(TIMEOUT):
        await cluster._handle(session_channel("s1"), json.dumps({"f": frame, "d": cluster._tag}))
        assert relayed == []
        await cluster._handle(session_channel("s1"), json.dumps({"f": frame, "d": "other"}))
        assert relayed == [frame]


class _Notified:
    """A bus that notes each `notify`: (frames' channels, fences, ended)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[Fence | None], list[Fence]]] = []

    async def notify(
        self,
        items: Sequence[tuple[str, str]],
        fences: Sequence[Fence | None] | None = None,
        ended: Sequence[Fence] = (),
    ) -> None:
        self.calls.append(([c for c, _ in items], list(fences or []), list(ended)))


async def test_a_turns_end_goes_out_with_its_lease_to_pay_followed_or_not() -> None:
    """`tap`: a top-level turn's end said under a lease goes through the outbox, with its
    frame when another daemon follows the session and as the lease's mark alone when
    none does; a sub-agent's end or a frame of a session nobody follows goes nowhere; a
    dead owner's end said under the hold taken over carries that hold's fence, and only
    for its own session. The bus gets the frames with their own fences, in order."""
    bus = _Notified()
    cluster = _cluster(bus)
    alone, followed = Fence("s-alone", "d-1", 3), Fence("s-followed", "d-1", 5)
    actors = {
        "s-alone": SimpleNamespace(frame_fence=lambda: alone),
        "s-followed": SimpleNamespace(frame_fence=lambda: followed),
    }
    cluster.registry = cast(Any, SimpleNamespace(actor=actors.get))
    cluster._followers = {"s-followed": {"d-2"}}
    publish = cluster.tap(lambda event, sid, seq, epoch: {"type": "x", "session_id": sid})
    publish(StreamEnd(), "s-alone", 1, "e")
    publish(StreamEnd(is_subagent=True), "s-alone", 2, "e")
    publish(TextDelta(text="hi"), "s-alone", 3, "e")
    publish(TextDelta(text="hi"), "s-followed", 1, "e")
    publish(StreamEnd(), "s-followed", 2, "e")
    with fenced(Fence("s-taken", "d-1", 7)):  # a hold of another session
        publish(StreamEnd(), "s-no-actor", 1, "e")
    taken = Fence("s-no-actor", "d-1", 8)
    with fenced(taken):  # the dead owner's turn, ended under the hold taken over
        publish(StreamEnd(), "s-no-actor", 2, "e")
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cluster._publisher)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    channel = session_channel("s-followed")
    assert bus.calls == [([channel, channel], [followed, followed], [alone, followed, taken])]
