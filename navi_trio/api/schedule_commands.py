"""The ``schedule`` command: add, list, remove, pause, resume.

A user sees and changes only their own schedules (another's is forbidden), and a
schedule of theirs may name only a session of theirs; an admin may touch all. A schedule
runs as its owner. What a schedule can be (one of cron, every and at; a message; a known
profile; at most NAVI_SCHEDULES_PER_USER of them) is checked here and by the scheduler,
each refusal an error frame naming the problem.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from navi_trio.api.auth import User
from navi_trio.api.protocol import RequestId, Schedule, reply
from navi_trio.core.triggers import Scheduler, ScheduleSpec
from navi_trio.errors import ForbiddenError, ProtocolError
from navi_trio.store.base import ScheduleRow, SessionRow

if TYPE_CHECKING:  # connection imports this module (through commands)
    from navi_trio.api.connection import Connection

log = logging.getLogger(__name__)


def schedule_view(row: ScheduleRow) -> dict[str, Any]:
    """A schedule as the wire shows it."""
    return {
        "schedule_id": row.id,
        "session_id": row.session_id,
        "profile": row.profile_id,
        "kind": row.kind,
        "spec": row.spec,
        "message": row.message,
        "catch_up": row.catch_up,
        "paused": row.paused,
        "next_due": row.next_due,
        "runs": row.runs,
        "last_run_at": row.last_run_at,
        "last_session_id": row.last_session_id,
        "budget": row.budget,
        "created_at": row.created_at,
        "last_skip": row.last_skip,
        "last_skip_at": row.last_skip_at,
    }


async def handle_schedule(
    scheduler: Scheduler,
    user: User,
    owned: Callable[[str], Awaitable[SessionRow]],
    conn: Connection,
    rid: RequestId,
    cmd: Schedule,
) -> None:
    if cmd.action == "list":
        rows = await scheduler.list(None if user.is_admin else user.id)
        views = [schedule_view(r) for r in rows]
        await conn.send(reply(rid, "schedules", action="list", schedules=views))
        return
    if cmd.action == "add":
        row = await scheduler.add(user.id, await _spec(cmd, owned), role=user.role)
        await conn.send(reply(rid, "schedules", action="add", schedule=schedule_view(row)))
        return
    if not cmd.schedule_id:
        raise ProtocolError(f"schedule {cmd.action} needs a schedule_id")
    row = await _mine(scheduler, user, cmd.schedule_id)
    fields: dict[str, Any]
    if cmd.action == "remove":
        fields = {"schedule_id": row.id, "removed": await scheduler.remove(row)}
    elif cmd.action == "pause":
        fields = {"schedule": schedule_view(await scheduler.pause(row))}
    else:
        fields = {"schedule": schedule_view(await scheduler.resume(row))}
    log.info("schedule %s: %s by %s", row.id, cmd.action, user.name)
    await conn.send(reply(rid, "schedules", action=cmd.action, **fields))


async def _mine(scheduler: Scheduler, user: User, schedule_id: str) -> ScheduleRow:
    row = await scheduler.get(schedule_id)
    if row.user_id != user.id and not user.is_admin:
        log.warning("user %s refused schedule %s of another user", user.name, schedule_id)
        raise ForbiddenError(f"schedule {schedule_id!r} belongs to another user")
    return row


async def _spec(cmd: Schedule, owned: Callable[[str], Awaitable[SessionRow]]) -> ScheduleSpec:
    whens = [(k, v) for k, v in (("cron", cmd.cron), ("every", cmd.every), ("at", cmd.at)) if v]
    if len(whens) != 1:
        raise ProtocolError("schedule add needs exactly one of cron, every and at")
    if not cmd.message or not cmd.message.strip():
        raise ProtocolError("schedule add needs a message (what the run is asked)")
    if (cmd.session_id is None) == (not cmd.new):
        raise ProtocolError(
            "schedule add needs a session_id (runs go on in that session) or new: true "
            "(each run in a new session)"
        )
    if cmd.session_id is not None:
        await owned(cmd.session_id)  # yours, or forbidden / not found
        if cmd.profile is not None:
            raise ProtocolError("profile is for new: true (a session keeps its own)")
    ((kind, spec),) = whens
    assert spec is not None
    return ScheduleSpec(
        session_id=cmd.session_id,
        profile_id=cmd.profile,
        kind=kind,
        spec=spec,
        message=cmd.message,
        catch_up=cmd.catch_up,
        budget=cmd.budget,
    )
