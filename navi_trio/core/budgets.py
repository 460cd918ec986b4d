"""Budgets that fail closed (issue 23): what a run may spend, counted and checked.

The limits (profiles/_control.py: tokens, wall time, tool calls, sub-agents) apply to
four scopes. A `Budget` is what one run spends against: a chain of `Meter`s, one per
scope that has a limit, its own first, then its parent's:

- a top-level turn: its ``turn`` meter, the session's, the user's day's;
- a sub-agent (synchronous or background): its ``subagent`` meter, then the chain of
  the turn (or sub-agent) that spawned it. Whatever a sub-agent spends counts against
  every meter of the chain, so a tree of sub-agents (parallel and background ones
  included) can never spend more than its parent turn, session and user may; a child
  whose parent has less left than its own budget gets only what is left.

Before each LLM call and each tool call the run checks every meter (`before_llm`,
`before_tool`): one spent to its limit raises `BudgetExhaustedError` (which budget,
what was spent, the limit), and the turn ends with ``budget_exhausted``, saved as a
stop is. A call is also sized to what is left: an LLM call's output cap is cut to the
tokens left after its prompt, and the wall-time deadline bounds each call
(`deadline`). After each round the turn emits a `budget` event (`report`).

The ``session`` and ``user_day`` meters are counted in the store (``usage`` table, keys
``session:<id>`` and ``user:<id>:<UTC day>``): spending is added there (`flush`) and
read back (`refresh`) before each check, so the counters survive a restart and several
daemons sharing a store count together. Wall time of those scopes is the time runs
were going: charged by top-level turns and background sub-agents (a synchronous
sub-agent's time is already its parent's). A scope without a limit is not counted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from navi_trio.errors import BudgetExhaustedError
from navi_trio.events import BudgetLine, BudgetReport
from navi_trio.profiles import NO_BUDGETS, BudgetConfig, BudgetLimits, NaviConfig
from navi_trio.profiles._control import KINDS
from navi_trio.store.base import SessionStore

PERSISTENT = ("session", "user_day")
SPAWN_TOOL = "spawn_agent"


def usage_key(scope: str, *, session_id: str, user_id: str, now: float | None = None) -> str:
    """The store key of a persistent scope's counters (a user's day is a UTC date)."""
    if scope == "session":
        return f"session:{session_id}"
    day = time.strftime("%Y-%m-%d", time.gmtime(time.time() if now is None else now))
    return f"user:{user_id}:{day}"


@attrs.define(eq=False)
class Meter:
    """One scope's limits and what was spent against them.

    A persistent meter (`key` set) knows the store's totals as of its last `refresh`
    (`base`) plus what this process spent since and has not written yet (`pending`);
    an in-memory one (turn, sub-agent) counts everything in `pending` and measures wall
    time from `started` (trio time)."""

    scope: str
    limits: BudgetLimits
    key: str | None = None
    started: float = attrs.field(factory=trio.current_time)
    base: dict[str, float] = attrs.field(factory=lambda: dict.fromkeys(KINDS, 0.0))
    pending: dict[str, float] = attrs.field(factory=lambda: dict.fromkeys(KINDS, 0.0))
    # Tokens the LLM calls under way may still spend (their prompt and output cap):
    # counted as spent until each call reports what it really used.
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
        own: int,
    ) -> None:
        self._store = store
        self.meters = meters
        # The top-level run's budgets (profile, role, message): its sub-agents' come
        # from their `subagent` scope.
        self.budgets = budgets
        self._own = own  # how many of `meters` are this run's own (not its parent's)
        self._wall_owner = wall_owner  # it charges the persistent scopes' wall time
        self._wall_mark = trio.current_time()
        self._held = 0.0  # tokens this run's LLM call under way reserved

    @classmethod
    def for_turn(
        cls,
        store: SessionStore,
        budgets: BudgetConfig,
        *,
        session_id: str,
        user_id: str,
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
        return cls(store, meters, budgets=budgets, wall_owner=True, own=len(meters))

    def child(self, limits: BudgetLimits, *, background: bool) -> Budget:
        """The budget of a sub-agent this run spawns (`limits`: its profile's subagent
        scope, lowered by the run's own): its own meter, then this chain. A background
        one charges the persistent scopes' wall time itself: no turn waits for it."""
        mine = limits.tighter(self.budgets.subagent)
        own = [] if mine.empty else [Meter("subagent", mine)]
        return Budget(
            self._store, [*own, *self.meters], budgets=self.budgets, wall_owner=background,
            own=len(own),
        )  # fmt: skip

    @property
    def active(self) -> bool:
        return bool(self.meters)

    # -- counting ------------------------------------------------------------------

    def charge_tokens(self, tokens: int) -> None:
        """An LLM call's real usage: its reservation gives way to it."""
        self.release()
        for meter in self.meters:
            meter.add("tokens", tokens)

    def release(self) -> None:
        """Drop the reservation of this run's last LLM call (it ended, or failed)."""
        for meter in self.meters:
            meter.reserved -= self._held
        self._held = 0.0

    def _hold(self, tokens: float) -> None:
        self.release()
        for meter in self.meters:
            meter.reserved += tokens
        self._held = tokens

    def _charge(self, kind: str, amount: float = 1.0) -> None:
        for meter in self.meters:
            meter.add(kind, amount)

    async def flush(self) -> None:
        """Write what the persistent meters spent since, and read their totals back."""
        persistent = [m for m in self.meters if m.key is not None]
        if not persistent or self._store is None:
            return
        now = trio.current_time()
        if self._wall_owner:
            for meter in persistent:
                meter.add("wall_sec", now - self._wall_mark)
            self._wall_mark = now
        for meter in persistent:
            amounts, meter.pending = meter.pending, dict.fromkeys(KINDS, 0.0)
            try:
                await self._store.add_usage([meter.key or ""], amounts)
            except BaseException:
                for kind, amount in amounts.items():  # not written: still to write
                    meter.pending[kind] += amount
                raise
        totals = await self._store.get_usage([m.key or "" for m in persistent])
        for meter in persistent:
            meter.base = dict(totals[meter.key or ""])

    async def close(self) -> None:
        """The run is over: nothing is reserved any more, what it spent is stored."""
        self.release()
        await self.flush()

    # -- checks --------------------------------------------------------------------

    def _exhausted(self, meter: Meter, kind: str) -> BudgetExhaustedError:
        limit = getattr(meter.limits, kind)
        return BudgetExhaustedError(meter.scope, kind, spent=meter.spent(kind), limit=limit)

    def _check(self, kinds: tuple[str, ...], need: dict[str, float] | None = None) -> None:
        need = need or {}
        for meter in self.meters:
            for kind in kinds:
                limit = getattr(meter.limits, kind)
                if limit is None:
                    continue
                if meter.spent(kind) + need.get(kind, 0.0) > limit or (
                    kind in ("tokens", "wall_sec") and meter.spent(kind) >= limit
                ):
                    raise self._exhausted(meter, kind)

    async def before_llm(self, prompt_tokens: int, cap: int) -> int:
        """Check before an LLM call of `prompt_tokens` (an estimate); the output cap
        (`cap`) cut to the tokens every meter has left after that prompt."""
        if not self.active:
            return cap
        self.release()  # a call that reported nothing (failed, stopped) holds no more
        await self.flush()
        self._check(("tokens", "wall_sec"))
        left = min(meter.left("tokens") for meter in self.meters) - prompt_tokens
        if left < 1:
            meter = min(self.meters, key=lambda m: m.left("tokens"))
            raise self._exhausted(meter, "tokens")
        cap = int(min(cap, left))
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
        self._charge("tool_calls")
        if name == SPAWN_TOOL:
            self._charge("subagents")

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
