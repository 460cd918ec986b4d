"""The ``message`` command: a user's message to a session, from its checks to its ok.

Everything the frame says is checked before a session is created for it: its cwd
(against what the sender's role may use) and its profile. A new session is the
sender's; an existing one must be theirs (an admin may use any), and ``mode: full`` only
one of their own. The message goes to the session's actor here, or into the queue of
the daemon that runs the session's turn now. One reply, once the message is saved
(running) or queued, so that a crash after the ok cannot lose it; else the error.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from navi_trio.api.protocol import RequestId, SendMessage, reply
from navi_trio.api.tracing import trace_carrier
from navi_trio.core.turn import (
    UserMessage,
    busy_strategy,
    effective_mode,
    remember_folder,
)
from navi_trio.errors import (
    DuplicateMessageError,
    ForbiddenError,
    RequestError,
    SessionBusyError,
    StorageError,
    UnavailableError,
)

if TYPE_CHECKING:  # commands imports this module
    from navi_trio.api.commands import Commands
    from navi_trio.store.base import SessionRow

log = logging.getLogger(__name__)


class SessionMessages:
    """The ``message`` frames of one connection's `Commands` (its user, its runtime)."""

    def __init__(self, commands: Commands) -> None:
        self.c = commands

    async def send(self, rid: RequestId, cmd: SendMessage) -> None:
        # Everything the frame says is checked before a session is created for it.
        cwd = None
        if cmd.cwd is not None:
            cwd = await self.c.cwd_check(cmd.session_id).check(cmd.cwd)
        row = await self.c.rt.store.get_session(cmd.session_id) if cmd.session_id else None
        created = row is None
        if row is None:
            # Not waited to the disk: the message's durable save (before its ok) flushes it.
            row = await self.c._create(cmd.session_id, cmd.profile, durable=False)
            await self.c.conn.send(reply(rid, "session", session_id=row.id, created=True))
        else:
            row = await self.c._owned(row.id)
            if cmd.mode == "full" and row.user_id != self.c.user.id:
                log.warning(
                    "%s refused: mode full in session %s of another user", self.c.user.name, row.id
                )
                raise ForbiddenError(
                    f"mode full (no sandbox) runs only in a session of your own, and "
                    f"session {row.id!r} is another user's: what its owner wrote would be "
                    "the context of an unsandboxed run; use a session of yours, or mode "
                    "workspace",
                    session_id=row.id,
                )
        if cwd is not None:  # offered again by the folder picker (core/turn/folders.py)
            await remember_folder(self.c.rt.store, self.c.user.id, cwd)
        actor = await self.c._actor(row.id)
        # Before subscribing: a turn a dead daemon left is ended first, and its frames
        # are not this message's (core/cluster/cluster.py).
        owner = await self.c._owner_elsewhere(row.id, actor)
        if not self.c.conn.subscribed(row.id):
            self.c.conn.subscribe(actor, None, None)
        if cmd.key is not None and not created:
            # Its key taken already (a resend after a lost ok): it does not run again.
            # Only the session's owner (or an admin) gets here: keys are per session.
            first = await self.c.rt.store.message_key(row.id, cmd.key)
            if first is not None:
                await self._duplicate(rid, row.id, cmd.key, first)
                return
        message = UserMessage(
            cmd.content,
            cwd=cwd,
            user_id=self.c.user.id,
            user_role=self.c.user.role,
            user_info=self.c.user.info,
            profile_id=cmd.profile,
            mode=cmd.mode,
            on_busy=cmd.on_busy,
            budget=cmd.budget,
            trace=self._trace(cmd),
            key=cmd.key,
        )
        self.c._check_profile(cmd.profile)  # a new session's was checked by _create
        if owner is not None:  # another daemon runs it: queued there (core/cluster/cluster.py)
            # This daemon's view of the session (the owner's frames relayed here, or its
            # own seq): at or below the owner's seq when the message is handed over, so
            # every frame of its run comes after it, and frames at or before it are not
            # its own. Read before the queued row is written, as the owner takes it
            # from there only.
            message.taken.update(seq=actor.seq, epoch=actor.epoch)
            try:
                await self._hand_over(rid, owner, row, message)
            except DuplicateMessageError:
                await self._duplicate(rid, row.id, cmd.key)
            return
        # The mode its run gets, as the agent computes it at the turn's start: a client
        # that asked for more than the role allows learns what it got.
        profile = self.c.rt.config.current.profile(cmd.profile or row.profile_id)
        asked = cmd.mode or row.meta.get("mode")
        own = row.user_id == self.c.user.id
        mode = effective_mode(profile.policy, self.c.user.role, asked, own_session=own)
        # Read with no checkpoint before the message goes in: every frame of its run (and
        # its message_queued) comes after this seq, so a client tells them from the
        # frames before, whichever of them and the ok it gets first.
        # Kept for its ok (`_ok_fields`) and with its key, if it has one.
        message.taken.update(seq=actor.seq, epoch=actor.epoch, mode=mode)
        try:
            strategy = actor.send_message(message)
        except RuntimeError:
            raise UnavailableError("the daemon is shutting down; try again later") from None
        # One reply, once the message is saved (running) or stored in the queue, so a
        # crash after the ok cannot lose it; else the error that refused it. The wait
        # runs beside the connection's reader: the frames behind this one go on.
        untitled = not row.title
        await self.c.conn.defer(
            rid,
            lambda: self._accepted(rid, row.id, message, strategy, untitled=untitled),
        )

    def _trace(self, cmd: SendMessage) -> dict[str, str] | None:
        """The frame's trace context, when it is good; a bad one is dropped (and said)."""
        if cmd.traceparent is None and cmd.tracestate is None:
            return None
        carrier = trace_carrier(cmd.traceparent, cmd.tracestate)
        if carrier is None or (cmd.tracestate is not None and "tracestate" not in carrier):
            log.info("a message from %s came with a bad trace context: left out", self.c.user.name)
        return carrier

    async def _accepted(
        self,
        rid: RequestId,
        session_id: str,
        message: UserMessage,
        strategy: str | None,
        *,
        untitled: bool = False,
    ) -> None:
        timeout = self.c.rt.settings.message_accept_timeout_sec

        def too_slow() -> StorageError:
            return StorageError(
                f"session {session_id!r}: the message was not stored within {timeout:g} s "
                "(NAVI_MESSAGE_ACCEPT_TIMEOUT_SEC): the database did not answer; it will "
                "not run",
                session_id=session_id,
            )

        try:
            await message.accepted.wait(timeout, too_slow)
        except DuplicateMessageError:
            # A message with its key was taken first (on its way when this one came).
            await self._duplicate(rid, session_id, message.key)
            return
        except RequestError as exc:
            exc.session_id = exc.session_id or session_id
            raise
        # queued: it waits for a run of its own (behind the queue, or next for interrupt);
        # on_busy: the strategy applied, when the session was busy (steer: in that run).
        queued = strategy in ("enqueue", "interrupt") or message.accepted.queued
        log.info(
            "session %s: message from %s %s",
            session_id,
            self.c.user.name,
            strategy or "runs",
        )
        if untitled:  # before the ok: a list after it shows the title
            await self.c.rt.session_service.title(session_id, message.text)
        # (`message.taken` holds its on_busy too: the strategy, when the session was busy.)
        await self.c.conn.send(reply(rid, "ok", **_ok_fields(session_id, message.taken, queued)))

    async def _hand_over(
        self, rid: RequestId, owner: str, row: SessionRow, message: UserMessage
    ) -> None:
        """The session's turn runs on daemon `owner`: the message waits in the queue there.
        Its `on_busy`, else its session profile's, decides: `reject` refuses it; a steer or
        an interrupt is not carried across daemons: it queues, and the ok says so
        (``on_busy: enqueue``)."""
        assert self.c.rt.cluster is not None
        default = self.c.rt.config.current.profile(row.profile_id)  # the running turn's
        strategy = busy_strategy(message.on_busy, None, default.on_busy)
        if strategy == "reject":
            raise SessionBusyError(
                f"session {row.id!r} is running a turn on another daemon (on_busy:"
                " reject): send again later, or with on_busy enqueue",
                session_id=row.id,
            )
        message.taken["on_busy"] = strategy  # kept with its key, if it has one
        taken = dict(message.taken)  # (its seq and epoch: read before the hand-over)
        await self.c.rt.cluster.hand_over(owner, row.id, message)
        log.info("session %s: message from %s handed to %s", row.id, self.c.user.name, owner)
        await self.c.conn.send(reply(rid, "ok", **_ok_fields(row.id, taken, True)))

    async def _duplicate(
        self, rid: RequestId, session_id: str, key: str | None, first: dict[str, Any] | None = None
    ) -> None:
        """The ok to a message whose client key another message of the session took: the
        first one's ok again (its seq and epoch when it had them), ``duplicate: true``.
        Nothing of this one was stored and it does not run."""
        if first is None and key is not None:
            first = await self.c.rt.store.message_key(session_id, key)
        first = first or {}
        log.info(
            "session %s: message from %s with key %r, taken already: not run again",
            session_id,
            self.c.user.name,
            key,
        )
        fields = _ok_fields(session_id, first, bool(first.get("queued")))
        await self.c.conn.send(reply(rid, "ok", duplicate=True, **fields))


def _ok_fields(session_id: str, taken: dict[str, Any], queued: bool) -> dict[str, Any]:
    """The fields of a message's ``ok`` from what was noted when it was taken
    (`UserMessage.taken`, kept with its key: its on_busy, mode, seq and epoch)."""
    fields: dict[str, Any] = {"session_id": session_id, "queued": queued}
    for name in ("on_busy", "mode", "seq", "epoch"):
        if taken.get(name) is not None:
            fields[name] = taken[name]
    if fields.get("on_busy") == "steer":  # a steer joins a run with its own mode
        fields.pop("mode", None)
    return fields
