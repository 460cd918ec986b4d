"""Wake-ups, usage counters and schedules on PostgreSQL, on a worker thread.

The rules of the SQLite store (store/_control.py), made safe for several daemons at
once: a wake-up locks its session's row before it counts (two daemons never both pass
the bound), usage is added in place (``ON CONFLICT ... DO UPDATE SET n = usage.n + ...``),
and a claim is one ``UPDATE ... WHERE next_due = <the value read>``: a second claimer
waits for the first one's row lock, then finds next_due moved and claims nothing.
"""

from __future__ import annotations

import json
from typing import Any

from navi_trio.errors import StoreError
from navi_trio.store._control_input import SCHEDULE_COLS, schedule_from
from navi_trio.store.base import USAGE_KINDS, ScheduleRow
from navi_trio.store.postgres._workers import Conn


def _insert_queued(conn: Conn, values: tuple[Any, ...], now: float) -> None:
    conn.execute(
        "INSERT INTO queued (key, session_id, pid, host, data, created_at)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        [*values, now],
    )


def enqueue_wake(
    conn: Conn,
    values: tuple[Any, ...],
    kv: tuple[str, str, str] | None,
    limit: int,
    since: float,
    now: float,
) -> bool:
    sid = values[1]
    if conn.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", [sid]).fetchone() is None:
        raise StoreError(f"no session {sid!r} in the store")
    if kv is not None:
        conn.execute(
            "INSERT INTO kv (scope, key, value, updated_at) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value,"
            " updated_at = excluded.updated_at",
            [*kv, now],
        )
    conn.execute("DELETE FROM wakes WHERE session_id = %s AND at <= %s", [sid, since])
    row = conn.execute("SELECT COUNT(*) FROM wakes WHERE session_id = %s", [sid]).fetchone()
    if row is not None and int(row[0]) >= limit:
        return False
    _insert_queued(conn, values, now)
    conn.execute("INSERT INTO wakes (session_id, at) VALUES (%s, %s)", [sid, now])
    return True


def add_usage(conn: Conn, keys: list[str], adds: dict[str, float], now: float) -> None:
    cols = ", ".join(USAGE_KINDS)
    sets = ", ".join(f"{k} = usage.{k} + excluded.{k}" for k in USAGE_KINDS)
    for key in sorted(keys):  # one order for every writer: no deadlock between two
        conn.execute(
            f"INSERT INTO usage (key, {cols}, updated_at) VALUES (%s, %s, %s, %s, %s, %s)"
            f" ON CONFLICT (key) DO UPDATE SET {sets}, updated_at = excluded.updated_at",
            [key, *(adds[k] for k in USAGE_KINDS), now],
        )


def get_usage(conn: Conn, keys: list[str]) -> dict[str, dict[str, float]]:
    out = {key: dict.fromkeys(USAGE_KINDS, 0.0) for key in keys}
    rows = conn.execute(
        f"SELECT key, {', '.join(USAGE_KINDS)} FROM usage WHERE key = ANY(%s)", [keys]
    ).fetchall()
    for row in rows:
        out[row[0]] = {k: float(v) for k, v in zip(USAGE_KINDS, row[1:], strict=True)}
    return out


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


def get_schedule(conn: Conn, sid: str) -> ScheduleRow | None:
    row = conn.execute(
        f"SELECT {', '.join(SCHEDULE_COLS)} FROM schedules WHERE id = %s", [sid]
    ).fetchone()
    return None if row is None else schedule_from(row, json.loads)


def list_schedules(conn: Conn, user_id: str | None) -> list[ScheduleRow]:
    cols = ", ".join(SCHEDULE_COLS)
    if user_id is None:
        rows = conn.execute(f"SELECT {cols} FROM schedules ORDER BY created_at, id").fetchall()
    else:
        rows = conn.execute(
            f"SELECT {cols} FROM schedules WHERE user_id = %s ORDER BY created_at, id", [user_id]
        ).fetchall()
    return [schedule_from(r, json.loads) for r in rows]


def count_schedules(conn: Conn, user_id: str) -> int:
    row = conn.execute("SELECT COUNT(*) FROM schedules WHERE user_id = %s", [user_id]).fetchone()
    return 0 if row is None else int(row[0])


def set_schedule(conn: Conn, sid: str, paused: bool, next_due: float | None) -> bool:
    cursor = conn.execute(
        "UPDATE schedules SET paused = %s, next_due = %s WHERE id = %s", [paused, next_due, sid]
    )
    return bool(cursor.rowcount)


def delete_schedule(conn: Conn, sid: str) -> bool:
    return bool(conn.execute("DELETE FROM schedules WHERE id = %s", [sid]).rowcount)


def claim(
    conn: Conn,
    sid: str,
    due: float,
    next_due: float | None,
    run: tuple[Any, ...] | None,
    new: tuple[Any, ...] | None,
    now: float,
) -> bool:
    if run is None:
        cursor = conn.execute(
            "UPDATE schedules SET next_due = %s WHERE id = %s AND next_due = %s AND NOT paused",
            [next_due, sid, due],
        )
        return bool(cursor.rowcount)
    cursor = conn.execute(
        "UPDATE schedules SET next_due = %s, runs = runs + 1, last_run_at = %s,"
        " last_session_id = %s WHERE id = %s AND next_due = %s AND NOT paused",
        [next_due, now, run[1], sid, due],
    )
    if not cursor.rowcount:
        return False
    if new is not None:
        conn.execute(
            "INSERT INTO sessions (id, profile_id, title, user_id, created_at, updated_at, meta)"
            " VALUES (%s, %s, %s, %s, %s, %s, '{}')",
            [*new, now, now],
        )
    _insert_queued(conn, run, now)
    return True
