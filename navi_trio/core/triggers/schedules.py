"""Scheduled runs: a message that runs by itself, on a cron expression, every N minutes,
or once at a time.

A schedule (`ScheduleRow`) names its owner, where it runs (a session of theirs, or a new
session of a profile each time), when (``cron``, in the daemon's local time by cronsim;
``every``, 1 minute to 366 days; ``at``, one ISO 8601 time), the message, whether a due
time missed while no daemon ran is run once at start-up (`catch_up`), and budgets.

The `Scheduler` waits for the earliest due time, a change this daemon made, or
`Settings.schedule_poll_sec` (so another daemon's schedule or a clock jump is seen). A
due schedule is claimed in the store (compare and set on its due time) in the
transaction that queues its message: each due time runs exactly once, across restarts
and daemons. The run is the session actor's, ``headless`` (approvals by the profile's
``headless_allow``); its owner's clients get a ``schedule_run`` notice when it ends.

A run that needs a new session counts against its owner's session limit in the claim's
transaction: over it, the run is skipped and the schedule keeps why (``last_skip``). A
schedule runs as its owner with their role when due; one whose owner is gone is deleted
when due, never run. Several due times missed in a row are one run.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import socket
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs
import trio

from navi_trio.actor import NurseryHolder
from navi_trio.core.session import deliver, to_row
from navi_trio.core.turn import UserMessage
from navi_trio.errors import ForbiddenError, LimitError, NaviError, NotFoundError, ProtocolError
from navi_trio.events import StreamEnd
from navi_trio.notices import ScheduleRun, UserNotices
from navi_trio.profiles import BudgetConfig, NaviConfig, budgets_dict, parse_budgets
from navi_trio.settings import Settings
from navi_trio.store.base import NewSession, QueuedRow, ScheduleRow
from navi_trio.store.methods import SessionStore
from navi_trio.text import clip

if TYPE_CHECKING:
    from navi_trio.core.session import SessionRegistry

log = logging.getLogger(__name__)

KINDS = ("cron", "every", "at")
EVERY_MIN_SEC = 60.0
EVERY_MAX_SEC = 366 * 86400.0
AT_MAX_AHEAD_SEC = 366 * 86400.0
MESSAGE_MAX_CHARS = 16_000
SPEC_MAX_CHARS = 128
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EVERY = re.compile(r"(\d{1,9})\s*([smhd]?)")


class ScheduleError(ProtocolError):
    """A schedule that cannot be: the message says which field and why."""


def _local(ts: float) -> datetime:
    return datetime.fromtimestamp(ts).astimezone()


def every_seconds(spec: str) -> float:
    """``10m``, ``90s``, ``2h``, ``1d`` as seconds, checked. A bare number is refused:
    ``10`` meant as minutes would run every ten seconds."""
    match = _EVERY.fullmatch(spec.strip())
    if match is None:
        raise ScheduleError(f"every {spec[:32]!r}: expected a duration like 30s, 10m, 2h or 1d")
    if not match[2]:
        raise ScheduleError(f"every {spec!r}: add a unit: {match[1]}m (or s, h, d)")
    seconds = int(match[1]) * _UNITS[match[2]]
    if not EVERY_MIN_SEC <= seconds <= EVERY_MAX_SEC:
        raise ScheduleError(f"every {spec!r}: expected at least 1 minute and at most 366 days")
    return float(seconds)


def _cron(spec: str) -> Any:
    from cronsim import CronSim, CronSimError  # imported on use: not on `navi run`'s path

    fields = spec.split()
    if len(fields) != 5:
        raise ScheduleError(
            f"cron {spec[:64]!r}: expected five fields (minute hour day month weekday), "
            f"got {len(fields)}"
        )
    try:
        return CronSim(spec, _local(0.0))  # only checked here: `next_due` walks it
    except CronSimError as exc:
        raise ScheduleError(f"cron {spec[:64]!r}: {exc}") from None


def at_time(spec: str) -> float:
    """An ISO 8601 time as seconds since the epoch (no zone: the daemon's local time)."""
    try:
        when = datetime.fromisoformat(spec.strip())
    except ValueError:
        raise ScheduleError(
            f"at {spec[:64]!r}: expected an ISO 8601 time like 2030-01-31T09:00 or "
            "2030-01-31T09:00+01:00"
        ) from None
    return when.timestamp() if when.tzinfo else when.astimezone().timestamp()


def next_due(kind: str, spec: str, after: float) -> float | None:
    """The first due time strictly after `after` (None: an ``at`` that has passed)."""
    if kind == "every":
        return after + every_seconds(spec)
    if kind == "at":
        when = at_time(spec)
        return when if when > after else None
    from cronsim import CronSim

    _cron(spec)  # checked
    return next(CronSim(spec, _local(after))).timestamp()


def check_when(kind: str, spec: str, now: float) -> float:
    """The first due time of a new (or resumed) schedule; ScheduleError when none."""
    if kind not in KINDS:
        raise ScheduleError(f"a schedule runs by cron, every or at, not {kind!r}")
    if not spec.strip() or len(spec) > SPEC_MAX_CHARS:
        raise ScheduleError(f"{kind}: expected 1 to {SPEC_MAX_CHARS} characters")
    if kind == "at":
        when = at_time(spec)
        if when <= now:
            raise ScheduleError(f"at {spec!r}: that time has passed")
        if when > now + AT_MAX_AHEAD_SEC:
            raise ScheduleError(f"at {spec!r}: at most 366 days ahead")
        return when
    due = next_due(kind, spec, now)
    assert due is not None
    return due


@attrs.frozen(kw_only=True)
class ScheduleSpec:
    """A schedule as a client asks for it (checked by `Scheduler.add`)."""

    session_id: str | None  # None: a new session each run
    profile_id: str | None
    kind: str
    spec: str
    message: str
    catch_up: bool = True
    budget: BudgetConfig | None = None


RESULT_MAX_CHARS = 2000  # a schedule_run notice's text (the history keeps it whole)


def notify_schedule_run(
    notices: UserNotices, session_id: str, msg: UserMessage, end: StreamEnd, now: float
) -> None:
    """A run ended (at wall time `now`): when it was a scheduled one, its owner's
    clients hear how."""
    if msg.kind != "schedule" or msg.schedule_id is None:
        return
    text = clip(end.text, RESULT_MAX_CHARS)
    notices.publish(msg.user_id, ScheduleRun(msg.schedule_id, session_id, end.reason, text, now))


@attrs.define(eq=False)
class Scheduler(NurseryHolder):
    """Runs every due schedule once per due time (see the module docstring).

    `clock` is the wall clock (a test passes one on trio's virtual time); `notices` the
    owners' clients. Only the daemon starts `run`: an embedded `navi run` keeps its hands
    off other people's schedules."""

    _store: SessionStore
    _settings: Settings
    _config: Callable[[], NaviConfig]
    _registry: Callable[[], SessionRegistry | None]
    clock: Callable[[], float] = attrs.field(default=time.time, kw_only=True)
    _notices: UserNotices | None = attrs.field(default=None, kw_only=True)
    pid: int = attrs.field(factory=os.getpid, init=False)
    host: str = attrs.field(factory=socket.gethostname, init=False)
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    # Due times before it were missed by a dead daemon.
    started_at: float = attrs.field(default=math.inf, init=False)
    _begun: int = attrs.field(default=0, init=False)  # looks at the schedules begun so far
    _ended: int = attrs.field(default=0, init=False)  # and ended
    _looked: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def on_start(self) -> None:
        self.started_at = self.clock()
        self.nursery.start_soon(self._loop)

    def poke(self) -> None:
        """A schedule changed here: look again now."""
        self._changed.set()

    async def look_now(self) -> None:
        """Returns once a look at the schedules begun after this call has ended (e.g. a
        test that moved the wall clock: what was due then has been claimed)."""
        target = self._begun + 1
        self.poke()
        while self._ended < target:
            await self._looked.wait()

    # -- the API of the wire (ownership is the caller's, api/commands.py) ------------

    async def add(self, user_id: str, want: ScheduleSpec, *, role: str = "user") -> ScheduleRow:
        """Store the schedule of `user_id` (of `role`: its profile must be one the role
        may use), or refuse it naming why."""
        limit = self._settings.schedules_per_user
        if await self._store.count_schedules(user_id) >= limit:
            raise LimitError(
                f"you have {limit} schedules already (NAVI_SCHEDULES_PER_USER): remove one first"
            )
        if not want.message.strip():
            raise ScheduleError("the message of a schedule must not be empty")
        if len(want.message) > MESSAGE_MAX_CHARS:
            raise ScheduleError(
                f"the message of a schedule is at most {MESSAGE_MAX_CHARS} characters, "
                f"not {len(want.message)}"
            )
        cfg = self._config()
        if want.profile_id is not None and want.profile_id not in cfg.profiles:
            raise ScheduleError(
                f"unknown profile {want.profile_id!r} (profiles: {', '.join(sorted(cfg.profiles))})"
            )
        refused = None if want.profile_id is None else cfg.refuse_profile(role, want.profile_id)
        if refused is not None:
            raise ForbiddenError(refused)
        due = check_when(want.kind, want.spec, self.clock())
        if await self._store.get_user(user_id) is None:
            # A schedule runs as its owner, and one no user of the store owns would be
            # deleted unrun when due (`_fire`): the person at a shell that serves itself
            # (`navi schedule add` with no daemon) is none.
            raise ForbiddenError(
                "a schedule runs in a daemon, as one of its users: start one with `navi "
                "serve` (or name it with --url) and add the schedule there"
            )
        row = ScheduleRow(
            id="sch-" + secrets.token_hex(6),
            user_id=user_id,
            session_id=want.session_id,
            profile_id=want.profile_id,
            kind=want.kind,
            spec=want.spec.strip(),
            message=want.message,
            catch_up=want.catch_up,
            paused=False,
            next_due=due,
            created_at=self.clock(),
            budget={} if want.budget is None else budgets_dict(want.budget),
        )
        await self._store.create_schedule(row)
        log.info("schedule %s added (%s %s) by %s", row.id, row.kind, row.spec, user_id)
        self.poke()
        return row

    async def list(self, user_id: str | None) -> list[ScheduleRow]:
        """The user's schedules (None: everyone's), oldest first."""
        return await self._store.list_schedules(user_id)

    async def get(self, schedule_id: str) -> ScheduleRow:
        row = await self._store.get_schedule(schedule_id)
        if row is None:
            raise NotFoundError(f"no schedule {schedule_id!r}")
        return row

    async def remove(self, row: ScheduleRow) -> bool:
        removed = await self._store.delete_schedule(row.id)
        self.poke()
        return removed

    async def pause(self, row: ScheduleRow) -> ScheduleRow:
        await self._store.set_schedule(row.id, paused=True, next_due=row.next_due)
        return attrs.evolve(row, paused=True)

    async def resume(self, row: ScheduleRow) -> ScheduleRow:
        """Runs again from now on: its next due time after now (an ``at`` keeps its
        time, which must not have passed)."""
        due = check_when(row.kind, row.spec, self.clock())
        await self._store.set_schedule(row.id, paused=False, next_due=due)
        self.poke()
        return attrs.evolve(row, paused=False, next_due=due)

    async def _loop(self) -> None:
        while True:
            self._changed = trio.Event()
            self._begun += 1
            try:
                rows = await self._store.list_schedules()
            except NaviError as exc:
                log.warning("reading the schedules failed: %s", exc)
                rows = []
            for row in rows:
                if not row.paused and row.next_due is not None and row.next_due <= self.clock():
                    await self._due(row)
            self._ended += 1
            self._looked.set()
            self._looked = trio.Event()
            dues = [r.next_due for r in rows if not r.paused and r.next_due is not None]
            wait = self._settings.schedule_poll_sec
            if dues:
                wait = min(wait, max(min(dues) - self.clock(), 0.0))
            with trio.move_on_after(wait):
                await self._changed.wait()

    async def _due(self, row: ScheduleRow) -> None:
        assert row.next_due is not None
        now = self.clock()
        following = next_due(row.kind, row.spec, max(now, row.next_due))
        missed = row.next_due < self.started_at  # fell due while no daemon ran
        try:
            if missed and not row.catch_up:
                if await self._store.claim_schedule(
                    row.id, due=row.next_due, next_due=following, run=None
                ):
                    log.info("schedule %s: a due time missed while down is skipped", row.id)
                return
            await self._fire(row, following)
        except NaviError as exc:  # the store, a session gone: the next look tries again
            log.warning("schedule %s: its run could not start: %s", row.id, exc)

    async def _fire(self, row: ScheduleRow, following: float | None) -> None:
        assert row.next_due is not None
        owner = await self._store.get_user(row.user_id)
        if owner is None:
            # Its owner was removed (the store removes their schedules with them; this
            # one was added as they went): it belongs to nobody, and never runs.
            await self._store.delete_schedule(row.id)
            log.warning(
                "schedule %s: its owner %s was removed: deleted, not run", row.id, row.user_id
            )
            return
        role = str(owner["role"])
        budget = parse_budgets(row.budget) if row.budget else None
        new: NewSession | None = None
        session_id = row.session_id
        if session_id is None:
            session_id = "s-" + secrets.token_hex(6)
            profile = row.profile_id or self._config().default_profile
            new = NewSession(session_id, profile, row.user_id, row.message[:80])
        message = to_row(
            UserMessage(
                row.message,
                user_id=row.user_id,
                user_role=role,
                kind="schedule",
                headless=True,
                budget=budget,
                schedule_id=row.id,
            )
        )
        key = "sched-" + secrets.token_hex(8)
        claimed = await self._store.claim_schedule(
            row.id,
            due=row.next_due,
            next_due=following,
            run=QueuedRow(session_id, key, message, self.pid, self.host),
            session=new,
            sessions_max=None if new is None else self._settings.sessions_per_user,
        )
        if not claimed:
            return  # another daemon ran it, or it changed meanwhile
        if claimed.skipped is not None:
            log.warning("schedule %s: its run was skipped: %s", row.id, claimed.skipped)
            if self._notices is not None:
                skipped = ScheduleRun(row.id, None, "skipped", claimed.skipped, self.clock())
                self._notices.publish(row.user_id, skipped)
            return
        log.info("schedule %s: runs in session %s", row.id, session_id)
        registry = self._registry()
        if registry is not None:
            await deliver(registry, session_id, key, message)
