"""The control tables' input, checked and serialised on the caller's side (no SQL).

Shared by the SQLite store (store/_control.py) and the PostgreSQL one: a wake-up or a
scheduled run as the values of a queued row, usage keys and amounts, a schedule as the
values of its row and back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from navi_trio.errors import StoreError
from navi_trio.store._input import _check_text, _dump, check_session_id
from navi_trio.store.base import USAGE_KINDS, NewSession, QueuedRow, ScheduleRow

KEY_MAX_CHARS = 256  # a usage key (``user:<id>:<day>``)
KEYS_MAX = 16  # usage keys in one call
SCHEDULE_KINDS = ("cron", "every", "at")
SCHEDULE_COLS = (
    "id", "user_id", "session_id", "profile_id", "kind", "spec", "message", "catch_up",
    "paused", "next_due", "created_at", "runs", "last_run_at", "last_session_id", "budget",
)  # fmt: skip


def queued_values(row: QueuedRow, what: str) -> tuple[str, str, int, str, str]:
    """(key, session_id, pid, host, data) of a queued row."""
    sid = check_session_id(row.session_id)
    _check_text(row.key, f"{what} key")
    _check_text(row.host, f"{what} host")
    if not isinstance(row.pid, int):
        raise StoreError(f"{what} pid must be a whole number, got {row.pid!r}")
    return row.key, sid, row.pid, row.host, _dump(row.message, f"{what} of {sid!r}")


def check_limit(limit: int, per: float) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise StoreError(f"a wake-up limit must be a whole number of 0 or more, got {limit!r}")
    if not isinstance(per, int | float) or not math.isfinite(per) or per <= 0:
        raise StoreError(f"a wake-up window must be a number of seconds above 0, got {per!r}")


def check_keys(keys: Sequence[str]) -> list[str]:
    if isinstance(keys, str):
        raise StoreError("usage keys must be a list of strings, not one string")
    names = list(dict.fromkeys(keys))
    if len(names) > KEYS_MAX:
        raise StoreError(f"at most {KEYS_MAX} usage keys at once, got {len(names)}")
    for key in names:
        _check_text(key, "usage key")
        if len(key) > KEY_MAX_CHARS:
            raise StoreError(f"a usage key is at most {KEY_MAX_CHARS} characters")
    return names


def check_amounts(amounts: dict[str, float]) -> dict[str, float]:
    unknown = sorted(set(amounts) - set(USAGE_KINDS))
    if unknown:
        raise StoreError(f"unknown usage kind(s) {unknown} (kinds: {', '.join(USAGE_KINDS)})")
    out: dict[str, float] = {}
    for kind in USAGE_KINDS:
        value = amounts.get(kind, 0)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise StoreError(f"usage {kind} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise StoreError(f"usage {kind} must be a finite number of 0 or more, got {value!r}")
        out[kind] = float(value)
    return out


def new_session_row(session: NewSession) -> tuple[str, str, str, str]:
    """(id, profile_id, title, user_id) of a session to create."""
    return (
        check_session_id(session.session_id),
        _check_text(session.profile_id, "profile_id"),
        _check_text(session.title, "title", allow_empty=True),
        _check_text(session.user_id, "user_id"),
    )


def _due(value: float | None, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise StoreError(f"{what} must be a finite time in seconds, got {value!r}")
    return float(value)


def schedule_values(row: ScheduleRow) -> tuple[Any, ...]:
    """The row's values in `SCHEDULE_COLS` order, every field checked."""
    _check_text(row.id, "schedule id")
    _check_text(row.user_id, "user_id")
    if row.session_id is not None:
        check_session_id(row.session_id)
    if row.profile_id is not None:
        _check_text(row.profile_id, "profile_id")
    if row.kind not in SCHEDULE_KINDS:
        raise StoreError(f"schedule kind must be one of {SCHEDULE_KINDS}, got {row.kind!r}")
    _check_text(row.spec, "schedule spec")
    _check_text(row.message, "schedule message")
    return (
        row.id, row.user_id, row.session_id, row.profile_id, row.kind, row.spec, row.message,
        bool(row.catch_up), bool(row.paused), _due(row.next_due, "next_due"),
        float(row.created_at), int(row.runs), _due(row.last_run_at, "last_run_at"),
        row.last_session_id, _dump(row.budget, f"budget of schedule {row.id!r}"),
    )  # fmt: skip


def schedule_from(row: Sequence[Any], loads: Callable[[str], Any]) -> ScheduleRow:
    v = dict(zip(SCHEDULE_COLS, row, strict=True))
    return ScheduleRow(
        id=v["id"], user_id=v["user_id"], session_id=v["session_id"],
        profile_id=v["profile_id"], kind=v["kind"], spec=v["spec"], message=v["message"],
        catch_up=bool(v["catch_up"]), paused=bool(v["paused"]),
        next_due=None if v["next_due"] is None else float(v["next_due"]),
        created_at=float(v["created_at"]), runs=int(v["runs"]),
        last_run_at=None if v["last_run_at"] is None else float(v["last_run_at"]),
        last_session_id=v["last_session_id"], budget=loads(v["budget"]),
    )  # fmt: skip
