"""The PostgreSQL store's message bus: ``LISTEN`` / ``NOTIFY`` between daemons.

    bus = store.bus()                         # a PgBus (the SQLite store has none)
    bus.on_message(callback)                  # callback(channel, payload), in trio
    async with bus.listening():               # the listener connection, until the block ends
        await bus.listen("ns_…")              # returns once the server has it
        await bus.notify([("nd_…", "{…}")])   # in one transaction, in order

One connection of its own (not the pool's: a pooled connection goes back, and its
``LISTEN`` with it) listens, on a thread of its own that blocks in psycopg's
`notifies()`. To change what it listens to, `listen` / `unlisten` queue the command and
wake the thread with a notification on the listener's own wake channel (sent from the
pool); the thread runs the command and sets the caller's event. Each notification
reaches trio through `TrioToken.run_sync_soon`: the thread never waits for trio.

A payload longer than `NOTIFY_MAX` bytes (NOTIFY's limit is 8000) is stored in the
``frames`` table and the notification carries ``{"ref": id}``; `fetch_frame` reads it
back. Rows older than `FRAME_KEEP_S` are deleted by the next large notify. A payload
sent with a fence (a frame of a run: core/cluster.py) goes out only if the session's
lease row still names that owner and generation, checked in the statement that sends
it: a run taken over under it reaches nobody, even before it knows.

The cluster's bookkeeping (the ``daemons``, ``follows`` and ``leases`` rows the cluster
reads: core/cluster.py) is here too, one function per statement, run on the store's
workers.
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

import psycopg
import trio

from navi_trio.errors import StoreError
from navi_trio.store.fence import Fence
from navi_trio.store.postgres._tables import text_array
from navi_trio.store.postgres._workers import Conn

T = TypeVar("T")


class _Jobs(Protocol):
    """What the bus needs of its store (`PostgresStore._run`): a job on its workers."""

    async def _run(
        self, op: str, fn: Callable[[Conn], T], *, durable: bool = True, write: bool = True,
        transaction: bool = True,
    ) -> T: ...  # fmt: skip


log = logging.getLogger(__name__)

NOTIFY_MAX = 7900  # bytes of one payload; more goes through the frames table
FRAME_KEEP_S = 300.0
LISTEN_WAIT_S = 10.0
DAEMON_KEEP_S = 7 * 86400.0  # a dead daemon's row: how long its queued rows stay adoptable
_NOW = "extract(epoch FROM clock_timestamp())"


class PgBus:
    """LISTEN / NOTIFY for one daemon, over `store`'s database (see the module)."""

    def __init__(self, store: _Jobs, url: str) -> None:
        self._store = store
        self._url = url
        self._wake = "nw_" + secrets.token_hex(10)
        self._commands: queue.SimpleQueue[tuple[str, str, Callable[[], None]] | None] = (
            queue.SimpleQueue()
        )
        self._callback: Callable[[str, str], None] = lambda channel, payload: None
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    def on_message(self, callback: Callable[[str, str], None]) -> None:
        self._callback = callback

    @asynccontextmanager
    async def listening(self) -> AsyncIterator[None]:
        token = trio.lowlevel.current_trio_token()
        conn = await trio.to_thread.run_sync(self._connect)
        ready = trio.Event()
        self._thread = threading.Thread(
            target=self._main, args=(conn, token, ready.set), name="navi-bus", daemon=True
        )
        self._thread.start()
        try:
            with trio.fail_after(LISTEN_WAIT_S):
                await ready.wait()
            yield
        finally:
            self._commands.put(None)
            with trio.CancelScope(shield=True):
                try:
                    await self._store._run("wake the listener", self._wake_job, write=False)
                except StoreError:
                    pass
                thread = self._thread
                await trio.to_thread.run_sync(thread.join, LISTEN_WAIT_S)
                if thread.is_alive():  # stuck on a dead server: its socket goes with it
                    await trio.to_thread.run_sync(conn.close)

    def _connect(self) -> Conn:
        conn: Conn = psycopg.connect(self._url, autocommit=True, application_name="navi bus")
        conn.execute(f"LISTEN {self._wake}")
        return conn

    def _main(self, conn: Conn, token: trio.lowlevel.TrioToken, ready: Callable[[], None]) -> None:
        token.run_sync_soon(ready)
        try:
            while True:
                for note in conn.notifies():
                    if note.channel == self._wake:
                        break
                    token.run_sync_soon(self._callback, note.channel, note.payload)
                while True:  # the commands queued before the wake
                    try:
                        command = self._commands.get_nowait()
                    except queue.Empty:
                        break
                    if command is None:
                        return
                    verb, channel, done = command
                    conn.execute(f"{verb} {channel}")  # channel names are ours: ns_/nd_ + hex
                    token.run_sync_soon(done)
        except (psycopg.Error, trio.RunFinishedError) as exc:
            self._failed = exc
            log.warning("the cluster's listener connection failed: %s", exc)
        finally:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def _wake_job(self, conn: Conn) -> None:
        conn.execute("SELECT pg_notify(%s, '')", [self._wake])

    async def _command(self, verb: str, channel: str) -> None:
        if self._failed is not None:
            raise StoreError(f"the cluster's listener is down: {self._failed}")
        done = trio.Event()
        self._commands.put((verb, channel, done.set))
        await self._store._run(f"{verb.lower()} {channel}", self._wake_job, write=False)
        with trio.fail_after(LISTEN_WAIT_S):
            await done.wait()

    async def listen(self, channel: str) -> None:
        await self._command("LISTEN", channel)

    async def unlisten(self, channel: str) -> None:
        await self._command("UNLISTEN", channel)

    async def notify(
        self, items: Sequence[tuple[str, str]], fences: Sequence[Fence | None] | None = None
    ) -> None:
        """Send every (channel, payload) in one transaction, in order, each with a fence
        only while its lease holds (see the module)."""
        held: list[Fence | None] = list(fences) if fences is not None else [None] * len(items)
        small = all(len(p) <= NOTIFY_MAX // 4 or len(p.encode()) <= NOTIFY_MAX for _, p in items)
        if small:
            channels, payloads = [c for c, _ in items], [p for _, p in items]
            await self._store._run(
                "notify the cluster",
                lambda c: _notify(c, channels, payloads, held),
                durable=False,
            )
            return
        await self._store._run(
            "notify the cluster (large frames)",
            lambda c: _notify_large(c, items, held),
            durable=False,
        )

    async def fetch_frame(self, ref: int) -> str | None:
        return await self._store._run(
            f"read frame {ref}", lambda c: _fetch_frame(c, ref), write=False
        )

    # -- the cluster's rows ---------------------------------------------------------------

    async def heartbeat(self, owner: str, pid: int, host: str, ttl: float) -> None:
        await self._store._run(
            "renew this daemon's row", lambda c: _heartbeat(c, owner, pid, host, ttl)
        )

    async def leave(self, owner: str) -> None:
        await self._store._run("remove this daemon's row", lambda c: _leave(c, owner))

    async def live_daemons(self) -> list[tuple[str, int, str]]:
        """(owner, pid, host) of every daemon whose row has not expired."""
        return await self._store._run("list live daemons", _live_daemons, write=False)

    async def follow(self, session_id: str, owner: str, follow: bool) -> None:
        await self._store._run(
            f"{'follow' if follow else 'unfollow'} {session_id!r}",
            lambda c: _follow(c, session_id, owner, follow),
        )

    async def follows(self) -> list[tuple[str, str]]:
        """(session_id, owner) of every follow of a live daemon."""
        return await self._store._run("list follows", _follows, write=False)

    async def live_holder(self, session_id: str) -> tuple[str, int, str] | None:
        """(owner, pid, host) of the session's lease while it has not expired, else None."""
        return await self._store._run(
            f"read the lease of {session_id!r}", lambda c: _live_holder(c, session_id),
            write=False,
        )  # fmt: skip

    async def take_slot(
        self, key: str, kind: str, owner: str, claims: Sequence[tuple[str, int]],
        rate: tuple[str, int, float] | None = None,
    ) -> str | None:  # fmt: skip
        """Take slot `key` in every (scope, cap) of `claims` unless one is full (counting
        the live daemons' slots), and unless `rate` (scope, limit, window s) saw `limit`
        starts in the window; None when taken, else the scope (or "rate") that refused."""
        return await self._store._run(
            f"take a {kind} slot", lambda c: _take_slot(c, key, kind, owner, claims, rate)
        )

    async def free_slot(self, key: str, *, keep: bool) -> None:
        """Release it (`keep`: the row stays, released, for rate windows)."""
        await self._store._run("free a slot", lambda c: _free_slot(c, key, keep))

    async def orphaned_queues(self) -> list[str]:
        """Sessions with queued messages whose lease is not live: nobody runs them."""
        return await self._store._run("list orphaned queues", _orphaned_queues, write=False)


# A fenced payload's condition: the lease row still names its owner and generation.
_HOLDS = (
    "EXISTS (SELECT 1 FROM leases l WHERE l.session_id = {s} AND l.owner = {o}"
    " AND l.generation = {g})"
)


def _notify(
    conn: Conn, channels: list[str], payloads: list[str], fences: list[Fence | None]
) -> None:
    holds = _HOLDS.format(s="t.s", o="t.o", g="t.g")
    conn.execute(
        "SELECT pg_notify(t.c, t.p) FROM unnest(%s::text[], %s::text[], %s::text[],"
        " %s::text[], %s::bigint[]) WITH ORDINALITY AS t(c, p, s, o, g, n)"
        f" WHERE t.o IS NULL OR {holds} ORDER BY t.n",
        [text_array(channels), text_array(payloads),
         text_array(f.session_id if f else None for f in fences),
         text_array(f.owner if f else None for f in fences),
         text_array(str(f.generation) if f else None for f in fences)],
    )  # fmt: skip


def _notify_large(conn: Conn, items: Sequence[tuple[str, str]], fences: list[Fence | None]) -> None:
    now = time.time()
    holds = "SELECT " + _HOLDS.format(s="%s", o="%s", g="%s")
    for (channel, payload), fence in zip(items, fences, strict=True):
        if fence is not None:
            found = conn.execute(holds, [fence.session_id, fence.owner, fence.generation])
            if not (found.fetchone() or (False,))[0]:
                continue
        if len(payload.encode()) > NOTIFY_MAX:
            row = conn.execute(
                "INSERT INTO frames (session_id, data, created_at) VALUES (%s, %s, %s)"
                " RETURNING id",
                [channel, payload, now],
            ).fetchone()
            assert row is not None
            payload = json.dumps({"ref": int(row[0])})
        conn.execute("SELECT pg_notify(%s, %s)", [channel, payload])
    conn.execute("DELETE FROM frames WHERE created_at < %s", [now - FRAME_KEEP_S])


def _fetch_frame(conn: Conn, ref: int) -> str | None:
    row = conn.execute("SELECT data FROM frames WHERE id = %s", [ref]).fetchone()
    return None if row is None else str(row[0])


def _heartbeat(conn: Conn, owner: str, pid: int, host: str, ttl: float) -> None:
    conn.execute(
        "INSERT INTO daemons (owner, pid, host, started_at, expires_at)"
        f" VALUES (%s, %s, %s, {_NOW}, {_NOW} + %s) ON CONFLICT (owner)"
        " DO UPDATE SET expires_at = excluded.expires_at",
        [owner, pid, host, ttl],
    )
    conn.execute(f"DELETE FROM daemons WHERE expires_at < {_NOW} - %s", [DAEMON_KEEP_S])


def _leave(conn: Conn, owner: str) -> None:
    # Expired, not deleted: what it left queued is anyone's now (_tables.adopt).
    conn.execute("DELETE FROM follows WHERE owner = %s", [owner])
    conn.execute("DELETE FROM slots WHERE owner = %s", [owner])
    conn.execute("UPDATE daemons SET expires_at = 0 WHERE owner = %s", [owner])


def _live_daemons(conn: Conn) -> list[tuple[str, int, str]]:
    rows = conn.execute(f"SELECT owner, pid, host FROM daemons WHERE expires_at > {_NOW}")
    return [(str(r[0]), int(r[1]), str(r[2])) for r in rows]


def _follow(conn: Conn, sid: str, owner: str, follow: bool) -> None:
    if follow:
        conn.execute(
            "INSERT INTO follows (session_id, owner) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            [sid, owner],
        )
    else:
        conn.execute("DELETE FROM follows WHERE session_id = %s AND owner = %s", [sid, owner])


def _follows(conn: Conn) -> list[tuple[str, str]]:
    rows = conn.execute(
        "SELECT f.session_id, f.owner FROM follows f JOIN daemons d ON d.owner = f.owner"
        f" WHERE d.expires_at > {_NOW}"
    )
    return [(str(r[0]), str(r[1])) for r in rows]


def _live_holder(conn: Conn, sid: str) -> tuple[str, int, str] | None:
    row = conn.execute(
        f"SELECT owner, pid, host FROM leases WHERE session_id = %s AND expires_at > {_NOW}",
        [sid],
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]), str(row[2]))


SLOT_KEEP_S = 3600.0  # released slots kept for rate windows this long at most


def _take_slot(
    conn: Conn, key: str, kind: str, owner: str, claims: Sequence[tuple[str, int]],
    rate: tuple[str, int, float] | None,
) -> str | None:  # fmt: skip
    # One count at a time per scope, across daemons: a lock per (kind, scope), in order.
    for scope in sorted({s for s, _ in claims} | ({rate[0]} if rate else set())):
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 7))", [f"{kind}/{scope}"])
    for scope, cap in claims:
        row = conn.execute(
            "SELECT count(*) FROM slots s JOIN daemons d ON d.owner = s.owner"
            f" WHERE s.kind = %s AND s.scope = %s AND NOT s.released AND d.expires_at > {_NOW}",
            [kind, scope],
        ).fetchone()
        if row is not None and int(row[0]) >= cap:
            return scope
    if rate is not None:
        scope, limit, window = rate
        row = conn.execute(
            "SELECT count(*) FROM slots WHERE kind = %s AND scope = %s"
            f" AND started_at > {_NOW} - %s",
            [kind, scope, window],
        ).fetchone()
        if row is not None and int(row[0]) >= limit:
            return "rate"
    for scope, _ in claims:
        conn.execute(
            "INSERT INTO slots (key, kind, scope, owner, started_at)"
            f" VALUES (%s, %s, %s, %s, {_NOW})",
            [key, kind, scope, owner],
        )
    conn.execute(
        f"DELETE FROM slots WHERE kind = %s AND released AND started_at < {_NOW} - %s",
        [kind, SLOT_KEEP_S],
    )
    return None


def _free_slot(conn: Conn, key: str, keep: bool) -> None:
    if keep:
        conn.execute("UPDATE slots SET released = true WHERE key = %s", [key])
    else:
        conn.execute("DELETE FROM slots WHERE key = %s", [key])


def _orphaned_queues(conn: Conn) -> list[str]:
    rows = conn.execute(
        "SELECT DISTINCT q.session_id FROM queued q LEFT JOIN leases l"
        f" ON l.session_id = q.session_id AND l.expires_at > {_NOW}"
        " WHERE l.session_id IS NULL ORDER BY 1"
    )
    return [str(r[0]) for r in rows]
