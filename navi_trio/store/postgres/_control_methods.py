"""The store's methods for wake-ups, usage and schedules (mixed into `PostgresStore`).

What each does is store/_control.py's (the SQLite store's); the checks and serialisation
are `store/_control_input`'s, shared by both stores; the statements, made safe for
several daemons at once, are `_control`'s. Each method is one job on the workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from navi_trio.store._control_input import (
    check_adds,
    check_amounts,
    check_keys,
    check_limit,
    check_release,
    check_reserve,
    check_sessions_max,
    new_session_row,
    queued_values,
    schedule_values,
)
from navi_trio.store._input import _check_text, _dump
from navi_trio.store.base import (
    Claimed,
    NewSession,
    QueuedRow,
    ScheduleRow,
    UsageAsk,
    UsageGrant,
    UsageRequest,
)
from navi_trio.store.postgres import _control as ctl
from navi_trio.store.postgres._core import _Core


class _Control(_Core):
    async def enqueue_wake(
        self,
        wake: QueuedRow,
        *,
        note: tuple[str, str, Any] | None,
        limit: int,
        per: float,
    ) -> bool:
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
            lambda c: ctl.enqueue_wake(c, values, kv, limit, now - per, now),
        )

    async def add_usage(self, keys: Sequence[str], amounts: dict[str, float]) -> None:
        names = check_keys(keys)
        adds = check_amounts(amounts)
        if not names or not any(adds.values()):
            return
        now = self._now()
        await self._run("add usage", lambda c: ctl.add_usage(c, names, adds, now))

    async def get_usage(self, keys: Sequence[str]) -> dict[str, dict[str, float]]:
        names = check_keys(keys)
        if not names:
            return {}
        return await self._run("read usage", lambda c: ctl.get_usage(c, names), write=False)

    async def reserve_usage(self, asks: Sequence[UsageAsk], request: UsageRequest) -> UsageGrant:
        checked, req = check_reserve(asks, request)
        now = self._now()
        return await self._run("reserve usage", lambda c: ctl.reserve(c, checked, req, now))

    async def settle_usage(
        self, adds: dict[str, dict[str, float]], *, release: Sequence[str] = ()
    ) -> dict[str, dict[str, float]]:
        amounts = check_adds(adds)
        holds = check_release(release)
        now = self._now()
        return await self._run("settle usage", lambda c: ctl.settle(c, amounts, holds, now))

    async def create_schedule(self, row: ScheduleRow) -> ScheduleRow:
        values = schedule_values(row)
        return await self._run(
            f"create schedule {row.id!r}", lambda c: ctl.create_schedule(c, values, row)
        )

    async def get_schedule(self, schedule_id: str) -> ScheduleRow | None:
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(
            f"get schedule {sid!r}", lambda c: ctl.get_schedule(c, sid), write=False
        )

    async def list_schedules(self, user_id: str | None = None) -> list[ScheduleRow]:
        if user_id is not None:
            _check_text(user_id, "user_id")
        return await self._run(
            "list schedules", lambda c: ctl.list_schedules(c, user_id), write=False
        )

    async def count_schedules(self, user_id: str) -> int:
        _check_text(user_id, "user_id")
        return await self._run(
            f"count schedules of {user_id}", lambda c: ctl.count_schedules(c, user_id),
            write=False,
        )  # fmt: skip

    async def set_schedule(self, schedule_id: str, *, paused: bool, next_due: float | None) -> bool:
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(
            f"update schedule {sid!r}", lambda c: ctl.set_schedule(c, sid, bool(paused), next_due)
        )

    async def delete_schedule(self, schedule_id: str) -> bool:
        sid = _check_text(schedule_id, "schedule id")
        return await self._run(f"delete schedule {sid!r}", lambda c: ctl.delete_schedule(c, sid))

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
        sid = _check_text(schedule_id, "schedule id")
        values = None if run is None else queued_values(run, "scheduled run")
        new = None if session is None else new_session_row(session)
        most = check_sessions_max(sessions_max)
        now = self._now()
        return await self._run(
            f"claim schedule {sid!r}",
            lambda c: ctl.claim(c, sid, float(due), next_due, values, new, most, now),
        )
