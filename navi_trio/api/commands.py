"""What each client command does, for one authenticated user.

Ownership is checked here, once per command: a user sees, drives, subscribes to and
deletes only their own sessions and tasks; an admin may touch all. The work itself is
the core's, reached through the `DaemonCore` protocol; nothing of the agent loop is
here. Every refusal is a `RequestError` with its wire code. The frames with a module of
their own (message, checkpoints, rewind, fork, folders, changes, schedule) check
ownership through this class.
"""

from __future__ import annotations

import logging
import re
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from navi_trio import wire
from navi_trio.api.auth import User
from navi_trio.api.checkpoint_frames import CheckpointCommands
from navi_trio.api.command_list import list_commands
from navi_trio.api.frame_fields import HISTORY_LIMIT_MAX, cursor_position, history_cursor
from navi_trio.api.message_command import SessionMessages
from navi_trio.api.project_frame import handle_context
from navi_trio.api.protocol import (
    Approval,
    Changes,
    Checkpoints,
    ClientToolResult,
    ClientTools,
    Command,
    CommandList,
    Compact,
    Context,
    Folders,
    Fork,
    Grants,
    Hello,
    RequestId,
    Rewind,
    Schedule,
    SendMessage,
    Sessions,
    SigninCode,
    Stop,
    Subscribe,
    Tasks,
    Unsubscribe,
    Usage,
    history_for_user,
    reply,
)
from navi_trio.api.schedule_commands import handle_schedule
from navi_trio.api.services import DaemonCore
from navi_trio.api.usage_commands import usage_report
from navi_trio.api.workspace_frames import WorkspaceCommands
from navi_trio.core.jobs import Job, task_info
from navi_trio.core.session import SessionActor
from navi_trio.core.turn import CwdCheck
from navi_trio.errors import (
    BusyError,
    ExistsError,
    ForbiddenError,
    NotFoundError,
    ProtocolError,
    SessionBusyError,
    UnavailableError,
)
from navi_trio.events import event_to_dict
from navi_trio.store.base import SessionRow
from navi_trio.text import title_from

if TYPE_CHECKING:  # connection imports this module
    from navi_trio.api.connection import Connection

log = logging.getLogger(__name__)


# The stored JSON one history reply carries at most (it holds one message at least,
# however big): a long session comes in pages, never as one frame of its whole size.
# With its envelope a page stays under 1 MiB: the largest frame a client may send
# (NAVI_WS_FRAME_MAX_BYTES' default), and the default limit of WebSocket libraries.
HISTORY_PAGE_MAX_BYTES = 1_000_000

# What `new_session_id` (core/session/lifecycle.py) and every client make: free for
# anyone to choose.
RANDOM_ID = re.compile(r"s-[0-9a-f]{12}")


class Commands:
    def __init__(self, runtime: DaemonCore, conn: Connection, user: User) -> None:
        self.rt = runtime
        self.conn = conn
        self.user = user
        self.checkpoints = CheckpointCommands(self)
        self.messages = SessionMessages(self)
        self.workspace = WorkspaceCommands(self)

    async def handle(self, rid: RequestId, command: Command) -> None:
        if isinstance(command, Hello):
            raise ProtocolError("already authenticated: hello is the first frame only")
        handler: Any = {
            SendMessage: self.messages.send,
            Stop: self._stop,
            Compact: self._compact,
            Subscribe: self._subscribe,
            Unsubscribe: self._unsubscribe,
            Tasks: self._tasks,
            Sessions: self._sessions,
            Approval: self._approval,
            Grants: self._grants,
            Checkpoints: self.checkpoints.overview,
            Rewind: self.checkpoints.rewind,
            Fork: self.checkpoints.fork,
            Folders: self.workspace.folders,
            Changes: self.workspace.changes,
            Schedule: self._schedule,
            ClientTools: self._client_tools,
            ClientToolResult: self._client_tool_result,
            Usage: self._usage,
            Context: partial(handle_context, self),
            SigninCode: self._signin_code,
            CommandList: lambda rid, cmd: list_commands(self, rid, cmd),
        }[type(command)]
        try:
            await handler(rid, command)
        except (ForbiddenError, NotFoundError, BusyError, SessionBusyError) as exc:
            exc.session_id = exc.session_id or getattr(command, "session_id", None)
            raise

    # -- ownership ----------------------------------------------------------------------

    def cwd_check(self, session_id: str | None) -> CwdCheck:
        """How a cwd this connection's user sends for `session_id` is checked."""
        return CwdCheck(
            user_id=self.user.id,
            role=self.user.role,
            session_id=session_id,
            settings=self.rt.settings,
            config=self.rt.config,
            store=self.rt.store,
        )

    async def _owned(self, session_id: str) -> SessionRow:
        row = await self.rt.store.get_session(session_id)
        if row is None:
            raise NotFoundError(f"no session {session_id!r}")
        if row.user_id != self.user.id and not self.user.is_admin:
            log.warning("user %s refused session %s of another user", self.user.name, session_id)
            raise ForbiddenError(f"session {session_id!r} belongs to another user")
        return row

    async def _create(
        self, session_id: str | None, profile: str | None, *, durable: bool = True
    ) -> SessionRow:
        """A new session of this user; `durable=False` when a durable write of its own
        (a message's save) follows before anyone is told it is done."""
        self._check_profile(profile)
        cfg = self.rt.config.current
        if profile is None and not cfg.may_use(self.user.role, cfg.default_profile):
            profile = cfg.default_for(self.user.role)
        if session_id is not None and not self.user.is_admin:
            await self._check_chosen_id(session_id)
        row = await self.rt.session_service.create(
            session_id,
            user_id=self.user.id,
            user_name=self.user.name,
            profile_id=profile,
            durable=durable,
        )
        log.info("session %s created by %s", row.id, self.user.name)
        return row

    async def _check_chosen_id(self, session_id: str) -> None:
        """A user (not an admin) names a new session only in their own namespace.

        Session ids are global: a name anyone could take first is one another user (or
        an admin's script) may be about to use, and an admin's message to it would run
        in the squatter's session. So an id a user picks is either random (``s-`` and
        12 hex digits, as every client makes them) or starts with the user's own name
        and a dot (``bob.notes``), the longest user name matching deciding whose it is.
        """
        if RANDOM_ID.fullmatch(session_id):
            return
        names = [str(u["name"]) for u in await self.rt.store.list_users()]
        owner = max((n for n in names if session_id.startswith(n + ".")), key=len, default=None)
        if owner != self.user.name:
            log.warning("user %s refused session id %.80r", self.user.name, session_id)
            raise ForbiddenError(
                f"a session id you choose must start with your user name and a dot "
                f"({self.user.name}.NAME), or be left to the daemon"
            )

    def _check_profile(self, profile: str | None) -> None:
        cfg = self.rt.config.current
        if profile is not None and profile not in cfg.profiles:
            raise ProtocolError(
                f"unknown profile {profile!r} (known: {', '.join(sorted(cfg.profiles))})"
            )
        refused = None if profile is None else cfg.refuse_profile(self.user.role, profile)
        if refused is not None:
            log.warning("%s refused: %s", self.user.name, refused)
            raise ForbiddenError(refused)

    async def _actor(self, session_id: str) -> SessionActor:
        try:
            actor = await self.rt.sessions.get(session_id)
        except RuntimeError:  # the registry is not running: the daemon is stopping
            raise UnavailableError("the daemon is shutting down; try again later") from None
        if self.rt.cluster is not None:  # its frames reach us wherever it runs
            await self.rt.cluster.follow(session_id)
        return actor

    async def _owner_elsewhere(self, session_id: str, actor: SessionActor | None) -> str | None:
        """The other daemon running the session now (never when it runs here: a busy actor
        runs it, unless its run only hands a message to the daemon that does)."""
        if self.rt.cluster is None or (actor is not None and actor.busy and not actor.handing_over):
            return None
        return await self.rt.cluster.owner_elsewhere(session_id)

    # -- session commands ---------------------------------------------------------------

    async def _stop(self, rid: RequestId, cmd: Stop) -> None:
        await self._owned(cmd.session_id)
        actor = self.rt.sessions.actor(cmd.session_id)
        stopped = actor.stop() if actor is not None else False
        owner = None if stopped else await self._owner_elsewhere(cmd.session_id, actor)
        if owner is not None:  # its run is another daemon's: stopped there, if it runs
            assert self.rt.cluster is not None
            stopped = await self.rt.cluster.calls.stop(owner, cmd.session_id)
        if stopped:
            log.info("session %s: stopped by %s", cmd.session_id, self.user.name)
        await self.conn.send(reply(rid, "ok", session_id=cmd.session_id, stopped=stopped))

    async def _approval(self, rid: RequestId, cmd: Approval) -> None:
        # Only a user who may address the session; and of them, only the one who started
        # the run answers (the broker checks, here or on the daemon running it).
        await self._owned(cmd.session_id)
        broker = self.rt.approvals
        here = cmd.call_id in broker.pending(cmd.session_id)
        owner = None if here else await self._owner_elsewhere(cmd.session_id, None)
        approve = cmd.decision == "approve"
        if owner is not None:  # it waits on the daemon running the session: answered there
            assert self.rt.cluster is not None
            await self.rt.cluster.calls.approve(
                owner,
                cmd.session_id,
                cmd.call_id,
                approve=approve,
                scope=cmd.scope,
                user_id=self.user.id,
            )
        else:
            await broker.answer(
                cmd.session_id,
                cmd.call_id,
                approve=approve,
                scope=cmd.scope,
                user_id=self.user.id,
            )
        await self.conn.send(
            reply(
                rid,
                "ok",
                session_id=cmd.session_id,
                call_id=cmd.call_id,
                approved=approve,
                scope=cmd.scope,
            )
        )

    async def _grants(self, rid: RequestId, cmd: Grants) -> None:
        """The sender's approval grants (an admin's: everyone's); revoke one of them."""
        who = None if self.user.is_admin else self.user.id
        broker = self.rt.approvals
        if cmd.action == "list":
            rows = [g.to_dict() for g in await broker.grants(who)]
            await self.conn.send(reply(rid, "grants", action="list", grants=rows))
            return
        if cmd.grant_id is None:
            raise ProtocolError("grants revoke needs a grant_id")
        revoked = await broker.revoke(cmd.grant_id, who)
        log.info("grant %s revoked by %s", cmd.grant_id, self.user.name)
        await self.conn.send(reply(rid, "grants", action="revoke", grants=[revoked.to_dict()]))

    async def _compact(self, rid: RequestId, cmd: Compact) -> None:
        await self._owned(cmd.session_id)
        actor = await self._actor(cmd.session_id)
        if actor.busy or await self._owner_elsewhere(cmd.session_id, actor) is not None:
            raise BusyError("a run is active: stop it or wait before compacting")
        if not self.conn.subscribed(cmd.session_id):
            self.conn.subscribe(actor, None, None)
        try:
            actor.compact()
        except RuntimeError:
            raise UnavailableError("the daemon is shutting down; try again later") from None
        await self.conn.send(reply(rid, "ok", session_id=cmd.session_id))

    async def _subscribe(self, rid: RequestId, cmd: Subscribe) -> None:
        await self._owned(cmd.session_id)
        actor = await self._actor(cmd.session_id)
        # The ok goes out before the replay: the client knows its request was taken. It
        # carries the approval requests still waiting, which a replay may no longer hold,
        # and whether a run is active (busy, as the sessions list says it): a client that
        # joins it after its start may have no frame of it to tell (a call waiting).
        waiting = [event_to_dict(e) for e in self.rt.approvals.waiting(cmd.session_id)]
        now = {"seq": actor.seq, "approvals": waiting, "busy": actor.busy}
        await self.conn.send(reply(rid, "ok", session_id=cmd.session_id, **now))
        self.conn.subscribe(actor, cmd.last_seq, cmd.epoch)

    async def _unsubscribe(self, rid: RequestId, cmd: Unsubscribe) -> None:
        was = self.conn.unsubscribe(cmd.session_id)
        await self.conn.send(reply(rid, "ok", session_id=cmd.session_id, unsubscribed=was))

    # -- client tools -------------------------------------------------------------------

    async def _client_tools(self, rid: RequestId, cmd: ClientTools) -> None:
        """The tools this connection runs for a session of its user, from its next run
        on; the connection's `send` carries their calls."""
        row = await self._owned(cmd.session_id)
        if row.user_id != self.user.id:
            raise ForbiddenError(
                f"client tools are offered only in a session of your own, and session "
                f"{row.id!r} is another user's"
            )
        # A name of one of the daemon's own MCP servers would take its policy rules.
        own = self.rt.config.current.mcp_servers
        for t in cmd.tools:
            server = t.name.removeprefix("mcp__").split("__", 1)[0]
            if server in own:
                raise ProtocolError(
                    f"client tool {t.name!r}: the daemon has an MCP server named "
                    f"{server!r}; name the client's server otherwise"
                )
        specs = [(t.name, t.description, t.parameters) for t in cmd.tools]
        self.rt.client_tools.declare(row.id, self.user.id, self.conn, self.conn.send, specs)
        names = [t.name for t in cmd.tools]
        await self.conn.send(reply(rid, "ok", session_id=row.id, tools=names))

    async def _client_tool_result(self, rid: RequestId, cmd: ClientToolResult) -> None:
        if not self.rt.client_tools.answer(self.conn, cmd.call_id, cmd.ok, cmd.output):
            raise NotFoundError(f"no call {cmd.call_id!r} of this connection waits")

    # -- sessions -----------------------------------------------------------------------

    async def _sessions(self, rid: RequestId, cmd: Sessions) -> None:
        if cmd.action == "list":
            await self._list_sessions(rid)
            return
        if cmd.action == "create":
            if cmd.session_id and await self.rt.store.get_session(cmd.session_id):
                await self._owned(cmd.session_id)  # another user's: forbidden, as elsewhere
                raise ExistsError(
                    f"session {cmd.session_id!r} already exists", session_id=cmd.session_id
                )
            if cmd.cwd is not None:
                await self.cwd_check(cmd.session_id).check(cmd.cwd)
            row = await self._create(cmd.session_id, cmd.profile)
            await self.conn.send(reply(rid, "session", session_id=row.id, created=True))
            return
        if cmd.session_id is None:
            raise ProtocolError(f"sessions {cmd.action} needs a session_id")
        if cmd.action == "history":
            await self._history(rid, cmd.session_id, cmd.limit, cmd.cursor)
        elif cmd.action == "rename":
            await self._rename(rid, cmd.session_id, cmd.title)
        else:
            await self._delete(rid, cmd.session_id)

    async def _list_sessions(self, rid: RequestId) -> None:
        store = self.rt.store
        rows = await store.list_sessions(None if self.user.is_admin else self.user.id)
        names = {u["id"]: u["name"] for u in await store.list_users()}
        sessions = []
        for row in rows:
            actor = self.rt.sessions.actor(row.id)
            sessions.append(
                {
                    "session_id": row.id,
                    "title": row.title,
                    "profile": row.profile_id,
                    "user": names.get(row.user_id, row.user_id),
                    "created_at": row.created_at,
                    "updated_at": row.updated_at,
                    "busy": bool(actor is not None and actor.busy),
                }
            )
        await self.conn.send(reply(rid, "sessions", action="list", sessions=sessions))

    async def _history(
        self, rid: RequestId, session_id: str, limit: int | None, cursor: str | None
    ) -> None:
        """One page of the display history: the messages after `cursor`, at most `limit`
        and `HISTORY_PAGE_MAX_BYTES` (one message at least), and the cursor of the next
        page (None: this page is the last). The seq and epoch are the session's before
        the page was read: a client that read every page subscribes from the last's."""
        await self._owned(session_id)
        actor = await self._actor(session_id)
        seq, epoch = actor.seq, actor.epoch
        page = await self.rt.store.load_messages_page(
            session_id,
            after=None if cursor is None else cursor_position(cursor),
            limit=limit or HISTORY_LIMIT_MAX,
            max_bytes=HISTORY_PAGE_MAX_BYTES,
        )
        messages = history_for_user(page.messages, admin=self.user.is_admin)
        after = page.next_after
        frame = reply(
            rid,
            "sessions",
            action="history",
            session_id=session_id,
            messages=messages,
            seq=seq,
            epoch=epoch,
            next_cursor=None if after is None else history_cursor(after),
        )
        await self.conn.send(frame)

    async def _rename(self, rid: RequestId, session_id: str, title: str | None) -> None:
        """A new title for a session of the sender's (an admin: any): one line, cleaned
        and cut as a first message's title is; an empty one is refused."""
        if title is None:
            raise ProtocolError("sessions rename needs a title")
        await self._owned(session_id)
        clean = title_from(title)
        if not clean:
            raise ProtocolError("field 'title' must not be empty")
        await self.rt.store.update_session(session_id, title=clean)
        log.info("session %s renamed by %s", session_id, self.user.name)
        await self.conn.send(
            reply(rid, "sessions", action="rename", session_id=session_id, title=clean)
        )

    async def _delete(self, rid: RequestId, session_id: str) -> None:
        await self._owned(session_id)
        deleted = await self.rt.session_service.delete(
            session_id, before=lambda: self.conn.unsubscribe(session_id)
        )
        log.info("session %s deleted by %s", session_id, self.user.name)
        await self.conn.send(
            reply(rid, "sessions", action="delete", session_id=session_id, deleted=deleted)
        )

    async def _signin_code(self, rid: RequestId, _cmd: SigninCode) -> None:
        """A one-time code that signs the browser page in as this connection's user."""
        code, ttl = self.conn.signin_code()
        log.info("a sign-in code was issued to %s", self.user.name)
        await self.conn.send(reply(rid, wire.SIGNIN_CODE, code=code, expires_in_sec=ttl))

    # -- schedules ----------------------------------------------------------------------

    async def _schedule(self, rid: RequestId, cmd: Schedule) -> None:
        await handle_schedule(self.rt.scheduler, self.user, self._owned, self.conn, rid, cmd)

    # -- tasks --------------------------------------------------------------------------

    async def _usage(self, rid: RequestId, cmd: Usage) -> None:
        if cmd.session_id is not None:
            await self._owned(cmd.session_id)
        report = await usage_report(self.rt, self.user, cmd)
        await self.conn.send(reply(rid, "usage", **report))

    async def _tasks(self, rid: RequestId, cmd: Tasks) -> None:
        sup = self.rt.supervisor
        if cmd.session_id is not None:
            await self._owned(cmd.session_id)
            session_ids = [cmd.session_id]
        else:
            rows = await self.rt.store.list_sessions(None if self.user.is_admin else self.user.id)
            session_ids = [r.id for r in rows]
        if cmd.action == "list":
            tasks = [_job_info(job) for sid in session_ids for job in sup.list_jobs(sid)]
            if self.rt.cluster is not None:  # and those other daemons run
                tasks += await self.rt.cluster.calls.jobs_elsewhere(session_ids)
            await self.conn.send(reply(rid, "tasks", action="list", tasks=tasks))
            return
        if not cmd.task_id:
            raise ProtocolError(f"tasks {cmd.action} needs a task_id")
        job = next((j for sid in session_ids if (j := sup.get(sid, cmd.task_id))), None)
        if (
            job is None and self.rt.cluster is not None
        ):  # another daemon's (core/cluster/owner_calls.py)
            answer = await self.rt.cluster.calls.task(cmd.action, session_ids, cmd.task_id)
            if answer is not None:
                await self.conn.send(reply(rid, "tasks", action=cmd.action, **answer))
                return
        if job is None:
            raise NotFoundError(f"no task {cmd.task_id!r} in your sessions")
        if cmd.action == "check":
            info = _job_info(job)
            if job.result is not None:
                info["result"] = job.result.content()
            if job.error is not None:
                info["error"] = job.error
            await self.conn.send(reply(rid, "tasks", action="check", task=info))
        else:
            cancelled = sup.cancel(job.session_id, job.task_id)
            log.info("task %s cancelled by %s: %s", job.task_id, self.user.name, cancelled)
            await self.conn.send(
                reply(rid, "tasks", action="cancel", task_id=job.task_id, cancelled=cancelled)
            )


def _job_info(job: Job) -> dict[str, Any]:
    end = job.finished_at if job.finished_at is not None else trio.current_time()
    return task_info(
        job.task_id, job.tool, job.status, end - job.started_at, job.session_id, job.args_summary
    )
