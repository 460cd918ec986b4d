"""Approvals: a tool call the policy says `ask` about waits for its session owner.

`ApprovalBroker.resolve` is called by the tool executor, inside the run's cancel scope:
Stop ends the wait at once. In order, a call is approved by

1. an earlier answer with scope ``session`` (kept here, per session, for this rule) or
   ``always`` (kept in the store's kv, per owner, for this rule: a restart keeps it);
2. with no client attached to the session, or for a headless run (a scheduled one:
   nobody asked it to wait on them), the profile's headless allow-list (anything else
   is denied: nobody could answer);
3. the owner's `approve` / `deny` (`answer`, from the api layer) after an
   `ApprovalRequest` event; no answer within `Settings.approval_timeout_sec` is a deny.

Every outcome is published as `ApprovalDecided`, so a client sees why a call ran or not.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import attrs
import trio

from navi_trio.core.policy import CallFacts, Verdict, headless_allows
from navi_trio.errors import NotFoundError
from navi_trio.events import AgentEvent, ApprovalDecided, ApprovalRequest
from navi_trio.profiles import AgentProfile
from navi_trio.store.base import SessionStore

log = logging.getLogger(__name__)

ALWAYS_SCOPE = "policy_always"
SCOPES = ("once", "session", "always")


@attrs.frozen
class Outcome:
    approved: bool
    why: str  # for the denied call's result


@attrs.define(eq=False)
class _Pending:
    owner_id: str
    key: str
    rule: str
    request: ApprovalRequest
    answered: trio.Event = attrs.Factory(trio.Event)
    approved: bool = False
    scope: str = "once"


def _always_key(owner_id: str, key: str) -> str:
    return f"{owner_id}|{key}"


class ApprovalBroker:
    """One per runtime: the pending requests, and the grants of `session` answers.

    `store` gives the session's owner (`get_session`) and keeps `always` grants (kv);
    `attached(session_id)` says whether a client is subscribed to the session.
    """

    def __init__(
        self, store: SessionStore, timeout: float, attached: Callable[[str], bool]
    ) -> None:
        self.store = store
        self.timeout = timeout
        self.attached = attached
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._session_grants: dict[str, set[str]] = {}

    def pending(self, session_id: str) -> list[str]:
        """Call ids waiting for an answer in `session_id`."""
        return [cid for (sid, cid) in self._pending if sid == session_id]

    def waiting(self, session_id: str) -> list[ApprovalRequest]:
        """The requests still waiting in `session_id` (a client that subscribes gets them)."""
        return [p.request for (sid, _), p in self._pending.items() if sid == session_id]

    async def owner_of(self, session_id: str, fallback: str) -> str:
        row = await self.store.get_session(session_id)
        return str(row.user_id) if row is not None else fallback

    async def resolve(
        self,
        *,
        session_id: str,
        user_id: str,
        call_id: str,
        profile: AgentProfile,
        mode: str,
        facts: CallFacts,
        verdict: Verdict,
        summary: str,
        publish: Callable[[AgentEvent], None],
        headless: bool = False,
    ) -> Outcome:
        owner = await self.owner_of(session_id, user_id)
        if verdict.key in self._session_grants.get(session_id, ()):
            publish(ApprovalDecided(call_id=call_id, approved=True, scope="session", by="grant"))
            return Outcome(True, "approved for this session")
        if await self.store.kv_get(ALWAYS_SCOPE, _always_key(owner, verdict.key)):
            publish(ApprovalDecided(call_id=call_id, approved=True, scope="always", by="grant"))
            return Outcome(True, "approved always")
        if headless or not self.attached(session_id):
            ok = headless_allows(profile.policy, facts)
            publish(ApprovalDecided(call_id=call_id, approved=ok, by="headless"))
            why = "allowed" if ok else "denied"
            nobody = (
                "a scheduled run waits on nobody" if headless
                else "no client is attached to approve it"
            )  # fmt: skip
            return Outcome(ok, f"{why} by the headless rule: {nobody} ({verdict.rule})")
        request = ApprovalRequest(
            call_id=call_id,
            tool=facts.tool,
            summary=summary,
            rule=verdict.rule,
            mode=mode,
            timeout_sec=math.ceil(self.timeout),
        )
        pending = _Pending(owner, verdict.key, verdict.rule, request)
        key = (session_id, call_id)
        self._pending[key] = pending
        try:
            publish(request)
            with trio.move_on_after(self.timeout):
                await pending.answered.wait()
        finally:
            if self._pending.get(key) is pending:  # a provider may reuse a call id
                del self._pending[key]
        if not pending.answered.is_set():
            publish(ApprovalDecided(call_id=call_id, approved=False, by="timeout"))
            return Outcome(False, f"no answer within {self.timeout:g} s ({verdict.rule})")
        publish(
            ApprovalDecided(
                call_id=call_id, approved=pending.approved, scope=pending.scope, by="owner"
            )
        )
        if pending.approved:
            return Outcome(True, "approved by the owner")
        return Outcome(False, f"the user denied it ({verdict.rule})")

    def owner_of_pending(self, session_id: str, call_id: str) -> str:
        """The owner who may answer the pending call, or NotFoundError."""
        pending = self._pending.get((session_id, call_id))
        if pending is None:
            raise NotFoundError(
                f"no approval request {call_id!r} is waiting in session {session_id!r}"
            )
        return pending.owner_id

    async def answer(
        self,
        session_id: str,
        call_id: str,
        *,
        approve: bool,
        scope: str,
    ) -> None:
        """The owner's answer (the api layer checked who sends it). An `always` grant is
        stored before the call is released, so the grant is durable once the call runs."""
        pending = self._pending.get((session_id, call_id))
        if pending is None or pending.answered.is_set():
            raise NotFoundError(
                f"no approval request {call_id!r} is waiting in session {session_id!r}"
            )
        if approve and scope == "session":
            self._session_grants.setdefault(session_id, set()).add(pending.key)
        if approve and scope == "always":
            await self.store.kv_set(
                ALWAYS_SCOPE, _always_key(pending.owner_id, pending.key), {"rule": pending.rule}
            )
        if pending.answered.is_set():  # answered twice while the grant was stored
            return
        pending.approved = approve
        pending.scope = scope
        pending.answered.set()
        log.info(
            "session %s: call %s %s (%s)",
            session_id, call_id, "approved" if approve else "denied", scope,
        )  # fmt: skip

    def forget(self, session_id: str) -> None:
        """The session is gone: drop its `session` grants."""
        self._session_grants.pop(session_id, None)
