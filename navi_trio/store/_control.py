"""The tables of the control of running agents: wake-ups, usage, schedules.

- ``wakes`` (session_id, at): one row per wake-up a background job's note started
  (core/triggers/wake.py); `enqueue_wake` counts them to bound the wake-ups per session.
- ``usage`` (key, tokens, tool_calls, subagents, wall_sec): the budgets' counters
  (core/turn/budgets.py), one row per key (``session:<id>``, ``user:<id>:<day>``); `add_usage`
  adds in place, so concurrent runs never lose an increment.
- ``usage_holds`` (hold, key, amounts, pid, host, expires_at): what calls under way
  reserved. `reserve_usage` reads a key's counters and live holds and takes (a hold,
  or spending at once) in one write transaction (``BEGIN IMMEDIATE``: one writer at a
  time across processes), so two runs never both take the last of a limit;
  `settle_usage` adds what a call used and drops its hold in one.
- ``schedules``: scheduled runs (core/triggers/schedules.py); `claim_schedule` moves one from the
  due time it was read at (compare and set) and queues its run in that transaction,
  counting the owner's sessions first when it creates one.

The statements of the SQLite store (store/methods.py has the methods, and
`_control_input` the checks both stores share), run on the worker thread.
"""

from __future__ import annotations

from typing import Any

from sqlite_utils import Database

from navi_trio.store._control_input import (
    SCHEDULE_COLS,
    by_key,
    decide,
    taken,
)
from navi_trio.store._lease import pid_alive
from navi_trio.store._schema import SQLITE, _write_tx
from navi_trio.store.base import (
    USAGE_KINDS,
    ScheduleRow,
    UsageAsk,
    UsageGrant,
    UsageRequest,
)


def _live_holds(
    db: Database, keys: list[str], host: str, now: float
) -> dict[str, dict[str, float]]:
    """Each key's live holds, summed; expired ones and those of a dead process on this
    host are deleted first (a crashed run's holds count no more)."""
    marks = ", ".join("?" for _ in keys)
    db.execute(f"DELETE FROM usage_holds WHERE key IN ({marks}) AND expires_at <= ?", [*keys, now])
    pids = db.execute(
        f"SELECT DISTINCT pid FROM usage_holds WHERE key IN ({marks}) AND host = ?", [*keys, host]
    ).fetchall()
    for (pid,) in pids:
        if not pid_alive(int(pid)):
            db.execute("DELETE FROM usage_holds WHERE pid = ? AND host = ?", [pid, host])
    sums = ", ".join(f"SUM({k})" for k in USAGE_KINDS)
    rows = db.execute(
        f"SELECT key, {sums} FROM usage_holds WHERE key IN ({marks}) GROUP BY key", keys
    ).fetchall()
    return by_key(keys, rows)


def _reserve(db: Database, asks: list[UsageAsk], req: UsageRequest, now: float) -> UsageGrant:
    keys = [a.key for a in asks]
    with _write_tx(db):
        held = _live_holds(db, keys, req.host, now)
        spent = SQLITE.get_usage(db, keys)
        granted, refused = decide(asks, req, spent, held)
        if refused is not None:
            return UsageGrant({}, refused, spent, held)
        amounts = taken(keys, granted, req, spent, held)
        if req.hold is None:
            SQLITE.add_usage(db, keys, amounts, now)
            return UsageGrant(granted, None, spent, held)
        for key in keys:
            db.execute(
                f"INSERT INTO usage_holds (hold, key, {', '.join(USAGE_KINDS)}, pid, host,"
                " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [req.hold, key, *amounts.values(), req.pid, req.host, now + req.ttl],
            )
        return UsageGrant(granted, None, spent, held)


def _settle(
    db: Database, adds: dict[str, dict[str, float]], holds: list[str], now: float
) -> dict[str, dict[str, float]]:
    if not holds and not any(any(a.values()) for a in adds.values()):
        return SQLITE.get_usage(db, list(adds)) if adds else {}  # nothing to write
    with _write_tx(db):
        for key, amounts in adds.items():
            if any(amounts.values()):
                SQLITE.add_usage(db, [key], amounts, now)
        if holds:
            marks = ", ".join("?" for _ in holds)
            db.execute(f"DELETE FROM usage_holds WHERE hold IN ({marks})", holds)
        return SQLITE.get_usage(db, list(adds)) if adds else {}


def _create_schedule(db: Database, values: tuple[Any, ...], row: ScheduleRow) -> ScheduleRow:
    with _write_tx(db):
        if db.execute("SELECT 1 FROM schedules WHERE id = ?", [row.id]).fetchone():
            from navi_trio.errors import StoreError

            raise StoreError(f"create schedule {row.id!r}: it already exists")
        marks = ", ".join("?" for _ in SCHEDULE_COLS)
        db.execute(f"INSERT INTO schedules ({', '.join(SCHEDULE_COLS)}) VALUES ({marks})", values)
    return row
