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

`_Control` holds the store's methods (mixed into `SQLiteStore`); below it, the functions
that run on the worker thread. The checks and serialisation are `_control_input`'s,
shared with the PostgreSQL store.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlite_utils import Database

from navi_trio.store._control_input import (
    SCHEDULE_COLS,
    by_key,
    check_adds,
    check_amounts,
    check_keys,
    check_limit,
    check_release,
    check_reserve,
    check_sessions_max,
    decide,
    new_session_row,
    queued_values,
    schedule_from,
    schedule_values,
    sessions_full,
    taken,
)
from navi_trio.store._core import _Core
from navi_trio.store._input import _check_text, _dump
from navi_trio.store._lease import pid_alive
from navi_trio.store._schema import _write_tx
from navi_trio.store.base import (
    USAGE_KINDS,
    Claimed,
    NewSession,
    QueuedRow,
    ScheduleRow,
    UsageAsk,
    UsageGrant,
    UsageRequest,
)


class _Control(_Core):
    # -- wake-ups -----------------------------------------------------------------------

    async def enqueue_wake(
        self,
        wake: QueuedRow,
        *,
        note: tuple[str, str, Any] | None,
        limit: int,
        per: float,
    ) -> bool:
        """Store `note` (scope, key, value) and, unless the session was woken `limit`
        times in the last `per` seconds, queue `wake` and count it: one transaction.
        True when the wake-up was queued."""
        values = queued_values(wake, "wake-up")
        check_limit(limit, per)
        kv = None
        if note is not None:
            scope, key, value = note
            kv = (_check_text(scope, "kv scope"), _check_text(key, "kv key"),
                  _dump(value, f"kv value for {scope}/{key}"))  # fmt: skip
        now = self._now()
        return await self._run(
            f"queue a wake-up of {wake.session_id!r}",
            lambda db: _enqueue_wake(db, values, kv, limit, now - per, now),
        )

    # -- usage --------------------------------------------------------------------------

    async def add_usage(self, keys: Sequence[str], amounts: dict[str, float]) -> None:
        """Add `amounts` (kind -> amount, each 0 or more) to every counter in `keys`."""
        names = check_keys(keys)
        adds = check_amounts(amounts)
        if not names or not any(adds.values()):
            return
        now = self._now()
        await self._run("add usage", lambda db: _add_usage(db, names, adds, now))

    async def get_usage(self, keys: Sequence[str]) -> dict[str, dict[str, float]]:
        """Each key's counters (zeros for a key never added to)."""
        names = check_keys(keys)
        if not names:
            return {}
        return await self._run("read usage", lambda db: _get_usage(db, names))

    async def reserve_usage(self, asks: Sequence[UsageAsk], request: UsageRequest) -> UsageGrant:
        """Take `request` from every key of `asks` within its limits, counting the live
        holds, in one transaction (see store/base.py)."""
        checked, req = check_reserve(asks, request)
        now = self._now()
        return await self._run("reserve usage", lambda db: _reserve(db, checked, req, now))

    async def settle_usage(
        self, adds: dict[str, dict[str, float]], *, release: Sequence[str] = ()
    ) -> dict[str, dict[str, float]]:
        """Add each key's amounts and drop the holds named, in one transaction."""
        amounts = check_adds(adds)
        holds = check_release(release)
        now = self._now()
        return await self._run("settle usage", lambda db: _settle(db, amounts, holds, now))

    # -- schedules ----------------------------------------------------------------------

    async def create_schedule(self, row: ScheduleRow) -> ScheduleRow:
        values = schedule_values(row)
        return await self._run(
            f"create schedule {row.id!r}", lambda db: _create_schedule(db, values, row)
        )

    async def get_schedule(self, schedule_id: str) -> ScheduleRow | None:
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(f"get schedule {sid!r}", lambda db: _get_schedule(db, sid))

    async def list_schedules(self, user_id: str | None = None) -> list[ScheduleRow]:
        if user_id is not None:
            _check_text(user_id, "user_id")
        return await self._run("list schedules", lambda db: _list_schedules(db, user_id))

    async def count_schedules(self, user_id: str) -> int:
        _check_text(user_id, "user_id")
        return await self._run(
            f"count schedules of {user_id}", lambda db: _count_schedules(db, user_id)
        )

    async def set_schedule(self, schedule_id: str, *, paused: bool, next_due: float | None) -> bool:
        """Pause or resume, with the next due time; False when there is no such schedule."""
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(
            f"update schedule {sid!r}",
            lambda db: _set_schedule(db, sid, bool(paused), next_due),
        )

    async def delete_schedule(self, schedule_id: str) -> bool:
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(f"delete schedule {sid!r}", lambda db: _delete_schedule(db, sid))

    async def claim_schedule(
        self,
        schedule_id: str,
        *,
        due: float,
        next_due: float | None,
        run: QueuedRow | None,
        session: NewSession | None = None,
        sessions_max: int | None = None,
    ) -> Claimed:
        """Move the schedule from `due` to `next_due` if nobody did meanwhile (and it is
        not paused); with `run`, queue it (and create `session` first, unless its user
        has `sessions_max` sessions: then the run is skipped and the schedule says why)
        and count the run. All or nothing."""
        sid = _check_text(schedule_id, "schedule id")
        values = None if run is None else queued_values(run, "scheduled run")
        new = None if session is None else new_session_row(session)
        most = check_sessions_max(sessions_max)
        now = self._now()
        return await self._run(
            f"claim schedule {sid!r}",
            lambda db: _claim(db, sid, float(due), next_due, values, new, most, now),
        )


# -- on the worker thread ---------------------------------------------------------------


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


def _get_usage(db: Database, keys: list[str]) -> dict[str, dict[str, float]]:
    marks = ", ".join("?" for _ in keys)
    rows = db.execute(
        f"SELECT key, {', '.join(USAGE_KINDS)} FROM usage WHERE key IN ({marks})", keys
    ).fetchall()
    return by_key(keys, rows)


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
        spent = _get_usage(db, keys)
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
        return _get_usage(db, list(adds)) if adds else {}  # nothing to write
    with _write_tx(db):
        for key, amounts in adds.items():
            if any(amounts.values()):
                _add_usage(db, [key], amounts, now)
        if holds:
            marks = ", ".join("?" for _ in holds)
            db.execute(f"DELETE FROM usage_holds WHERE hold IN ({marks})", holds)
        return _get_usage(db, list(adds)) if adds else {}


def _create_schedule(db: Database, values: tuple[Any, ...], row: ScheduleRow) -> ScheduleRow:
    with _write_tx(db):
        if db.execute("SELECT 1 FROM schedules WHERE id = ?", [row.id]).fetchone():
            from navi_trio.errors import StoreError

            raise StoreError(f"create schedule {row.id!r}: it already exists")
        marks = ", ".join("?" for _ in SCHEDULE_COLS)
        db.execute(f"INSERT INTO schedules ({', '.join(SCHEDULE_COLS)}) VALUES ({marks})", values)
    return row


def _get_schedule(db: Database, sid: str) -> ScheduleRow | None:
    row = db.execute(
        f"SELECT {', '.join(SCHEDULE_COLS)} FROM schedules WHERE id = ?", [sid]
    ).fetchone()
    return None if row is None else schedule_from(row, json.loads)


def _list_schedules(db: Database, user_id: str | None) -> list[ScheduleRow]:
    cols = ", ".join(SCHEDULE_COLS)
    if user_id is None:
        rows = db.execute(f"SELECT {cols} FROM schedules ORDER BY created_at, id").fetchall()
    else:
        rows = db.execute(
            f"SELECT {cols} FROM schedules WHERE user_id = ? ORDER BY created_at, id", [user_id]
        ).fetchall()
    return [schedule_from(r, json.loads) for r in rows]


def _count_schedules(db: Database, user_id: str) -> int:
    row = db.execute("SELECT COUNT(*) FROM schedules WHERE user_id = ?", [user_id]).fetchone()
    return int(row[0])


def _set_schedule(db: Database, sid: str, paused: bool, next_due: float | None) -> bool:
    with _write_tx(db):
        cursor = db.execute(
            "UPDATE schedules SET paused = ?, next_due = ? WHERE id = ?",
            [int(paused), next_due, sid],
        )
        return bool(cursor.rowcount)


def _delete_schedule(db: Database, sid: str) -> bool:
    with _write_tx(db):
        return bool(db.execute("DELETE FROM schedules WHERE id = ?", [sid]).rowcount)


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
