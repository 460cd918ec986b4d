"""Wake-ups, usage counters and schedules on PostgreSQL, on a worker thread.

The rules of the SQLite store (store/_control.py), made safe for several daemons at
once: a wake-up locks its session's row before it counts (two daemons never both pass
the bound), usage is added in place (``ON CONFLICT ... DO UPDATE SET n = usage.n + ...``),
and a claim is one ``UPDATE ... WHERE next_due = <the value read>``: a second claimer
waits for the first one's row lock, then finds next_due moved and claims nothing.

A reservation locks its keys' ``usage`` rows (``SELECT ... FOR UPDATE``, in key order,
the rows made first when missing) before it reads their counters and holds: a second
reserver of the same key on any daemon waits for the first one's commit, then counts
its hold. A settle updates the row (so it waits for a reserver too) and drops its hold
in the same transaction. Hold times are the server's clock. Creating a session under
the user's limit takes a transaction-scoped advisory lock on the user first, so two
creators (a message, a schedule's claim, on any daemon) count one after the other.
"""

from __future__ import annotations

from typing import Any

from navi_trio.errors import StoreError
from navi_trio.store._control_input import (
    SCHEDULE_COLS,
    by_key,
    decide,
    taken,
)
from navi_trio.store._lease import pid_alive
from navi_trio.store.base import (
    USAGE_KINDS,
    ScheduleRow,
    UsageAsk,
    UsageGrant,
    UsageRequest,
)
from navi_trio.store.postgres._tables import PG
from navi_trio.store.postgres._workers import Conn

_NOW = "extract(epoch FROM clock_timestamp())"


def _live_holds(conn: Conn, keys: list[str], host: str) -> dict[str, dict[str, float]]:
    """Each key's live holds, summed (expired ones and a dead local process's deleted)."""
    conn.execute(f"DELETE FROM usage_holds WHERE key = ANY(%s) AND expires_at <= {_NOW}", [keys])
    pids = conn.execute(
        "SELECT DISTINCT pid FROM usage_holds WHERE key = ANY(%s) AND host = %s", [keys, host]
    ).fetchall()
    for (pid,) in pids:
        if not pid_alive(int(pid)):
            conn.execute("DELETE FROM usage_holds WHERE pid = %s AND host = %s", [pid, host])
    sums = ", ".join(f"SUM({k})" for k in USAGE_KINDS)
    rows = conn.execute(
        f"SELECT key, {sums} FROM usage_holds WHERE key = ANY(%s) GROUP BY key", [keys]
    ).fetchall()
    return by_key(keys, rows)


def reserve(conn: Conn, asks: list[UsageAsk], req: UsageRequest, now: float) -> UsageGrant:
    keys = sorted(a.key for a in asks)  # one lock order for every reserver
    zeros = ", ".join("0" for _ in USAGE_KINDS)
    for key in keys:
        conn.execute(
            f"INSERT INTO usage (key, {', '.join(USAGE_KINDS)}, updated_at)"
            f" VALUES (%s, {zeros}, %s) ON CONFLICT (key) DO NOTHING",
            [key, now],
        )
    conn.execute("SELECT key FROM usage WHERE key = ANY(%s) ORDER BY key FOR UPDATE", [keys])
    held = _live_holds(conn, keys, req.host)
    spent = PG.get_usage(conn, keys)
    granted, refused = decide(asks, req, spent, held)
    if refused is not None:
        return UsageGrant({}, refused, spent, held)
    amounts = taken(keys, granted, req, spent, held)
    if req.hold is None:
        PG.add_usage(conn, keys, amounts, now)
        return UsageGrant(granted, None, spent, held)
    for key in keys:
        conn.execute(
            f"INSERT INTO usage_holds (hold, key, {', '.join(USAGE_KINDS)}, pid, host,"
            f" expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, {_NOW} + %s)",
            [req.hold, key, *amounts.values(), req.pid, req.host, req.ttl],
        )
    return UsageGrant(granted, None, spent, held)


def settle(
    conn: Conn, adds: dict[str, dict[str, float]], holds: list[str], now: float
) -> dict[str, dict[str, float]]:
    for key in sorted(adds):
        if any(adds[key].values()):
            PG.add_usage(conn, [key], adds[key], now)
    if holds:
        conn.execute("DELETE FROM usage_holds WHERE hold = ANY(%s)", [holds])
    return PG.get_usage(conn, list(adds)) if adds else {}


def create_schedule(conn: Conn, values: tuple[Any, ...], row: ScheduleRow) -> ScheduleRow:
    marks = ", ".join("%s" for _ in SCHEDULE_COLS)
    inserted = conn.execute(
        f"INSERT INTO schedules ({', '.join(SCHEDULE_COLS)}) VALUES ({marks})"
        " ON CONFLICT (id) DO NOTHING RETURNING 1",
        list(values),
    ).fetchone()
    if inserted is None:
        raise StoreError(f"create schedule {row.id!r}: it already exists")
    return row
