"""What one daemon asks of another and waits for: a stop, approvals, background tasks.

    await calls.approve(owner, session_id, call_id, approve=True, scope="once", user_id=u)
    stopped = await calls.stop(owner, session_id)       # True only if it stopped a turn
    jobs = await calls.jobs_elsewhere(session_ids)      # other daemons' running jobs
    reply = await calls.task("cancel", session_ids, task_id)   # {"task_id", "cancelled"}

A client's ``stop``, ``approve`` / ``deny`` or ``tasks cancel`` may reach a daemon that
does not run the turn, the call or the job. The api layer checks who asks; then the
owner is asked on its channel (``nd_…``) with a request id and the asker's owner id (for
an approval, the answering user too: the owner's broker checks it is the run's starter),
and it notifies the outcome back. The client's reply waits for it (at most
`ask_timeout`: NAVI_CLUSTER_ASK_TIMEOUT_SEC, 10 s by default) and says what happened,
as on one daemon. Asked while the listener is down, it is refused at once
(``storage``). Compact is a bare `Cluster.tell`.

Jobs other daemons run are read from their running markers (kv ``task_running``),
matched by (pid, host) to the live ``daemons`` rows. Every payload is checked field by
field: a malformed one is dropped with a warning, never acted on.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio

from navi_trio.core.jobs import RUNNING_SCOPE, task_info
from navi_trio.core.turn import SCOPES
from navi_trio.errors import (
    ForbiddenError,
    NaviError,
    NotFoundError,
    StorageError,
    UnavailableError,
)
from navi_trio.store.base import ClusterBus
from navi_trio.store.methods import SessionStore

log = logging.getLogger(__name__)

ASK_TIMEOUT_SEC = 10.0
FIELD_MAX = 300  # any id or name in a payload
ERROR_MAX = 500
APPROVE, CANCEL, STOP, ANSWER = "approve", "cancel_task", "stop_turn", "answer"


class Answers(Protocol):
    """core/turn/approvals.py `ApprovalBroker`."""

    async def answer(
        self, session_id: str, call_id: str, *, approve: bool, scope: str, user_id: str
    ) -> None: ...


class Cancels(Protocol):
    """core/jobs/task_supervisor.py `TaskSupervisor`."""

    def cancel(self, session_id: str, task_id: str) -> bool: ...


@attrs.define(eq=False)
class _Asked:
    done: trio.Event = attrs.Factory(trio.Event)
    answer: dict[str, Any] = attrs.Factory(dict)


@attrs.define(eq=False)
class OwnerCalls:
    """Asks other daemons, and answers what they ask of this one (see the module)."""

    bus: ClusterBus
    store: SessionStore
    owner: str
    channel: Callable[[str], str]  # owner id -> its channel (cluster.py daemon_channel)
    ask_timeout: float = ASK_TIMEOUT_SEC  # an ask unanswered this long is UnavailableError
    approvals: Answers | None = attrs.field(default=None, init=False)
    jobs: Cancels | None = attrs.field(default=None, init=False)
    stops: Callable[[str], bool] | None = attrs.field(default=None, init=False)  # stop a turn
    _asked: dict[str, _Asked] = attrs.field(factory=dict, init=False)

    def attach(
        self,
        approvals: Answers | None,
        jobs: Cancels | None,
        stops: Callable[[str], bool] | None = None,
    ) -> None:
        self.approvals = approvals
        self.jobs = jobs
        self.stops = stops

    async def approve(
        self,
        owner: str,
        session_id: str,
        call_id: str,
        *,
        approve: bool,
        scope: str,
        user_id: str,
    ) -> None:
        """`user_id`'s answer to a call waiting on daemon `owner`; NotFoundError when it
        waits there no longer, ForbiddenError when its run is another user's."""
        await self._ask(owner, APPROVE, session_id, c=call_id, a=approve, sc=scope, u=user_id)

    async def stop(self, owner: str, session_id: str) -> bool:
        """Stop the turn daemon `owner` runs in the session: whether one was stopped."""
        answer = await self._ask(owner, STOP, session_id)
        return answer.get("v") is True

    async def task(
        self, action: str, session_ids: list[str], task_id: str
    ) -> dict[str, Any] | None:
        """`tasks check` / `cancel` of a job another daemon runs in `session_ids` (the
        asker's): the reply's fields, or None when no other daemon runs it."""
        found = [j for j in await self.jobs_elsewhere(session_ids) if j["task_id"] == task_id]
        if not found:
            return None
        job = found[0]
        if action == "check":
            return {"task": job}
        answer = await self._ask(job["daemon"], CANCEL, job["session_id"], t=task_id)
        cancelled = answer.get("v") is True
        log.info("task %s of daemon %s cancelled there: %s", task_id, job["daemon"], cancelled)
        return {"task_id": task_id, "cancelled": cancelled}

    async def _ask(self, owner: str, kind: str, session_id: str, **fields: Any) -> dict[str, Any]:
        if not self.bus.up:
            raise StorageError(
                "the cluster's listener is not connected to the database (it is connecting"
                f" again): the daemon running session {session_id!r} cannot be asked now;"
                " try again shortly"
            )
        rid = secrets.token_hex(8)
        asked = self._asked[rid] = _Asked()
        payload = {"k": kind, "s": session_id, "r": rid, "o": self.owner, **fields}
        try:
            await self.bus.notify([(self.channel(owner), json.dumps(payload))])
            with trio.move_on_after(self.ask_timeout):
                await asked.done.wait()
        finally:
            del self._asked[rid]
        if not asked.done.is_set():
            raise UnavailableError(
                f"the daemon running session {session_id!r} did not answer within "
                f"{self.ask_timeout:g} s; try again"
            )
        error = asked.answer.get("e")
        if asked.answer.get("nf"):
            raise NotFoundError(str(error))
        if asked.answer.get("fb"):
            raise ForbiddenError(str(error), session_id=session_id)
        if error is not None:
            raise UnavailableError(f"the daemon running session {session_id!r}: {error}")
        return asked.answer

    async def jobs_elsewhere(self, session_ids: list[str]) -> list[dict[str, Any]]:
        """The running jobs of `session_ids` that other live daemons run, as `tasks`
        lists them (with ``daemon``: the owner id that runs it)."""
        wanted = set(session_ids)
        daemons = {(pid, host): o for o, pid, host in await self.bus.live_daemons()}
        jobs = []
        for _key, marker in await self.store.kv_list(RUNNING_SCOPE):
            info = _job(marker, daemons)
            if info is not None and info["session_id"] in wanted and info["daemon"] != self.owner:
                jobs.append(info)
        return jobs

    async def received(self, data: dict[str, Any]) -> bool:
        """Handle a notification on this daemon's channel if it is one of ours (True)."""
        kind = data.get("k")
        if kind == ANSWER:
            asked = self._asked.get(str(data.get("r")))
            if asked is not None and not asked.done.is_set():
                asked.answer = data
                asked.done.set()
            return True
        if kind not in (APPROVE, CANCEL, STOP):
            return False
        sid, rid, asker = _text(data, "s"), _text(data, "r"), _text(data, "o")
        if sid is None or rid is None or asker is None:
            log.warning("a cluster request without its session, id or asker: %.200r", data)
            return True
        answer: dict[str, Any] = {"k": ANSWER, "r": rid}
        try:
            answer["v"] = await self._do(kind, sid, data)
        except NotFoundError as exc:
            answer.update(e=str(exc)[:ERROR_MAX], nf=True)
        except ForbiddenError as exc:
            answer.update(e=str(exc)[:ERROR_MAX], fb=True)
        except (NaviError, ValueError) as exc:
            answer["e"] = str(exc)[:ERROR_MAX]
        await self.bus.notify([(self.channel(asker), json.dumps(answer))])
        return True

    async def _do(self, kind: str, sid: str, data: dict[str, Any]) -> bool:
        if kind == APPROVE:
            call_id, approve, scope = _text(data, "c"), data.get("a"), data.get("sc")
            user_id = _text(data, "u")
            if call_id is None or not isinstance(approve, bool) or scope not in SCOPES:
                raise ValueError(f"a malformed approval for session {sid!r}")
            if user_id is None:
                raise ValueError(f"an approval for session {sid!r} without its user")
            if self.approvals is None:
                raise NotFoundError(f"no approval request {call_id!r} waits here")
            await self.approvals.answer(
                sid, call_id, approve=approve, scope=str(scope), user_id=user_id
            )
            return True
        if kind == STOP:
            return self.stops is not None and self.stops(sid)
        task_id = _text(data, "t")
        if task_id is None:
            raise ValueError(f"a cancel without a task id in session {sid!r}")
        if self.jobs is None:
            return False
        return self.jobs.cancel(sid, task_id)


def _text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and 0 < len(value) <= FIELD_MAX else None


def _job(marker: Any, daemons: dict[tuple[Any, Any], str]) -> dict[str, Any] | None:
    """A running marker as `tasks` lists a job, or None if no live daemon runs it."""
    if not isinstance(marker, dict):
        return None
    owner = daemons.get((marker.get("pid"), marker.get("host")))
    sid, tid = _text(marker, "session_id"), _text(marker, "task_id")
    if owner is None or sid is None or tid is None:
        return None
    started = marker.get("started")
    age = time.time() - started if isinstance(started, (int, float)) else 0.0
    info = task_info(
        tid,
        str(marker.get("tool") or "?"),
        "running",
        age,
        sid,
        str(marker.get("args_summary") or ""),
    )
    return {**info, "daemon": owner}
