"""The control part of a profile: what a message does when its session is busy
(`OnBusy`), and the budgets a run may spend (`BudgetConfig`).

A budget is a set of limits (`BudgetLimits`: tokens, wall time, tool calls, sub-agents)
for one scope: a ``turn``, a ``session``, a ``user_day`` (one user's runs in a UTC day)
and a ``subagent``. config.json sets them per profile and per role; a message may only
lower them; where two apply the lower limit wins (`tighter`).

Every number is bounded here, whoever sends it: a limit is a whole number from 0 up to
its `MAXIMA`, wall time a number of seconds above 0.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import attrs

OnBusy = Literal["enqueue", "reject", "interrupt", "steer"]
ON_BUSY: tuple[OnBusy, ...] = ("enqueue", "reject", "interrupt", "steer")

# What a limit may be at most (a bigger number is a mistake, not a budget).
MAXIMA: dict[str, float] = {
    "tokens": 10**12,
    "wall_sec": 366 * 86400.0,
    "tool_calls": 10**7,
    "subagents": 10**6,
}
KINDS = tuple(MAXIMA)
SCOPES = ("turn", "session", "user_day", "subagent")


def _limit(inst: Any, attr: attrs.Attribute[Any], value: float | None) -> None:
    if value is None:
        return
    top = MAXIMA[attr.name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{attr.name} must be a number, not {value!r}")
    if attr.name == "wall_sec":
        if not math.isfinite(value) or not 0 < value <= top:
            raise ValueError(f"{attr.name} must be above 0 and at most {int(top)}, not {value!r}")
        return
    if not isinstance(value, int) or not 0 <= value <= top:
        raise ValueError(f"{attr.name} must be a whole number from 0 to {int(top)}, not {value!r}")


@attrs.frozen(kw_only=True)
class BudgetLimits:
    """The limits of one scope; None: no limit of that kind."""

    tokens: int | None = attrs.field(default=None, validator=_limit)
    wall_sec: float | None = attrs.field(default=None, validator=_limit)
    tool_calls: int | None = attrs.field(default=None, validator=_limit)
    subagents: int | None = attrs.field(default=None, validator=_limit)

    def items(self) -> list[tuple[str, float]]:
        """(kind, limit) of the limits set."""
        out: list[tuple[str, float]] = []
        for kind in KINDS:
            value = getattr(self, kind)
            if value is not None:
                out.append((kind, value))
        return out

    def tighter(self, other: BudgetLimits) -> BudgetLimits:
        """Each limit the lower of the two (a missing one is no limit)."""
        return BudgetLimits(**{k: _low(getattr(self, k), getattr(other, k)) for k in KINDS})

    @property
    def empty(self) -> bool:
        return not self.items()


def _low(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


@attrs.frozen(kw_only=True)
class BudgetConfig:
    """The budgets of the four scopes (each empty by default: no limit)."""

    turn: BudgetLimits = BudgetLimits()
    session: BudgetLimits = BudgetLimits()
    user_day: BudgetLimits = BudgetLimits()
    subagent: BudgetLimits = BudgetLimits()

    def tighter(self, other: BudgetConfig) -> BudgetConfig:
        return BudgetConfig(**{s: getattr(self, s).tighter(getattr(other, s)) for s in SCOPES})

    def scope(self, name: str) -> BudgetLimits:
        limits: BudgetLimits = getattr(self, name)
        return limits

    @property
    def empty(self) -> bool:
        return all(self.scope(s).empty for s in SCOPES)


NO_BUDGETS = BudgetConfig()


def parse_budgets(data: Any, where: str = "budget") -> BudgetConfig:
    """A client's (or a schedule's) budget object, shaped as config.json's ``budgets``, as a
    BudgetConfig; ValueError naming the field and the problem."""
    if not isinstance(data, dict):
        raise ValueError(f'{where} must be an object like {{"turn": {{"tokens": 5000}}}}')
    unknown = sorted(str(k) for k in data if k not in SCOPES)
    if unknown:
        raise ValueError(
            f"{where}: unknown scope {unknown[0][:32]!r} (scopes: {', '.join(SCOPES)})"
        )
    scopes: dict[str, BudgetLimits] = {}
    for scope, limits in data.items():
        if not isinstance(limits, dict):
            raise ValueError(f'{where}.{scope} must be an object like {{"tokens": 5000}}')
        bad = sorted(str(k) for k in limits if k not in KINDS)
        if bad:
            raise ValueError(
                f"{where}.{scope}: unknown limit {bad[0][:32]!r} (limits: {', '.join(KINDS)})"
            )
        try:
            scopes[scope] = BudgetLimits(**limits)
        except ValueError as exc:
            raise ValueError(f"{where}.{scope}.{exc}") from None
    return BudgetConfig(**scopes)


def budgets_dict(config: BudgetConfig) -> dict[str, dict[str, float]]:
    """The limits set, in `parse_budgets`' shape (empty scopes left out)."""
    out: dict[str, dict[str, float]] = {}
    for scope in SCOPES:
        items = config.scope(scope).items()
        if items:
            out[scope] = dict(items)
    return out
