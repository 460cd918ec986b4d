"""Background results that wake the agent: a profile's ``wake_on_task_done``.

Without it a finished background job's note waits for the next user message. With it,
the `Waker` (the TaskSupervisor's note sink) delivers it at once:

- the session **idle**: the note and a queued wake-up are stored in one transaction
  (`SessionStore.enqueue_wake`), then the session's actor runs the wake-up as a turn
  that starts with the note: a daemon that dies in between runs it at its next start,
  exactly once;
- the session **busy**: the running turn takes the note in before its next LLM call, as
  a steered message; a turn that makes no other call leaves it to a wake-up.

Wake-ups are bounded per session (`Settings.wake_max_per_hour`, counted in the store):
two sessions whose jobs wake each other stop, and their notes wait for a message.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from navi_trio.actor import NurseryHolder
from navi_trio.core.jobs import NOTES_SCOPE, JobNote, note_entry, record_note, trim_notes
from navi_trio.core.session import deliver, role_now, to_row
from navi_trio.core.turn import RunControl, UserMessage
from navi_trio.errors import NaviError
from navi_trio.profiles import NaviConfig
from navi_trio.settings import Settings
from navi_trio.store.base import QueuedRow, SessionRow
from navi_trio.store.methods import SessionStore

if TYPE_CHECKING:
    from navi_trio.core.session import SessionRegistry

log = logging.getLogger(__name__)

WAKE_WINDOW_SEC = 3600.0  # the bound counts the wake-ups of the last hour


@attrs.define(eq=False)
class Waker(NurseryHolder):
    """Records a finished job's note and wakes its session when its profile says so.

    `record` is the TaskSupervisor's note sink, for jobs that end and jobs a dead process
    lost alike. `registry()` is None until the registry is built: a wake-up is then
    queued in the store, and runs when the daemon starts the sessions' actors."""

    _store: SessionStore
    _settings: Settings
    _config: Callable[[], NaviConfig]
    _registry: Callable[[], SessionRegistry | None]
    pid: int = attrs.field(factory=os.getpid, init=False)
    host: str = attrs.field(factory=socket.gethostname, init=False)

    async def record(self, session_id: str, note: JobNote) -> None:
        """A background job ended: keep its note, and wake the session when asked to."""
        row = await self._store.get_session(session_id)
        registry = self._registry()
        actor = registry.actor(session_id) if registry is not None else None
        control = actor.running if actor is not None else None
        # No registry yet (a job lost by a previous process, reported at start-up): the
        # wake-up is queued all the same, and runs when the daemon starts its actors.
        if row is None or not self._wakes(row) or control is not None:
            await record_note(self._store, self._settings, session_id, note)
            if row is not None and control is not None and self._wakes(row):
                # Into the running turn at its next LLM call; a wake-up if it makes none.
                control.injections.notes()
                self.nursery.start_soon(self._after_run, control, row)
            return
        key, value = note_entry(session_id, note)
        await self._wake(row, (NOTES_SCOPE, key, value))

    def _wakes(self, row: SessionRow) -> bool:
        return self._config().profile(row.profile_id).wake_on_task_done

    async def _after_run(self, control: RunControl, row: SessionRow) -> None:
        await control.finished.wait()
        if control.injections.notes_due:  # the turn ended without another LLM call
            try:
                await self._wake(row, None)
            except NaviError as exc:
                log.warning("session %s: waking it failed: %s", row.id, exc)

    async def _wake(self, row: SessionRow, note: tuple[str, str, object] | None) -> None:
        """Queue a wake-up (with `note`, in one transaction) and hand it to the actor; a
        session whose owner was removed is never woken (its note is kept all the same)."""
        role = await role_now(self._store, row.user_id)
        if role is None:
            if note is not None:
                await self._store.kv_set(*note)
                await trim_notes(self._store, self._settings, row.id)
            log.warning(
                "session %s: not woken: its owner %s was removed; the note is kept",
                row.id,
                row.user_id,
            )
            return
        message = to_row(UserMessage("", user_id=row.user_id, user_role=role, kind="wake"))
        key = "wake-" + secrets.token_hex(8)
        queued = await self._store.enqueue_wake(
            QueuedRow(row.id, key, message, self.pid, self.host),
            note=note,
            limit=self._settings.wake_max_per_hour,
            per=WAKE_WINDOW_SEC,
        )
        if note is not None:
            await trim_notes(self._store, self._settings, row.id)
        if not queued:
            log.warning(
                "session %s: not woken: %d wake-ups in the last hour (NAVI_WAKE_MAX_PER_HOUR);"
                " the note waits for the next message",
                row.id,
                self._settings.wake_max_per_hour,
            )
            return
        log.info("session %s: woken by background results", row.id)
        registry = self._registry()
        if registry is not None:  # (none: queued, the next start runs it)
            # Committed above; the hand-over may wait (an actor starting, a lease) and
            # runs apart from the caller, often a job's shielded bookkeeping: a shutdown
            # meanwhile cancels it and the wake-up runs after the restart.
            self.nursery.start_soon(self._deliver, registry, row.id, key, message)

    async def _deliver(
        self, registry: SessionRegistry, session_id: str, key: str, message: dict[str, Any]
    ) -> None:
        try:
            await deliver(registry, session_id, key, message)
        except Exception:  # it stays queued: the session's next start or message runs it
            log.exception("session %s: handing its wake-up to its actor failed", session_id)
