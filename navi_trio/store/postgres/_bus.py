"""The PostgreSQL store's message bus: ``LISTEN`` / ``NOTIFY`` between daemons.

    bus = store.bus()                         # a PgBus (the SQLite store has none)
    bus.on_message(callback)                  # callback(channel, payload), in trio
    bus.on_reconnect(resume)                  # the listener is back after a failure
    async with bus.listening():               # the listener, until the block ends
        await bus.listen("ns_…")              # returns once the server has it
        await bus.notify([("nd_…", "{…}")])   # in one transaction, in order

The listener is an actor (`listening` runs it in a nursery of its own): one connection
of its own (not the pool's: a pooled connection goes back, and its ``LISTEN`` with it)
and a thread that blocks on it in psycopg's `notifies()`. Each notification reaches
trio through `TrioToken.run_sync_soon`: the thread never waits for trio. To change what
it listens to, `listen` / `unlisten` queue the command and wake the thread with a
notification on the listener's own wake channel (sent from the pool); the thread runs
the command and sets the caller's event.

When the connection fails (the server restarted, the backend terminated, a network
cut that TCP keepalives reveal), the thread ends, the commands it had not run fail,
and the actor connects again after a backoff (`RECONNECT_FIRST_S`, doubling up to
`RECONNECT_MAX_S`; back to the first after a connection that lasted `STABLE_S`),
``LISTEN``s again to every channel listened to, and calls `on_reconnect`: what
arrived meanwhile is lost, so the cluster makes every follower resync and looks again
for what it may have been told (core/cluster/cluster.py). While it is down, `listen` raises
`StorageError` (the wire's ``storage``: the server cannot be reached) and `up` is false.

A payload longer than `NOTIFY_MAX` bytes (NOTIFY's limit is 8000) is stored in the
``frames`` table and the notification carries ``{"ref": id}``; `fetch_frame` reads it
back. Rows older than `FRAME_KEEP_S` are deleted by the next large notify. A payload
sent with a fence (a frame of a run: core/cluster/cluster.py) goes out only if the session's
lease row still names that owner and generation, checked in the statement that sends
it: a run taken over under it reaches nobody, even before it knows.

The cluster's bookkeeping (the ``daemons``, ``follows`` and ``leases`` rows the cluster
reads: core/cluster/cluster.py) is here too, one function per statement, run on the store's
workers.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict

from navi_trio.backoff import backoff_delay
from navi_trio.errors import StorageError, StoreError
from navi_trio.store.base import LeaseRow
from navi_trio.store.fence import Fence
from navi_trio.store.postgres._errors import failure
from navi_trio.store.postgres._tables import text_array
from navi_trio.store.postgres._workers import Conn

if TYPE_CHECKING:  # _core imports this module
    from navi_trio.store.postgres._core import _Core


log = logging.getLogger(__name__)

NOTIFY_MAX = 7900  # bytes of one payload; more goes through the frames table
FRAME_KEEP_S = 300.0
LISTEN_WAIT_S = 10.0
RECONNECT_FIRST_S = 0.2
RECONNECT_MAX_S = 10.0
STABLE_S = 30.0  # a listener connection that lasted this long: the next backoff starts over
# TCP keepalives of the listener's connection (unless the URL sets them): a silent cut
# (no FIN, no RST) is a failure after ~30 s instead of a listener deaf for ever.
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 15,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
CONNECT_TIMEOUT_S = 10  # libpq's connect_timeout for the listener, unless the URL sets one
DAEMON_KEEP_S = 7 * 86400.0  # a dead daemon's row: how long its queued rows stay adoptable
_NOW = "extract(epoch FROM clock_timestamp())"


@attrs.define(eq=False)
class _Command:
    """A LISTEN or UNLISTEN for the listener's thread; `done` once run or failed."""

    verb: str
    channel: str
    done: trio.Event = attrs.Factory(trio.Event)
    error: StoreError | None = None


class _Link:
    """One listener connection and the thread that blocks on it; `lost` once it ended."""

    def __init__(
        self, conn: Conn, wake: str, deliver: Callable[[str, str], None], where: str
    ) -> None:
        self.conn = conn
        self.wake = wake
        self.deliver = deliver
        self.where = where
        self.token = trio.lowlevel.current_trio_token()
        self.commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self.lost = trio.Event()
        self.error: BaseException | None = None
        self.closing = False  # ended on purpose: no warning
        self.began = trio.current_time()
        self._closed = False
        self._close_lock = threading.Lock()  # the fd is ours to shut down until closed
        self.thread = threading.Thread(target=self._main, name="navi-bus", daemon=True)

    def _main(self) -> None:
        running: _Command | None = None
        try:
            while True:
                woke = False
                # One batch at a time: every notification of a batch is handed on,
                # those after a wake-up in the same packet too.
                for note in self.conn.notifies(stop_after=1):
                    if note.channel == self.wake:
                        woke = True
                    else:
                        self.token.run_sync_soon(self.deliver, note.channel, note.payload)
                while woke:
                    try:
                        running = self.commands.get_nowait()
                    except queue.Empty:
                        break
                    # Channel names are ours: ns_ / nd_ / nw_ + hex, navi_follow.
                    self.conn.execute(f"{running.verb} {running.channel}")
                    self.token.run_sync_soon(running.done.set)
                    running = None
        except psycopg.Error as exc:
            self.error = exc
        except trio.RunFinishedError:
            pass
        finally:
            with self._close_lock:
                self._closed = True
                try:
                    self.conn.close()
                except psycopg.Error:
                    pass
            try:
                self.token.run_sync_soon(self._ended, running)
            except trio.RunFinishedError:
                pass

    def _ended(self, running: _Command | None) -> None:
        """In trio, once the thread is over: every command it did not run fails."""
        error = StorageError(f"the cluster's listener connection to {self.where} failed")
        left = [running] if running is not None else []
        while True:
            try:
                left.append(self.commands.get_nowait())
            except queue.Empty:
                break
        for command in left:
            command.error = error
            command.done.set()
        self.lost.set()

    def cut(self) -> None:
        """End the thread's wait at once (a blocking call: run it on a thread)."""
        with self._close_lock:
            if self._closed:
                return
            fd = os.dup(self.conn.fileno())
        try:
            with socket.socket(fileno=fd) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class PgBus:
    """LISTEN / NOTIFY for one daemon, over `store`'s database (see the module)."""

    def __init__(self, store: _Core, url: str) -> None:
        self._store = store
        self._url = url
        self._wake = "nw_" + secrets.token_hex(10)
        self._callback: Callable[[str, str], None] = lambda channel, payload: None
        self._on_reconnect: Callable[[], None] = lambda: None
        self._channels: set[str] = set()  # listened to: listened again on a new connection
        self._link: _Link | None = None
        self.reconnects = 0

    def on_message(self, callback: Callable[[str, str], None]) -> None:
        self._callback = callback

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        """`callback()` each time the listener is back after a failure (in trio)."""
        self._on_reconnect = callback

    @property
    def up(self) -> bool:
        """Whether the listener hears notifications now."""
        return self._link is not None and not self._link.lost.is_set()

    @asynccontextmanager
    async def listening(self) -> AsyncIterator[None]:
        """The listener, kept up until the block ends; the first connection must work."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._keep)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()

    async def _keep(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The actor: connect, hand on notifications until the connection fails, again."""
        link = await self._open()
        task_status.started()
        tries = 0  # since the last connection that lasted STABLE_S

        def delay(attempt: int) -> float:
            return backoff_delay(attempt, base=RECONNECT_FIRST_S, cap=RECONNECT_MAX_S)

        try:
            while True:
                await link.lost.wait()
                self._link = None
                log.warning(
                    "the cluster's listener connection failed (%s); connecting again",
                    link.error or "ended",
                )
                if trio.current_time() - link.began >= STABLE_S:
                    tries = 0
                while self._link is None:
                    tries += 1
                    await trio.sleep(delay(tries))
                    try:
                        link = await self._open()
                    except StoreError as exc:
                        next_in = delay(tries + 1)
                        log.info("the cluster's listener: %s; next try in %g s", exc, next_in)
                self.reconnects += 1
                log.warning("the cluster's listener is connected again")
                self._on_reconnect()
        finally:
            with trio.CancelScope(shield=True):
                await self._close(link)

    async def _open(self) -> _Link:
        channels = sorted(self._channels | {self._wake})
        try:
            conn = await trio.to_thread.run_sync(self._connect, channels, abandon_on_cancel=True)
        except psycopg.Error as exc:
            raise failure("connect the cluster's listener", self._store.where, exc)[0] from exc
        link = _Link(conn, self._wake, self._deliver, self._store.where)
        link.thread.start()
        self._link = link
        return link

    def _connect(self, channels: list[str]) -> Conn:
        given = conninfo_to_dict(self._url)
        extra: dict[str, Any] = {k: v for k, v in KEEPALIVES.items() if k not in given}
        if "connect_timeout" not in given:
            extra["connect_timeout"] = CONNECT_TIMEOUT_S
        if "application_name" not in given:
            extra["application_name"] = f"navi bus {os.getpid()}"
        conn: Conn = psycopg.connect(self._url, autocommit=True, **extra)
        try:
            for channel in channels:
                conn.execute(f"LISTEN {channel}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _deliver(self, channel: str, payload: str) -> None:
        self._callback(channel, payload)

    async def _close(self, link: _Link) -> None:
        link.closing = True
        if not link.lost.is_set():
            await trio.to_thread.run_sync(link.cut)
            with trio.move_on_after(LISTEN_WAIT_S):
                await link.lost.wait()

    def _wake_job(self, conn: Conn) -> None:
        conn.execute("SELECT pg_notify(%s, '')", [self._wake])

    async def _command(self, verb: str, channel: str) -> None:
        link = self._link
        if link is None or link.lost.is_set():
            if verb == "UNLISTEN":  # not listening to anything now: nothing to undo
                self._channels.discard(channel)
                return
            raise StorageError(
                f"the cluster's listener is not connected to {self._store.where} (it is "
                "connecting again): try again shortly"
            )
        command = _Command(verb, channel)
        link.commands.put(command)
        await self._store._run(f"{verb.lower()} {channel}", self._wake_job, write=False)
        with trio.move_on_after(LISTEN_WAIT_S):
            await command.done.wait()
        if not command.done.is_set():
            raise StorageError(
                f"the cluster's listener did not answer {verb} within {LISTEN_WAIT_S:g} s"
            )
        if command.error is not None:
            raise command.error
        if verb == "LISTEN":
            self._channels.add(channel)
        else:
            self._channels.discard(channel)

    async def listen(self, channel: str) -> None:
        await self._command("LISTEN", channel)

    async def unlisten(self, channel: str) -> None:
        await self._command("UNLISTEN", channel)

    async def notify(
        self,
        items: Sequence[tuple[str, str]],
        fences: Sequence[Fence | None] | None = None,
        ended: Sequence[Fence] = (),
    ) -> None:
        """Send every (channel, payload) in one transaction, in order, each with a fence
        only while its lease holds (see the module). `ended`: the leases whose turn's end
        is among them (or went to no other daemon): each owes it no more, in the same
        transaction, while it is still the fence's (store/base.py `end_owed`)."""
        held: list[Fence | None] = list(fences) if fences is not None else [None] * len(items)
        said = list(ended)
        small = all(len(p) <= NOTIFY_MAX // 4 or len(p.encode()) <= NOTIFY_MAX for _, p in items)

        def send(conn: Conn) -> None:
            if small:
                _notify(conn, [c for c, _ in items], [p for _, p in items], held)
            else:
                _notify_large(conn, items, held)
            _ends_said(conn, said)

        what = "notify the cluster" if small else "notify the cluster (large frames)"
        await self._store._run(what, send, durable=False)

    async def fetch_frame(self, ref: int) -> str | None:
        return await self._store._run(
            f"read frame {ref}", lambda c: _fetch_frame(c, ref), write=False
        )

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

    async def lease(self, session_id: str) -> tuple[LeaseRow, float] | None:
        """The session's lease row (`expires_at` 0: released) and the server's clock now,
        or None when it never had one."""
        return await self._store._run(
            f"read the lease of {session_id!r}", lambda c: _lease(c, session_id), write=False
        )

    async def take_slot(
        self,
        key: str,
        kind: str,
        owner: str,
        claims: Sequence[tuple[str, int]],
        rate: tuple[str, int, float] | None = None,
    ) -> str | None:
        """Take slot `key` in every (scope, cap) of `claims` unless one is full (counting
        the live daemons' slots), and unless `rate` (scope, limit, window s) saw `limit`
        starts in the window; None when taken, else the scope (or "rate") that refused."""
        return await self._store._run(
            f"take a {kind} slot", lambda c: _take_slot(c, key, kind, owner, claims, rate)
        )

    async def free_slot(self, key: str, *, keep: bool) -> None:
        """Release it (`keep`: the row stays, released, for rate windows)."""
        await self._store._run("free a slot", lambda c: _free_slot(c, key, keep))

    async def take_abandoned(
        self, lease: LeaseRow, owner: str, pid: int, host: str, ttl: float, *, dead: bool
    ) -> int | None:
        """Take over `lease` as `owner` if it is still that lease, unreleased, and dead
        (expired, or `dead`: its pid is gone); the new generation, else None. Never
        takes a lease another owner claimed, renewed or released meanwhile."""
        return await self._store._run(
            f"take over the lease of {lease.session_id!r}",
            lambda c: _take_abandoned(c, lease, owner, pid, host, ttl, dead),
        )

    async def orphans(self, owner: str, dead: Sequence[str]) -> list[str]:
        """Sessions for daemon `owner` to look at, `dead` naming owners known dead though
        their rows have not expired (their pid is gone): those with queued messages and
        no live lease (nobody runs them), those whose lease a dead owner never released
        (its turn died with it: `dead`, or expired with no live ``daemons`` row, so a
        daemon late to renew one lease is left alone), and those with messages handed to
        `owner` under its own lease (their notification may have been missed)."""
        return await self._store._run(
            "list orphaned sessions", lambda c: _orphans(c, owner, list(dead)), write=False
        )


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
        [
            text_array(channels),
            text_array(payloads),
            text_array(f.session_id if f else None for f in fences),
            text_array(f.owner if f else None for f in fences),
            text_array(str(f.generation) if f else None for f in fences),
        ],
    )


def _ends_said(conn: Conn, fences: list[Fence]) -> None:
    """These leases' turns' ends are said: none of them owes its end any more."""
    if not fences:
        return
    conn.execute(
        "UPDATE leases l SET end_owed = false FROM unnest(%s::text[], %s::text[],"
        " %s::bigint[]) AS t(s, o, g) WHERE l.session_id = t.s AND l.owner = t.o"
        " AND l.generation = t.g AND l.end_owed",
        [
            text_array(f.session_id for f in fences),
            text_array(f.owner for f in fences),
            text_array(str(f.generation) for f in fences),
        ],
    )


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


def _lease(conn: Conn, sid: str) -> tuple[LeaseRow, float] | None:
    row = conn.execute(
        f"SELECT owner, pid, host, expires_at, generation, {_NOW} FROM leases"
        " WHERE session_id = %s",
        [sid],
    ).fetchone()
    if row is None:
        return None
    lease = LeaseRow(
        session_id=sid,
        owner=str(row[0]),
        pid=int(row[1]),
        host=str(row[2]),
        expires_at=float(row[3]),
        generation=int(row[4]),
    )
    return lease, float(row[5])


SLOT_KEEP_S = 3600.0  # released slots kept for rate windows this long at most


def _take_slot(
    conn: Conn,
    key: str,
    kind: str,
    owner: str,
    claims: Sequence[tuple[str, int]],
    rate: tuple[str, int, float] | None,
) -> str | None:
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


def _take_abandoned(
    conn: Conn, lease: LeaseRow, owner: str, pid: int, host: str, ttl: float, dead: bool
) -> int | None:
    row = conn.execute(
        f"UPDATE leases SET owner = %s, pid = %s, host = %s, expires_at = {_NOW} + %s,"
        " generation = generation + 1 WHERE session_id = %s AND owner = %s"
        " AND generation = %s AND expires_at = %s AND expires_at <> 0"
        f" AND (expires_at <= {_NOW} OR %s) RETURNING generation",
        [
            owner,
            pid,
            host,
            ttl,
            lease.session_id,
            lease.owner,
            lease.generation,
            lease.expires_at,
            dead,
        ],
    ).fetchone()
    return None if row is None else int(row[0])


def _orphans(conn: Conn, owner: str, dead: list[str]) -> list[str]:
    # A live lease: not released (0), not expired, its owner not known dead.
    live = f"l.expires_at > {_NOW} AND NOT l.owner = ANY(%s::text[])"
    rows = conn.execute(
        "SELECT q.session_id FROM queued q LEFT JOIN leases l"
        f" ON l.session_id = q.session_id AND {live} WHERE l.session_id IS NULL"
        " UNION SELECT l.session_id FROM leases l WHERE l.expires_at <> 0 AND l.owner <> %s"
        f" AND (l.owner = ANY(%s::text[]) OR l.expires_at <= {_NOW} AND NOT EXISTS"
        f" (SELECT 1 FROM daemons d WHERE d.owner = l.owner AND d.expires_at > {_NOW}))"
        " UNION SELECT q.session_id FROM queued q JOIN leases l ON l.session_id = q.session_id"
        f" WHERE q.pid = 0 AND l.owner = %s AND {live} ORDER BY 1",
        [text_array(dead), owner, text_array(dead), owner, text_array(dead)],
    )
    return [str(r[0]) for r in rows]
