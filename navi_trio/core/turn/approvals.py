"""Approvals: a tool call the policy says `ask` about waits for the run's starter.

A run's approvals belong to the user who started it, not to the session's owner, so a
user's text never approves an admin's run. A call is approved by an earlier grant of
that user in that mode (``session``, kept here, or ``always``, kept in the store), else
with nobody to ask by the profile's headless allow-list, else by the starter's answer
to an `ApprovalRequest`; no answer in time is a deny. Every outcome is published as
`ApprovalDecided`. The wait is in the run's cancel scope: Stop ends it at once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from navi_trio.core.turn.policy import CallFacts, Verdict, headless_allows
from navi_trio.errors import ForbiddenError, NotFoundError
from navi_trio.events import AgentEvent, ApprovalDecided, ApprovalRequest
from navi_trio.profiles import AgentProfile
from navi_trio.store.methods import SessionStore

log = logging.getLogger(__name__)

ALWAYS_SCOPE = "policy_always"
SCOPES = ("once", "session", "always")


@attrs.frozen
class Outcome:
    approved: bool
    why: str  # for the denied call's result


@attrs.frozen
class Grant:
    """One grant, as `navi approvals list` shows it: `id` revokes it."""

    id: str
    scope: str  # session | always
    user_id: str
    mode: str
    grants: str  # in words
    session_id: str = ""  # the session of a `session` grant
    given_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def grant_id(scope: str, session_id: str, grant: str) -> str:
    """A grant's short, stable id."""
    digest = hashlib.sha256(f"{scope}|{session_id}|{grant}".encode()).hexdigest()
    return f"g-{digest[:12]}"


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
    """One per runtime: the pending requests, and the grants of `session` answers (`always`
    ones are kept in the store's kv)."""

    def __init__(
        self, store: SessionStore, timeout: float, attached: Callable[[str], bool]
    ) -> None:
        self.store = store
        self.timeout = timeout
        self.attached = attached
        self._pending: dict[tuple[str, str], _Pending] = {}
        # session id -> grant key -> the grant, as listed
        self._session_grants: dict[str, dict[str, Grant]] = {}

    def pending(self, session_id: str) -> list[str]:
        """Call ids waiting for an answer in `session_id`."""
        return [cid for (sid, cid) in self._pending if sid == session_id]

    def waiting_count(self) -> int:
        """Approvals waiting for an answer, in every session."""
        return len(self._pending)

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
                "a scheduled run waits on nobody"
                if headless
                else "no client is attached to approve it"
            )
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
        """`user_id`'s answer: only the run's starter answers (ForbiddenError for anyone else).
        An `always` grant is stored before the call is released."""
        pending = self._pending.get((session_id, call_id))
        if pending is None or pending.answered.is_set():
            raise NotFoundError(
                f"no approval request {call_id!r} is waiting in session {session_id!r}"
            )
        if user_id != pending.starter:
            log.warning(
                "session %s: call %s: an answer of %s refused (the run is %s's)",
                session_id,
                call_id,
                user_id,
                pending.starter,
            )
            raise ForbiddenError(
                f"only the owner of this run (the user who started it) answers its approval "
                f"requests: call {call_id!r} in session {session_id!r} is not yours to answer",
                session_id=session_id,
            )
        words = pending.request.grant or pending.rule
        if approve and scope == "session":
            held = self._session_grants.setdefault(session_id, {})
            for key in pending.grants:
                held[key] = Grant(
                    grant_id("session", session_id, key),
                    "session",
                    user_id,
                    pending.request.mode,
                    words,
                    session_id,
                    time.time(),
                )
        if approve and scope == "always":
            for key in pending.grants:
                value = {"rule": pending.rule, "grants": words, "at": time.time()}
                await self.store.kv_set(ALWAYS_SCOPE, key, value)
        if pending.answered.is_set():  # answered twice while the grant was stored
            return
        pending.approved = approve
        pending.scope = scope
        pending.answered.set()
        log.info(
            "session %s: call %s %s (%s)",
            session_id,
            call_id,
            "approved" if approve else "denied",
            scope,
        )

    async def _granted(self, session_id: str, grant: str) -> str | None:
        """How `grant` is granted: "session", "always", or None."""
        held = self._session_grants.get(session_id, {})
        for g in covering(grant):
            if g in held:
                return "session"
        for g in covering(grant):
            if await self.store.kv_get(ALWAYS_SCOPE, g):
                return "always"
        return None

    async def grants(self, user_id: str | None) -> list[Grant]:
        """The grants of `user_id` (None: everyone's), `session` ones then `always` ones.
        A line's several keys granted by one answer are listed, and revoked, one by one."""
        found = [
            g
            for held in self._session_grants.values()
            for g in held.values()
            if user_id is None or g.user_id == user_id
        ]
        for key, value in await self.store.kv_list(ALWAYS_SCOPE):
            user, mode = key.split("|", 2)[:2]
            if user_id is not None and user != user_id:
                continue
            value = value if isinstance(value, dict) else {}
            words = value.get("grants") or value.get("rule") or key
            at = value.get("at")
            found.append(
                Grant(
                    grant_id("always", "", key),
                    "always",
                    user,
                    mode,
                    str(words),
                    given_at=float(at) if isinstance(at, int | float) else 0.0,
                )
            )
        return found

    async def revoke(self, grant: str, user_id: str | None) -> Grant:
        """Revoke the grant with id `grant` of `user_id` (None: anyone's, for an admin);
        NotFoundError when there is none (another user's is not theirs to see)."""
        for sid, held in self._session_grants.items():
            for key, g in list(held.items()):
                if g.id == grant and (user_id is None or g.user_id == user_id):
                    del held[key]
                    log.info("session %s: grant %s revoked", sid, grant)
                    return g
        for g in await self.grants(user_id):
            if g.id == grant and g.scope == "always":
                for key, _ in await self.store.kv_list(ALWAYS_SCOPE, f"{g.user_id}|"):
                    if grant_id("always", "", key) == grant:
                        await self.store.kv_delete(ALWAYS_SCOPE, key)
                log.info("grant %s revoked", grant)
                return g
        raise NotFoundError(f"no grant {grant!r} (`navi approvals list` shows yours)")

    def forget(self, session_id: str) -> None:
        """The session is gone: drop its `session` grants."""
        self._session_grants.pop(session_id, None)
