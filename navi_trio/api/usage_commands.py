"""The ``usage`` command: what the runs spent, as the accounts kept it (store `run_usage`).

A user sees their own runs only (an admin everyone's, or one user's by name); a session
must be the asker's (checked by the caller). Lines are summed by the group asked for
(model, profile, day, session, user), split by model and by kind (the run's own turn, a
synchronous sub-agent, a background job: both billed to the session that started them),
with the cost where config.json prices the model (``models.NAME.price_in`` /
``price_out``, per million tokens; the embedded model costs 0).
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from navi_trio.api.auth import User
from navi_trio.api.command_frames import Usage
from navi_trio.errors import ForbiddenError, NotFoundError, ProtocolError
from navi_trio.store.base import UsageLine

if TYPE_CHECKING:
    from navi_trio.api.services import DaemonCore

_SPAN = re.compile(r"(\d{1,6})\s*([dhm])")
_SPAN_SEC = {"d": 86400, "h": 3600, "m": 60}


def since_epoch(text: str, now: float) -> float:
    """``7d`` / ``12h`` / ``30m`` before `now`, an ISO date or time, or epoch seconds."""
    text = text.strip()
    span = _SPAN.fullmatch(text)
    if span:
        return now - int(span.group(1)) * _SPAN_SEC[span.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ProtocolError(
            f"since {text!r}: give a span (7d, 12h, 30m), a date (2026-12-01) or epoch seconds"
        ) from None


async def usage_report(core: DaemonCore, user: User, cmd: Usage) -> dict[str, Any]:
    """The reply's fields: ``lines`` and ``totals`` (tokens, seconds, cost)."""
    user_id: str | None = user.id
    if cmd.user is not None:
        if not user.is_admin and cmd.user != user.name:
            raise ForbiddenError("only an admin sees another user's usage")
        row = await core.store.get_user_by_name(cmd.user)
        if row is None:
            raise NotFoundError(f"no user {cmd.user!r}")
        user_id = str(row["id"])
    elif user.is_admin:
        user_id = None  # everyone's
    since = since_epoch(cmd.since, time.time()) if cmd.since is not None else None
    lines = await core.store.usage_report(
        by=cmd.by, user_id=user_id, session_id=cmd.session_id, since=since
    )
    models = core.config.current.models
    local = core.settings.llm_backend.strip().lower() == "local"
    views = [_view(line, _cost(line, models, local)) for line in lines]
    return {"by": cmd.by, "since": since, "lines": views, "totals": _totals(views)}


def _cost(line: UsageLine, models: Any, local: bool) -> float | None:
    price = models.get(line.model)
    if price is not None:
        cost: float | None = price.cost(line.tokens_in, line.tokens_out)
        return cost
    return 0.0 if local else None


def _view(line: UsageLine, cost: float | None) -> dict[str, Any]:
    return {
        "key": line.key,
        "model": line.model,
        "kind": line.kind,
        "runs": line.runs,
        "tokens_in": line.tokens_in,
        "tokens_out": line.tokens_out,
        "llm_sec": round(line.llm_sec, 3),
        "tool_sec": round(line.tool_sec, 3),
        "cost": cost,
    }


def _totals(views: list[dict[str, Any]]) -> dict[str, Any]:
    costs = [v["cost"] for v in views]
    return {
        "runs": sum(v["runs"] for v in views),
        "tokens_in": sum(v["tokens_in"] for v in views),
        "tokens_out": sum(v["tokens_out"] for v in views),
        "llm_sec": round(sum(v["llm_sec"] for v in views), 3),
        "tool_sec": round(sum(v["tool_sec"] for v in views), 3),
        # Known only when every line's is: a partial sum would read as the whole.
        "cost": sum(costs) if costs and None not in costs else (0.0 if not costs else None),
    }
