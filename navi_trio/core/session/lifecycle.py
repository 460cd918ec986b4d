"""Creating and deleting sessions: the bookkeeping the core owns.

`delete` removes everything the daemon keeps for a session (jobs, terminals, history,
cached state, approvals, checkpoints, folder); a session with a run active or queued
is not deleted. Who may create or delete what is the caller's check.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Callable

import attrs
import trio

from navi_trio.core.checkpoints import CheckpointEngine
from navi_trio.core.jobs import TaskSupervisor
from navi_trio.core.session.session_registry import SessionRegistry
from navi_trio.core.turn import ApprovalBroker
from navi_trio.errors import LimitError, NaviError, SessionBusyError
from navi_trio.profiles import ConfigSource
from navi_trio.settings import Settings
from navi_trio.store.base import SessionRow
from navi_trio.store.methods import SessionStore
from navi_trio.text import title_from
from navi_trio.tools.procs import ProcessPool

log = logging.getLogger(__name__)


def new_session_id() -> str:
    return "s-" + uuid.uuid4().hex[:12]


@attrs.define(kw_only=True, eq=False)
class SessionService:
    settings: Settings
    config: ConfigSource
    store: SessionStore
    sessions: SessionRegistry
    supervisor: TaskSupervisor
    approvals: ApprovalBroker
    checkpoints: CheckpointEngine | None = None
    processes: ProcessPool | None = None

    async def create(
        self,
        session_id: str | None,
        *,
        user_id: str,
        user_name: str,
        profile_id: str | None,
        durable: bool = True,
    ) -> SessionRow:
        """A new session of `user_id`, unless they already have as many as allowed.
        `durable=False`: not waited to the disk (a message's durable save follows)."""
        limit = self.settings.sessions_per_user
        try:
            # Counted in the transaction that creates it: parallel creations (other
            # connections, other daemons, a schedule's run) never pass the limit.
            return await self.store.create_session(
                session_id or new_session_id(),
                profile_id=profile_id or self.config.current.default_profile,
                user_id=user_id,
                sessions_max=limit,
                durable=durable,
            )
        except LimitError:
            raise LimitError(
                f"user {user_name} already has {limit} sessions (NAVI_SESSIONS_PER_USER):"
                " delete one first"
            ) from None

    async def title(self, session_id: str, first_message: str) -> None:
        """Title a session by its first stored message's first line (the session list
        shows it); a title that cannot be saved costs only the title, so it is not waited
        to the disk (the turn's next durable save flushes it)."""
        title = title_from(first_message)
        if not title:
            return
        try:
            await self.store.update_session(session_id, title=title, durable=False)
        except NaviError as exc:
            log.warning("session %s: the title was not saved: %s", session_id, exc)

    def _check_deletable(self, session_id: str) -> None:
        """SessionBusyError when the session has a run active or queued."""
        actor = self.sessions.actor(session_id)
        if actor is not None and (actor.busy or actor.pending):
            raise SessionBusyError(
                f"session {session_id!r} has a run active or queued: stop it first"
            )

    async def delete(self, session_id: str, *, before: Callable[[], object] | None = None) -> bool:
        """Delete the session and all the daemon keeps for it; False when it was gone. `before`
        runs once the session is known deletable, before anything is removed."""
        self._check_deletable(session_id)
        if before is not None:
            before()
        for job in self.supervisor.list_jobs(session_id):
            self.supervisor.cancel(session_id, job.task_id)
        if self.processes is not None:  # before its folder goes: they work in it
            await self.processes.close_session(session_id)
        deleted = await self.store.delete_session(session_id)
        self.sessions.forget(session_id)
        self.approvals.forget(session_id)
        if self.checkpoints is not None:
            await self.checkpoints.delete_all(session_id)
        folder = self.settings.session_dir(session_id)
        await trio.to_thread.run_sync(lambda: shutil.rmtree(folder, ignore_errors=True))
        return deleted
