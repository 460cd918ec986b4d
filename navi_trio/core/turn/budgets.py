"""Budgets that fail closed: what a run may spend, reserved before, counted after.

A `Budget` is a chain of `Meter`s, one per scope with a limit, its own first: a turn's
``turn``, ``session`` and ``user_day``; a sub-agent's ``subagent`` then its parent's chain,
so a tree of sub-agents never spends more than its parent may. Before each LLM or tool
call the run takes what it may spend from every meter, or `BudgetExhaustedError` ends
the turn; an LLM call reserves its prompt plus its output cap (cut to what is left) and
gives back what it did not use.

``turn`` and ``subagent`` meters live in this process. ``session`` and ``user_day`` are
shared with other runs and daemons, so they are reserved in the store atomically
(`SessionStore.reserve_usage`) as holds, settled by `flush`; a dead process's hold
expires. A scope without a limit is not counted.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from navi_trio.errors import BudgetExhaustedError, StoreError
from navi_trio.events import BudgetLine, BudgetReport
from navi_trio.profiles import NO_BUDGETS, BudgetConfig, BudgetLimits, NaviConfig
from navi_trio.profiles._control import KINDS
from navi_trio.store.base import UsageAsk, UsageGrant, UsageRequest
from navi_trio.store.methods import SessionStore

log = logging.getLogger(__name__)

PERSISTENT = ("session", "user_day")
SPAWN_TOOL = "spawn_agent"
HOLD_SEC = 900.0  # how long a token hold lasts at most (NAVI_BUDGET_HOLD_SEC)


def usage_key(scope: str, *, session_id: str, user_id: str, now: float | None = None) -> str:
    """The store key of a persistent scope's counters (a user's day is a UTC date)."""
    if scope == "session":
        return f"session:{session_id}"
    day = time.strftime("%Y-%m-%d", time.gmtime(time.time() if now is None else now))
    return f"user:{user_id}:{day}"


@attrs.define(eq=False)
class Meter:
    """One scope's limits and what was spent against them: a persistent meter (`key` set)
    knows the store's totals at its last read plus what it has not written yet (`pending`)."""

    scope: str
    limits: BudgetLimits
    key: str | None = None
    started: float = attrs.field(factory=trio.current_time)
    base: dict[str, float] = attrs.field(factory=lambda: dict.fromkeys(KINDS, 0.0))
    pending: dict[str, float] = attrs.field(factory=lambda: dict.fromkeys(KINDS, 0.0))
    # Tokens the LLM calls under way may still spend (their prompt and output cap):
    # counted as spent until each call reports what it really used. In-memory meters
    # only: a persistent meter's reservations are holds in the store.
    reserved: float = 0.0

    def spent(self, kind: str) -> float:
        if kind == "wall_sec" and self.key is None:
            return trio.current_time() - self.started
        held = self.reserved if kind == "tokens" else 0.0
        return self.base[kind] + self.pending[kind] + held

    def add(self, kind: str, amount: float) -> None:
        self.pending[kind] += amount

    def left(self, kind: str) -> float:
        limit = getattr(self.limits, kind)
        return math.inf if limit is None else limit - self.spent(kind)

    def ask(self) -> UsageAsk:
        """This meter's limits, for a reservation in the store."""
        limits = {kind: float(limit) for kind, limit in self.limits.items()}
        return UsageAsk(self.key or "", limits)


def effective(
    config: NaviConfig, profile_id: str, role: str, asked: BudgetConfig | None
) -> BudgetConfig:
    """The budgets of a run: the profile's, the role's and the message's, lowest wins."""
    budgets = config.profile(profile_id).budgets.tighter(config.role_budgets.get(role, NO_BUDGETS))
    return budgets if asked is None else budgets.tighter(asked)


class Budget:
    """The meters one run spends against, its own first (see the module docstring)."""

    def __init__(
        self,
        store: SessionStore | None,
        meters: list[Meter],
        *,
        budgets: BudgetConfig = NO_BUDGETS,
        wall_owner: bool,
        hold_sec: float = HOLD_SEC,
    ) -> None:
        self._store = store
        self.meters = meters
        # Counted in the store (reserved there), or in this process.
        self._shared = [m for m in meters if m.key is not None and store is not None]
        self._local = [m for m in meters if m not in self._shared]
        # The top-level run's budgets (profile, role, message): its sub-agents' come
        # from their `subagent` scope.
        self.budgets = budgets
        self._wall_owner = wall_owner  # it charges the persistent scopes' wall time
        self._wall_mark = trio.current_time()
        self._held = 0.0  # tokens this run's LLM call under way reserved (local meters)
        self._holds: list[str] = []  # its holds in the store not settled yet
        self._hold_sec = hold_sec

    @classmethod
    def for_turn(
        cls,
        store: SessionStore,
        budgets: BudgetConfig,
        *,
        session_id: str,
        user_id: str,
        hold_sec: float = HOLD_SEC,
    ) -> Budget:
        meters = []
        for scope in ("turn", *PERSISTENT):
            limits = budgets.scope(scope)
            if limits.empty:
                continue
            key = None
            if scope in PERSISTENT:
                key = usage_key(scope, session_id=session_id, user_id=user_id)
            meters.append(Meter(scope, limits, key))
        return cls(store, meters, budgets=budgets, wall_owner=True, hold_sec=hold_sec)

    def child(self, limits: BudgetLimits, *, background: bool) -> Budget:
        """The budget of a sub-agent this run spawns: its own meter, then this chain. A background
        one charges the persistent scopes' wall time itself: no turn waits for it."""
        mine = limits.tighter(self.budgets.subagent)
        own = [] if mine.empty else [Meter("subagent", mine)]
        return Budget(
            self._store,
            [*own, *self.meters],
            budgets=self.budgets,
            wall_owner=background,
            hold_sec=self._hold_sec,
        )

    @property
    def active(self) -> bool:
        return bool(self.meters)

    def charge_tokens(self, tokens: int) -> None:
        """An LLM call's real usage: its reservation gives way to it (the store's hold
        is settled with it at the next `flush`)."""
        self.release()
        for meter in self.meters:
            meter.add("tokens", tokens)

    def release(self) -> None:
        """Drop the in-memory reservation of this run's last LLM call (it ended, or
        failed); its hold in the store goes at the next `flush`."""
        for meter in self._local:
            meter.reserved -= self._held
        self._held = 0.0

    def _hold(self, tokens: float) -> None:
        self.release()
        for meter in self._local:
            meter.reserved += tokens
        self._held = tokens

    async def flush(self) -> None:
        """Write what the persistent meters spent since and settle this run's holds (one
        transaction), and read their totals back. What could not be written stays
        pending for the next flush."""
        persistent = [m for m in self.meters if m.key is not None]
        if not persistent or self._store is None:
            return
        now = trio.current_time()
        if self._wall_owner:
            for meter in persistent:
                meter.add("wall_sec", now - self._wall_mark)
            self._wall_mark = now
        adds: dict[str, dict[str, float]] = {}
        for meter in persistent:
            adds[meter.key or ""], meter.pending = meter.pending, dict.fromkeys(KINDS, 0.0)
        holds, self._holds = self._holds, []
        try:
            totals = await self._store.settle_usage(adds, release=holds)
        except BaseException:
            for meter in persistent:  # not written: still to write
                for kind, amount in adds[meter.key or ""].items():
                    meter.pending[kind] += amount
            self._holds = holds + self._holds
            raise
        for meter in persistent:
            meter.base = dict(totals[meter.key or ""])

    async def settle(self) -> None:
        """After an LLM call: its use written and its hold dropped, freeing the rest for other
        runs at once; a store failure here waits for the next `flush` (which fails closed)."""
        if not self._shared:
            return
        try:
            await self.flush()
        except StoreError as exc:
            log.warning("writing a budget's spending failed (kept for the next try): %s", exc)

    async def close(self) -> None:
        """The run is over: nothing is reserved any more, what it spent is stored."""
        self.release()
        await self.flush()

    def _exhausted(self, meter: Meter, kind: str) -> BudgetExhaustedError:
        limit = getattr(meter.limits, kind)
        return BudgetExhaustedError(meter.scope, kind, spent=meter.spent(kind), limit=limit)

    def _check(self, kinds: tuple[str, ...], need: dict[str, float] | None = None) -> None:
        """The in-memory meters: each kind within its limit with `need` added."""
        need = need or {}
        for meter in self._local:
            for kind in kinds:
                limit = getattr(meter.limits, kind)
                if limit is None:
                    continue
                if meter.spent(kind) + need.get(kind, 0.0) > limit or (
                    kind in ("tokens", "wall_sec") and meter.spent(kind) >= limit
                ):
                    raise self._exhausted(meter, kind)

    async def _take(self, request: UsageRequest) -> UsageGrant | None:
        """Take `request` from every shared meter in the store, or be refused: the error
        names the budget and what is used of it (spent, and held by calls under way)."""
        if not self._shared or self._store is None:
            return None
        request = attrs.evolve(request, pid=os.getpid(), host=socket.gethostname())
        grant = await self._store.reserve_usage([m.ask() for m in self._shared], request)
        for meter in self._shared:
            meter.base = dict(grant.spent[meter.key or ""])
        if grant.refused is not None:
            key, kind = grant.refused
            meter = next(m for m in self._shared if m.key == key)
            used = grant.spent[key][kind] + meter.pending[kind]
            limit = getattr(meter.limits, kind)
            raise BudgetExhaustedError(
                meter.scope, kind, spent=used, limit=limit, held=grant.held[key][kind]
            )
        if request.hold is not None:
            self._holds.append(request.hold)
        return grant

    async def before_llm(self, prompt_tokens: int, cap: int) -> int:
        """Reserve an LLM call of `prompt_tokens` (an estimate): the output cap (`cap`)
        cut to the tokens every meter has left after that prompt; refused below 1."""
        if not self.active:
            return cap
        self.release()  # a call that reported nothing (failed, stopped) holds no more
        await self.flush()
        self._check(("tokens", "wall_sec"))
        if self._local:
            left = min(meter.left("tokens") for meter in self._local) - prompt_tokens
            if left < 1:
                meter = min(self._local, key=lambda m: m.left("tokens"))
                raise self._exhausted(meter, "tokens")
            cap = int(min(cap, left))
        grant = await self._take(
            UsageRequest(
                want={"tokens": float(prompt_tokens + cap)},
                least={"tokens": float(prompt_tokens + 1)},
                full=("wall_sec",),
                hold="h-" + secrets.token_hex(8),
                ttl=self._hold_sec,
            )
        )
        if grant is not None:
            cap = int(min(cap, grant.granted["tokens"] - prompt_tokens))
        # Reserved until the call reports its usage: calls of sub-agents running beside
        # this one see it as spent, so together they never pass a shared limit.
        self._hold(prompt_tokens + cap)
        return cap

    async def before_tool(self, name: str) -> None:
        """Check before a tool call, then count it (and a spawn_agent as a sub-agent)."""
        if not self.active:
            return
        await self.flush()
        need = {"tool_calls": 1.0, "subagents": 1.0 if name == SPAWN_TOOL else 0.0}
        self._check(("wall_sec", "tool_calls", "subagents"), need)
        wanted = {kind: amount for kind, amount in need.items() if amount}
        await self._take(UsageRequest(want=wanted, full=("wall_sec",)))  # spent at once
        for meter in self._local:
            for kind, amount in wanted.items():
                meter.add(kind, amount)

    def deadline(self) -> float:
        """When the first wall-time limit of the chain is reached (trio time; inf: none)."""
        now = trio.current_time()
        return min((now + meter.left("wall_sec") for meter in self.meters), default=math.inf)

    @contextmanager
    def wall(self) -> Iterator[None]:
        """Around one LLM call or tool round: cut at the first wall-time limit, which
        then raises BudgetExhaustedError (what the call produced so far stays)."""
        deadline = self.deadline()
        if deadline == math.inf:
            yield
            return
        with trio.move_on_at(deadline) as scope:
            yield
        if scope.cancelled_caught:
            meter = min(self.meters, key=lambda m: m.left("wall_sec"))
            raise self._exhausted(meter, "wall_sec")

    def lines(self) -> Iterator[BudgetLine]:
        for meter in self.meters:
            for kind, limit in meter.limits.items():
                spent = meter.spent(kind)
                yield BudgetLine(scope=meter.scope, kind=kind, spent=_shown(spent), limit=limit)

    def report(self) -> BudgetReport | None:
        """The `budget` event of a round (None without an active budget)."""
        if not self.active:
            return None
        return BudgetReport(budgets=tuple(self.lines()))


def _shown(value: float) -> Any:
    """Whole counts as ints, wall time to the millisecond."""
    return int(value) if float(value).is_integer() else round(value, 3)
