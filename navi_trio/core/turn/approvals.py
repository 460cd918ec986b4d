"""Approvals: a tool call the policy says `ask` about waits for the run's starter.

`ApprovalBroker.resolve` is called by the tool executor, inside the run's cancel scope:
Stop ends the wait at once. A run's approvals belong to the user who started it (its
message's sender), not to the session's owner: an admin's run in a user's session is
answered by the admin, never by the user, whose text could otherwise approve what the
admin's run does. In order, a call is approved by

1. an earlier grant of that user in that mode: an answer with scope ``session`` (kept
   here, per session) or ``always`` (kept in the store's kv: a restart keeps it), each
   for the rule that asked, the grantor and the mode the run had (`grant_key`). A grant
   given in ``workspace`` covers nothing in ``full``, and another user's grant nothing;
2. with no client attached to the session, or for a headless run (a scheduled one:
   nobody asked it to wait on them), the profile's headless allow-list (anything else
   is denied: nobody could answer);
3. the starter's `approve` / `deny` (`answer`; anyone else is refused) after an
   `ApprovalRequest` event; no answer within `Settings.approval_timeout_sec` is a deny.

Every outcome is published as `ApprovalDecided`, so a client sees why a call ran or not.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import attrs
import trio

from navi_trio.core.turn.policy import CallFacts, Verdict, headless_allows
from navi_trio.errors import ForbiddenError, NotFoundError
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
    starter: str  # the user who started the run: the only one who answers
    grants: tuple[str, ...]  # what a `session` or `always` answer grants (`grant_key`)
    rule: str
    request: ApprovalRequest
    answered: trio.Event = attrs.Factory(trio.Event)
    approved: bool = False
    scope: str = "once"


def grant_key(user_id: str, mode: str, key: str) -> str:
    """What a grant covers: the rule's `key`, for the grantor `user_id`, in `mode`."""
    return f"{user_id}|{mode}|{key}"


def covering(grant: str) -> tuple[str, ...]:
    """The grants that cover `grant`: itself, and for a program in the workspace, the
    same program on any path."""
    if "|cmd|" in grant and grant.endswith("|workspace"):
        return (grant, grant.removesuffix("|workspace") + "|anywhere")
    return (grant,)


class ApprovalBroker:
    """One per runtime: the pending requests, and the grants of `session` answers.

    `store` keeps `always` grants (kv); `attached(session_id)` says whether a client is
    subscribed to the session.
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
        grants = tuple(grant_key(user_id, mode, k) for k in verdict.keys)
        scopes = [await self._granted(session_id, g) for g in grants]
        if all(scopes):
            scope = "always" if all(s == "always" for s in scopes) else "session"
            publish(ApprovalDecided(call_id=call_id, approved=True, scope=scope, by="grant"))
            return Outcome(
                True, "approved always" if scope == "always" else "approved for this session"
            )
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
            parts=verdict.parts,
            grant=verdict.grant or f"calls that {verdict.rule} asks about",
        )
        pending = _Pending(user_id, grants, verdict.rule, request)
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

    async def answer(
        self,
        session_id: str,
        call_id: str,
        *,
        approve: bool,
        scope: str,
        user_id: str,
    ) -> None:
        """`user_id`'s answer: only the run's starter answers (ForbiddenError for anyone
        else; the api layer checked that they may address the session at all). An
        `always` grant is stored before the call is released, so the grant is durable
        once the call runs."""
        pending = self._pending.get((session_id, call_id))
        if pending is None or pending.answered.is_set():
            raise NotFoundError(
                f"no approval request {call_id!r} is waiting in session {session_id!r}"
            )
        if user_id != pending.starter:
            log.warning(
                "session %s: call %s: an answer of %s refused (the run is %s's)",
                session_id, call_id, user_id, pending.starter,
            )  # fmt: skip
            raise ForbiddenError(
                f"only the owner of this run (the user who started it) answers its approval "
                f"requests: call {call_id!r} in session {session_id!r} is not yours to answer",
                session_id=session_id,
            )
        if approve and scope == "session":
            self._session_grants.setdefault(session_id, set()).update(pending.grants)
        if approve and scope == "always":
            for grant in pending.grants:
                await self.store.kv_set(ALWAYS_SCOPE, grant, {"rule": pending.rule})
        if pending.answered.is_set():  # answered twice while the grant was stored
            return
        pending.approved = approve
        pending.scope = scope
        pending.answered.set()
        log.info(
            "session %s: call %s %s (%s)",
            session_id, call_id, "approved" if approve else "denied", scope,
        )  # fmt: skip

    async def _granted(self, session_id: str, grant: str) -> str | None:
        """How `grant` is granted: "session", "always", or None."""
        held = self._session_grants.get(session_id, set())
        for g in covering(grant):
            if g in held:
                return "session"
        for g in covering(grant):
            if await self.store.kv_get(ALWAYS_SCOPE, g):
                return "always"
        return None

    def forget(self, session_id: str) -> None:
        """The session is gone: drop its `session` grants."""
        self._session_grants.pop(session_id, None)
