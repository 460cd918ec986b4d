"""The control tables' input, checked and serialised on the caller's side (no SQL).

Shared by both engines: a wake-up or a scheduled run as the values of a queued row,
usage keys and amounts, a reservation's asks and the decision it comes to (`decide`), a
schedule as the values of its row and back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from navi_trio.errors import StoreError
from navi_trio.store._input import _check_text, _dump, check_session_id
from navi_trio.store.base import (
    USAGE_KINDS,
    NewSession,
    QueuedRow,
    ScheduleRow,
    UsageAsk,
    UsageRequest,
)

KEY_MAX_CHARS = 256  # a usage key (``user:<id>:<day>``)
KEYS_MAX = 16  # usage keys in one call
HOLD_MAX_CHARS = 64  # a usage hold's id
HOLDS_MAX = 64  # holds released in one call
HOLD_TTL_MAX = 7 * 86400.0
SCHEDULE_KINDS = ("cron", "every", "at")
SCHEDULE_COLS = tuple(
    "id user_id session_id profile_id kind spec message catch_up paused next_due created_at "
    "runs last_run_at last_session_id budget last_skip last_skip_at".split()
)
SKIP_MAX_CHARS = 500  # why a schedule's run was skipped


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


def _names(values: Sequence[str], what: str, most: int, chars: int) -> list[str]:
    """`values` (a list of `what`s), without repeats: at most `most`, each a text of at
    most `chars` characters."""
    if isinstance(values, str):
        raise StoreError(f"{what}s must be a list of strings, not one string")
    names = list(dict.fromkeys(values))
    if len(names) > most:
        raise StoreError(f"at most {most} {what}s at once, got {len(names)}")
    for name in names:
        _check_text(name, what)
        if len(name) > chars:
            raise StoreError(f"a {what} is at most {chars} characters")
    return names


def check_keys(keys: Sequence[str]) -> list[str]:
    return _names(keys, "usage key", KEYS_MAX, KEY_MAX_CHARS)


def check_amounts(amounts: dict[str, float]) -> dict[str, float]:
    unknown = sorted(set(amounts) - set(USAGE_KINDS))
    if unknown:
        raise StoreError(f"unknown usage kind(s) {unknown} (kinds: {', '.join(USAGE_KINDS)})")
    return {kind: _amount(amounts.get(kind, 0), f"usage {kind}") for kind in USAGE_KINDS}


def _amount(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StoreError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise StoreError(f"{what} must be a finite number of 0 or more, got {value!r}")
    return float(value)


def _kinds(values: dict[str, Any], what: str) -> dict[str, float]:
    if not isinstance(values, dict):
        raise StoreError(f"{what} must be a mapping of usage kind to amount")
    unknown = sorted(set(values) - set(USAGE_KINDS))
    if unknown:
        raise StoreError(f"unknown usage kind(s) {unknown} in {what}")
    return {k: _amount(v, f"{what} {k}") for k, v in values.items()}


def check_hold(hold: str) -> str:
    return _names([hold], "usage hold", 1, HOLD_MAX_CHARS)[0]


def check_release(release: Sequence[str]) -> list[str]:
    return _names(release, "usage hold", HOLDS_MAX, HOLD_MAX_CHARS)


def check_adds(adds: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each key's amounts, checked (a kind not named adds 0)."""
    names = check_keys(list(adds))
    return {key: check_amounts(adds[key]) for key in names}


def check_reserve(
    asks: Sequence[UsageAsk], request: UsageRequest
) -> tuple[list[UsageAsk], UsageRequest]:
    """The asks (one per key, limits checked) and the request, checked."""
    if isinstance(asks, UsageAsk) or not all(isinstance(a, UsageAsk) for a in asks):
        raise StoreError("usage asks must be a list of UsageAsk")
    check_keys([a.key for a in asks])
    if len({a.key for a in asks}) != len(asks):
        raise StoreError("each usage key at most once in one reservation")
    out = [UsageAsk(a.key, _kinds(a.limits, f"the limits of {a.key}")) for a in asks]
    want = _kinds(request.want, "a reservation's want")
    least = _kinds(request.least, "a reservation's least")
    if set(least) - set(want):
        raise StoreError("a reservation's least names a kind it does not want")
    full = tuple(request.full)
    if set(full) - set(USAGE_KINDS):
        raise StoreError(f"unknown usage kind(s) in a reservation's full: {full}")
    if request.hold is not None:
        check_hold(request.hold)
    if not isinstance(request.pid, int) or isinstance(request.pid, bool):
        raise StoreError(f"a usage holder's pid must be a whole number, got {request.pid!r}")
    ttl = _amount(request.ttl, "a usage hold's ttl")
    if not 0 < ttl <= HOLD_TTL_MAX:
        raise StoreError(f"a usage hold's ttl must be above 0 and at most {HOLD_TTL_MAX:g} s")
    checked = UsageRequest(
        want=want,
        least=least,
        full=full,
        hold=request.hold,
        pid=request.pid,
        host=_check_text(request.host, "usage holder host", allow_empty=True),
        ttl=ttl,
    )
    return out, checked


def decide(
    asks: Sequence[UsageAsk],
    request: UsageRequest,
    spent: dict[str, dict[str, float]],
    held: dict[str, dict[str, float]],
) -> tuple[dict[str, float], tuple[str, str] | None]:
    """What a reservation gets: (granted, None), or ({}, (key, kind)) naming the limit
    that refuses it. A key's use is its counters plus its live holds."""

    def used(key: str, kind: str) -> float:
        return spent[key][kind] + held[key][kind]

    for ask in asks:
        for kind in request.full:
            limit = ask.limits.get(kind)
            if limit is not None and used(ask.key, kind) >= limit:
                return {}, (ask.key, kind)
    granted = dict(request.want)
    for kind, amount in request.want.items():
        least = request.least.get(kind, amount)
        for ask in asks:
            limit = ask.limits.get(kind)
            if limit is None:
                continue
            room = limit - used(ask.key, kind)
            if room < least:
                return {}, (ask.key, kind)
            granted[kind] = min(granted[kind], room)
    return granted, None


def by_key(keys: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, dict[str, float]]:
    """Rows of (key, one amount per usage kind) as each key's amounts (zeros for a key
    with no row, and for a sum over no rows)."""
    out = {key: dict.fromkeys(USAGE_KINDS, 0.0) for key in keys}
    for row in rows:
        out[row[0]] = {k: float(v or 0) for k, v in zip(USAGE_KINDS, row[1:], strict=True)}
    return out


def taken(
    keys: Sequence[str],
    granted: dict[str, float],
    request: UsageRequest,
    spent: dict[str, dict[str, float]],
    held: dict[str, dict[str, float]],
) -> dict[str, float]:
    """What a grant takes of every kind, from every key; counted into the reply's
    `spent` (no hold: spent at once) or `held`."""
    amounts = {kind: granted.get(kind, 0.0) for kind in USAGE_KINDS}
    tally = held if request.hold is not None else spent
    for key in keys:
        for kind, amount in amounts.items():
            tally[key][kind] += amount
    return amounts


def check_sessions_max(limit: int | None) -> int | None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise StoreError(f"a session limit must be a whole number of 0 or more, got {limit!r}")
    return limit


def sessions_full(count: int, limit: int) -> str:
    """Why a session was not created: the user has `count`, the most allowed."""
    return (
        f"the user has {count} sessions, the most allowed (NAVI_SESSIONS_PER_USER={limit}):"
        " delete one first"
    )


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
        row.id,
        row.user_id,
        row.session_id,
        row.profile_id,
        row.kind,
        row.spec,
        row.message,
        bool(row.catch_up),
        bool(row.paused),
        _due(row.next_due, "next_due"),
        float(row.created_at),
        int(row.runs),
        _due(row.last_run_at, "last_run_at"),
        row.last_session_id,
        _dump(row.budget, f"budget of schedule {row.id!r}"),
        None if row.last_skip is None else row.last_skip[:SKIP_MAX_CHARS],
        _due(row.last_skip_at, "last_skip_at"),
    )


def schedule_from(row: Sequence[Any], loads: Callable[[str], Any]) -> ScheduleRow:
    v = dict(zip(SCHEDULE_COLS, row, strict=True))
    return ScheduleRow(
        id=v["id"],
        user_id=v["user_id"],
        session_id=v["session_id"],
        profile_id=v["profile_id"],
        kind=v["kind"],
        spec=v["spec"],
        message=v["message"],
        catch_up=bool(v["catch_up"]),
        paused=bool(v["paused"]),
        next_due=None if v["next_due"] is None else float(v["next_due"]),
        created_at=float(v["created_at"]),
        runs=int(v["runs"]),
        last_run_at=None if v["last_run_at"] is None else float(v["last_run_at"]),
        last_session_id=v["last_session_id"],
        budget=loads(v["budget"]),
        last_skip=v["last_skip"],
        last_skip_at=None if v["last_skip_at"] is None else float(v["last_skip_at"]),
    )
