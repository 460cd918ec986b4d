"""The tables of issue 23's control of running agents: wake-ups, usage, schedules.

- ``wakes`` (session_id, at): one row per wake-up a background job's note started
  (core/wake.py); `enqueue_wake` counts them to bound the wake-ups per session.
- ``usage`` (key, tokens, tool_calls, subagents, wall_sec): the budgets' counters
  (core/budgets.py), one row per key (``session:<id>``, ``user:<id>:<day>``); `add_usage`
  adds in place, so concurrent runs never lose an increment.
- ``usage_holds`` (hold, key, amounts, pid, host, expires_at): what calls under way
  reserved. `reserve_usage` reads a key's counters and live holds and takes (a hold,
  or spending at once) in one write transaction (``BEGIN IMMEDIATE``: one writer at a
  time across processes), so two runs never both take the last of a limit;
  `settle_usage` adds what a call used and drops its hold in one.
- ``schedules``: scheduled runs (core/schedules.py); `claim_schedule` moves one from the
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
    sessions_full,
    taken,
)
from navi_trio.store._lease import pid_alive
from navi_trio.store._schema import SQLITE, _write_tx
from navi_trio.store.base import (
    USAGE_KINDS,
    Claimed,
    ScheduleRow,
    UsageAsk,
    UsageGrant,
    UsageRequest,
)


def _insert_queued(db: Database, values: tuple[Any, ...], now: float) -> None:
    db.execute(
        "INSERT INTO queued (key, session_id, pid, host, data, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [*values, now],
    )


def _enqueue_wake(
    db: Database,
    values: tuple[Any, ...],
    kv: tuple[str, str, str] | None,
    limit: int,
    since: float,
    now: float,
) -> bool:
    with _write_tx(db):
        if kv is not None:
            db.execute(
                "INSERT INTO kv (scope, key, value, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value,"
                " updated_at = excluded.updated_at",
                [*kv, now],
            )
        sid = values[1]
        db.execute("DELETE FROM wakes WHERE session_id = ? AND at <= ?", [sid, since])
        count = db.execute("SELECT COUNT(*) FROM wakes WHERE session_id = ?", [sid]).fetchone()
        if int(count[0]) >= limit:
            return False
        _insert_queued(db, values, now)
        db.execute("INSERT INTO wakes (session_id, at) VALUES (?, ?)", [sid, now])
        return True


def _add_usage(db: Database, keys: list[str], adds: dict[str, float], now: float) -> None:
    cols = ", ".join(USAGE_KINDS)
    sets = ", ".join(f"{k} = {k} + excluded.{k}" for k in USAGE_KINDS)
    with _write_tx(db):
        for key in keys:
            db.execute(
                f"INSERT INTO usage (key, {cols}, updated_at) VALUES (?, ?, ?, ?, ?, ?)"
                f" ON CONFLICT (key) DO UPDATE SET {sets}, updated_at = excluded.updated_at",
                [key, *(adds[k] for k in USAGE_KINDS), now],
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
            _add_usage(db, keys, amounts, now)
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
                _add_usage(db, [key], amounts, now)
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


def _claim(
    db: Database,
    sid: str,
    due: float,
    next_due: float | None,
    run: tuple[Any, ...] | None,
    new: tuple[Any, ...] | None,
    most: int | None,
    now: float,
) -> Claimed:
    with _write_tx(db):
        cursor = db.execute(
            "UPDATE schedules SET next_due = ? WHERE id = ? AND next_due = ? AND paused = 0",
            [next_due, sid, due],
        )
        if not cursor.rowcount:
            return Claimed(False)
        if run is None:
            return Claimed(True)
        if new is not None and most is not None:
            count = int(
                db.execute("SELECT COUNT(*) FROM sessions WHERE user_id = ?", [new[3]]).fetchone()[
                    0
                ]
            )
            if count >= most:
                why = sessions_full(count, most)
                db.execute(
                    "UPDATE schedules SET last_skip = ?, last_skip_at = ? WHERE id = ?",
                    [why, due, sid],
                )
                return Claimed(True, why)
        db.execute(
            "UPDATE schedules SET runs = runs + 1, last_run_at = ?, last_session_id = ?,"
            " last_skip = NULL, last_skip_at = NULL WHERE id = ?",
            [now, run[1], sid],
        )
        if new is not None:
            db.execute(
                "INSERT INTO sessions (id, profile_id, title, user_id, created_at, updated_at,"
                " meta) VALUES (?, ?, ?, ?, ?, ?, '{}')",
                [*new, now, now],
            )
        _insert_queued(db, run, now)
        return Claimed(True)
