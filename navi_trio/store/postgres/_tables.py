"""Leases, queued messages and stats on PostgreSQL, on a worker thread; `PG`, the engine
under the shared statements (store/statements.py).

Each function runs inside the job's transaction (`_workers.Job`). The rules are the
SQLite store's, made safe for several daemons writing at once: a claim inserts or locks
the lease row before it decides, an adoption locks the queued rows it looks at, a
reservation locks its keys' usage rows, a wake-up its session's row, and creating a
session under the user's limit takes an advisory lock on the user first.

Lease and hold times are the server's clock (``clock_timestamp()``), not the daemon's:
daemons on several machines then agree on when a lease has run out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import psycopg

from navi_trio.errors import StoreError
from navi_trio.store.base import HANDED_PID, USAGE_KINDS, USERS_CHANNEL, KeyClaim, LeaseRow
from navi_trio.store.fence import Fence, lost, pid_alive, takeover
from navi_trio.store.postgres._workers import Conn
from navi_trio.store.statements import LEASE_COLS, Engine, lease_from

T = TypeVar("T")
TABLES = ("sessions", "messages", "context", "kv", "users")
_NOW = "extract(epoch FROM clock_timestamp())"


def text_array(values: Iterable[str | None]) -> str:
    """A text[] literal, for a parameter cast ``%s::text[]``: each element quoted (so
    ``NULL`` or ``{}`` stay text), its backslashes and double quotes escaped; None is
    NULL. Written here, not left to psycopg's list adapter, which escapes each element
    with a regular expression: most of an append's Python work (the history's rows,
    `_history._columns`) and of a batch of frames published (`_bus`)."""
    quoted = (
        "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for v in values
    )
    return "{" + ",".join(quoted) + "}"


FENCE_LOST = "NV001"  # navi_fence's SQLSTATE (migrations/0002)


def check_fence(conn: Conn, fence: Fence | None) -> None:
    """A fenced write's first statement: NV001 when lost (navi_append calls it itself)."""
    if fence is not None:
        conn.execute(
            "SELECT navi_fence(%s, %s, %s)", [fence.session_id, fence.owner, fence.generation]
        )


def fenced(fence: Fence | None, fn: Callable[[Conn], T]) -> Callable[[Conn], T]:
    """`fn` with navi_fence's refusal raised as LeaseLostError (store/fence.py)."""

    def job(conn: Conn) -> T:
        try:
            return fn(conn)
        except psycopg.Error as exc:
            if fence is not None and exc.sqlstate == FENCE_LOST:
                raise lost(fence, None) from None
            raise

    return job


class PgEngine(Engine):
    """PostgreSQL under the shared statements: ``%s``; a job is already one transaction
    (`_workers.Job`); the fence is navi_fence (migrations/0002)."""

    mark = "%s"
    seq = "seq"
    size = "octet_length"  # a stored value's length, without reading its data
    for_update = " FOR UPDATE"
    clock = _NOW  # lease and hold times are the server's clock

    def at(self, now: float) -> list[float]:
        return []

    def flag(self, value: bool) -> object:
        return value

    def any_of(self, column: str, values: list[str]) -> tuple[str, list[Any]]:
        return f"{column} = ANY(%s)", [values]

    def write(self, conn: Conn) -> AbstractContextManager[object]:
        return nullcontext()

    def check_fence(self, conn: Conn, fence: Fence | None) -> None:
        check_fence(conn, fence)

    def lock_session(self, conn: Conn, sid: str) -> None:
        """Lock the session's row for this transaction; StoreError when there is none."""
        self.hold_session(conn, sid)

    def count_sessions_locked(self, conn: Conn, user_id: str) -> int:
        """Counted under a lock on the user held to the commit (an advisory lock)."""
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 11))", [f"sessions/{user_id}"]
        )
        return self.count_sessions(conn, user_id)

    def lock_usage(self, conn: Conn, keys: list[str], now: float) -> None:
        """``SELECT ... FOR UPDATE``, the rows made first when missing: a second reserver
        of the same key on any daemon waits for the first one's commit."""
        zeros = ", ".join("0" for _ in USAGE_KINDS)
        for key in keys:
            conn.execute(
                f"INSERT INTO usage (key, {', '.join(USAGE_KINDS)}, updated_at)"
                f" VALUES (%s, {zeros}, %s) ON CONFLICT (key) DO NOTHING",
                [key, now],
            )
        conn.execute("SELECT key FROM usage WHERE key = ANY(%s) ORDER BY key FOR UPDATE", [keys])

    def users_changed(self, conn: Conn) -> None:
        """Tell the daemons on this database (the cluster listens): the notification goes
        out with the commit, never before it."""
        conn.execute("SELECT pg_notify(%s, '')", [USERS_CHANNEL])

    def kv_list(self, conn: Conn, scope: str, prefix: str) -> list[tuple[str, Any]]:
        rows = conn.execute(
            "SELECT key, value FROM kv WHERE scope = %s AND starts_with(key, %s) ORDER BY key",
            [scope, prefix],
        ).fetchall()
        return [(r[0], json.loads(r[1])) for r in rows]


PG = PgEngine()


def claim_lease(
    conn: Conn, sid: str, owner: str, pid: int, host: str, ttl: float, now: float
) -> LeaseRow:
    """Take the lease unless someone alive holds it (store/fence.py `takeover`); returns
    whoever holds it after. `now` is unused: lease times are the server's clock."""
    # A fresh row wins at once; a claimer racing us waits here for our commit.
    row = conn.execute(
        f"INSERT INTO leases ({LEASE_COLS}) VALUES (%s, %s, %s, %s, {_NOW} + %s, 1)"
        f" ON CONFLICT (session_id) DO NOTHING RETURNING {LEASE_COLS}",
        [sid, owner, pid, host, ttl],
    ).fetchone()
    if row is not None:
        return lease_from(row)
    found = conn.execute(
        f"SELECT {LEASE_COLS}, {_NOW} FROM leases WHERE session_id = %s FOR UPDATE", [sid]
    ).fetchone()
    holder = None if found is None else lease_from(found)
    generation = takeover(holder, owner, host, 0.0 if found is None else float(found[6]))
    if generation is None:
        assert holder is not None
        return holder
    taken = conn.execute(
        f"INSERT INTO leases ({LEASE_COLS}) VALUES (%s, %s, %s, %s, {_NOW} + %s, %s)"
        " ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner, pid = excluded.pid,"
        " host = excluded.host, expires_at = excluded.expires_at,"
        f" generation = excluded.generation RETURNING {LEASE_COLS}",
        [sid, owner, pid, host, ttl, generation],
    ).fetchone()
    assert taken is not None
    return lease_from(taken)


def enqueue(
    conn: Conn,
    sid: str,
    key: str,
    data: str,
    pid: int,
    host: str,
    now: float,
    keep: int | None,
    claim: KeyClaim | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """Insert the row (and take the client key `claim`); with `keep`, drop the session's
    oldest rows beyond the newest `keep` and return them. One enqueuer of a session at a
    time (an advisory lock for the transaction): two daemons queueing at once never both
    stay under the cap."""
    # Locks the session row against a delete (KEY SHARE); a missing session is named.
    if conn.execute("SELECT 1 FROM sessions WHERE id = %s FOR KEY SHARE", [sid]).fetchone() is None:
        raise StoreError(f"no session {sid!r} in the store")
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 11))", [sid])
    if claim is not None:
        PG.claim_key(conn, sid, claim, now)
    inserted = conn.execute(
        "INSERT INTO queued (key, session_id, pid, host, data, created_at)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING RETURNING 1",
        [key, sid, pid, host, data, now],
    ).fetchone()
    if inserted is None:
        raise StoreError(f"a queued message with key {key!r} exists already")
    if keep is None:
        return []
    rows = conn.execute(
        "DELETE FROM queued WHERE id IN (SELECT id FROM queued WHERE session_id = %s"
        " ORDER BY id DESC OFFSET %s) RETURNING id, key, data",
        [sid, keep],
    ).fetchall()
    return [(str(r[1]), json.loads(r[2])) for r in sorted(rows)]


def adopt(
    conn: Conn, sid: str, pid: int, host: str, now: float
) -> list[tuple[str, dict[str, Any]]]:
    """The session's rows nobody else runs, now ours: left by a dead process on this host
    or a dead daemon elsewhere (its ``daemons`` row expired or it left), handed over by another
    daemon (pid 0: core/cluster/cluster.py), or ours. Nothing while another process holds the
    session's lease: its owner runs them, and would find them gone. Every row while we
    hold it: the holder runs the queue, in its order (a copy another daemon still has
    in memory is never run twice: taking a row off the queue is a compare and set).
    `now` is unused: lease times are the server's clock."""
    if conn.execute("SELECT 1 FROM queued WHERE session_id = %s LIMIT 1", [sid]).fetchone() is None:
        return []  # nearly always: one statement
    holder = conn.execute(
        f"SELECT pid, host FROM leases WHERE session_id = %s AND expires_at > {_NOW}", [sid]
    ).fetchone()
    if holder is not None and (holder[0], holder[1]) != (pid, host):
        return []
    holding = holder is not None
    rows = conn.execute(
        "SELECT key, pid, host, data FROM queued WHERE session_id = %s ORDER BY id FOR UPDATE",
        [sid],
    ).fetchall()
    gone = {
        (int(r[0]), str(r[1]))
        for r in conn.execute(f"SELECT pid, host FROM daemons WHERE expires_at <= {_NOW}")
    }
    out: list[tuple[str, dict[str, Any]]] = []
    for key, row_pid, row_host, data in rows:
        mine = (row_pid, row_host) == (pid, host)
        handed = row_pid == HANDED_PID
        if row_host == host:
            dead = not pid_alive(row_pid)
        else:  # another machine: dead once its daemon's row has expired (never one of
            dead = (row_pid, row_host) in gone  # a process that kept no row: navi run)
        if not (mine or handed or dead or holding):
            continue  # a live process runs it
        if not mine:
            conn.execute("UPDATE queued SET pid = %s, host = %s WHERE key = %s", [pid, host, key])
        out.append((key, json.loads(data)))
    return out


def stats(conn: Conn) -> dict[str, int]:
    """Row count per table, in one statement (one snapshot)."""
    counts = ", ".join(f"(SELECT COUNT(*) FROM {t})" for t in TABLES)
    row = conn.execute(f"SELECT {counts}").fetchone()
    assert row is not None
    return {t: int(n) for t, n in zip(TABLES, row, strict=True)}
