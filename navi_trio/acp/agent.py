"""`navi acp`: navi as an Agent Client Protocol agent on stdin/stdout.

Every session is a navi session of the daemon, reached through `open_daemon`: each
prompt sends the message on a connection of its own and follows its run to the
top-level ``stream_end``, through drops (`open_redialing`: dialled again, the editor's
tools declared again, the message sent again with its key, so it runs once);
approvals become ``session/request_permission``; ``session/cancel`` sends navi's
``stop``. The editor's MCP servers run in this process, their calls coming back on the
prompt's connection as ``client_tool_call`` frames.

Requests are validated with the SDK's schema models: a bad request is an ``Invalid
params`` error naming the field, and the agent goes on. When stdin closes, the runs in
flight are stopped (their partial answers saved) and the process exits 0.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pydantic
import trio
from acp import schema

from navi_trio import __version__, wire
from navi_trio.acp import updates as up
from navi_trio.acp.backend import Backend
from navi_trio.acp.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    RESOURCE_NOT_FOUND,
    AndThen,
    LineReader,
    Peer,
    RpcError,
)
from navi_trio.acp.servers import EditorServers, ServerHost
from navi_trio.api.redial import BACKOFF_FIRST
from navi_trio.approval_text import grant_line, part_lines
from navi_trio.command_text import CommandTooLongError, expand_command, usable
from navi_trio.errors import NaviError, RemoteError
from navi_trio.wire import Frame

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
# The user message sent to the daemon, in UTF-8 bytes: under its frame limit (1 MiB).
MAX_PROMPT_BYTES = 900_000
STOP_GRACE = 5.0  # stdin closed: how long the stops of the runs in flight may take
REPLY_TIMEOUT = 30.0  # a request to the daemon that is not a run
MODES = {
    "read-only": "Read-only: navi reads and searches, changes nothing",
    "workspace": "Workspace: navi may change files in the working folder; asks for the rest",
    "full": "Full: no sandbox (admins, in their own sessions)",
}
COMMANDS = {
    "compact": "compress the session's context (summarise the older part)",
    "rewind": "undo the last message: the chat and the files back to before it",
    "fork": "copy this session into a new one (its id is answered)",
}
ALLOW_ONCE, ALLOW_ALWAYS, REJECT_ONCE, REJECT_ALWAYS = (
    "allow_once",
    "allow_always",
    "reject_once",
    "reject_always",
)
PERMISSION_OPTIONS = [
    {"optionId": ALLOW_ONCE, "name": "Allow once", "kind": "allow_once"},
    {"optionId": ALLOW_ALWAYS, "name": "Allow always", "kind": "allow_always"},
    {"optionId": REJECT_ONCE, "name": "Reject once", "kind": "reject_once"},
    {"optionId": REJECT_ALWAYS, "name": "Reject always", "kind": "reject_always"},
]
# optionId -> navi's (approve, scope)
ANSWERS = {
    ALLOW_ONCE: (True, "once"),
    ALLOW_ALWAYS: (True, "always"),
    REJECT_ONCE: (False, "once"),
    REJECT_ALWAYS: (False, "always"),
}

M = TypeVar("M", bound=pydantic.BaseModel)


def parse(model: type[M], params: dict[str, Any]) -> M:
    """`params` as `model`, or an ``Invalid params`` error naming the bad fields."""
    try:
        return model.model_validate(params)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'params'}: {e['msg']}"
            for e in exc.errors()[:5]
        )
        raise RpcError(INVALID_PARAMS, f"invalid params: {problems}") from None


@attrs.define(eq=False)
class Prompt:
    """One ``session/prompt`` in flight."""

    stop_wanted: trio.Event = attrs.field(factory=trio.Event)
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True
        self.stop_wanted.set()


@attrs.define(eq=False)
class Session:
    session_id: str
    cwd: str
    mode: str
    profile: str | None
    prompt: Prompt | None = None
    # The editor's MCP servers for this session, run by this process (servers.py).
    servers: EditorServers | None = None
    # The commands kept as files in `cwd`, as the daemon listed them (name -> fields).
    files: dict[str, dict[str, str]] = attrs.Factory(dict)


@attrs.define(eq=False)
class Agent:
    """The ACP methods over one daemon (see the module docstring)."""

    backend: Backend
    default_mode: str | None = attrs.field(alias="mode")
    default_profile: str | None = attrs.field(alias="profile")
    # Where the editor's MCP servers run (None: refused).
    server_host: ServerHost | None = attrs.field(default=None, alias="servers")
    # The first wait before dialling the daemon again after a drop (a test's: 0).
    backoff: float = attrs.field(default=BACKOFF_FIRST, kw_only=True)
    sessions: dict[str, Session] = attrs.field(factory=dict, init=False)
    peer: Peer | None = attrs.field(default=None, init=False)

    def _peer(self) -> Peer:
        assert self.peer is not None
        return self.peer

    async def notify(self, session_id: str, update: dict[str, Any]) -> None:
        await self._peer().notify("session/update", {"sessionId": session_id, "update": update})

    async def _request(self, frame: Frame) -> Frame:
        try:
            with daemon_errors(), trio.fail_after(REPLY_TIMEOUT):
                async with self.backend.connect() as daemon:
                    return await daemon.request(frame, timeout=REPLY_TIMEOUT)
        except trio.TooSlowError:
            what = frame.get("type")
            raise RpcError(INTERNAL_ERROR, f"the daemon did not answer {what!r} in time") from None

    async def _create(self, cwd: str) -> str:
        """A new navi session of ours (its reply is a ``session`` frame, not an ``ok``);
        the daemon checks `cwd` as it checks a message's, so a folder it refuses is an
        error of ``session/new`` rather than of the first prompt."""
        from navi_trio.api.daemon_client import remote_error

        frame: Frame = {"type": wire.SESSIONS, "action": "create", "id": "acp-create", "cwd": cwd}
        if self.default_profile:
            frame["profile"] = self.default_profile
        try:
            with daemon_errors(), trio.fail_after(REPLY_TIMEOUT):
                async with self.backend.connect() as daemon:
                    await daemon.send(frame)
                    while True:
                        reply = await daemon.receive()
                        if reply.get("id") != "acp-create":
                            continue
                        if reply["type"] == wire.ERROR:
                            raise remote_error(reply)
                        return str(reply["session_id"])
        except trio.TooSlowError:
            raise RpcError(
                INTERNAL_ERROR, "the daemon did not create the session in time"
            ) from None

    def _session(self, session_id: str) -> Session:
        found = self.sessions.get(session_id)
        if found is None:
            raise RpcError(
                RESOURCE_NOT_FOUND,
                f"unknown session {session_id!r}: create one with session/new or open it "
                "with session/load",
            )
        return found

    def methods(self) -> dict[str, Callable[[dict[str, Any]], Awaitable[Any]]]:
        return {
            "initialize": self.initialize,
            "authenticate": self.authenticate,
            "session/new": self.new_session,
            "session/load": self.load_session,
            "session/list": self.list_sessions,
            "session/fork": self.fork_session,
            "session/resume": self.resume_session,
            "session/prompt": self.prompt,
            "session/set_mode": self.set_mode,
            "session/set_config_option": self.set_config_option,
        }

    def notifications(self) -> dict[str, Callable[[dict[str, Any]], Awaitable[Any]]]:
        return {"session/cancel": self.cancel}

    async def initialize(self, params: dict[str, Any]) -> Any:
        parse(schema.InitializeRequest, params)
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "mcpCapabilities": {"http": True, "sse": False},
                "sessionCapabilities": {"list": {}, "fork": {}, "resume": {}},
            },
            "agentInfo": {"name": "navi", "title": "navi", "version": __version__},
            "authMethods": [
                {
                    "id": "navi-token",
                    "type": "env_var",
                    "name": "navi token",
                    "description": "a daemon's token, for `navi acp --url` to another "
                    "daemon; the local daemon's is read from the data folder",
                    "vars": [{"name": "NAVI_TOKEN", "label": "navi token", "optional": True}],
                }
            ],
        }

    async def authenticate(self, params: dict[str, Any]) -> Any:
        # The token came with the environment (NAVI_TOKEN) or the data folder: nothing to do.
        return {}

    def _modes(self, session: Session) -> dict[str, Any]:
        allowed = [m for m in MODES if m != "full" or self.backend.role == "admin"]
        return {
            "currentModeId": session.mode,
            "availableModes": [{"id": m, "name": m, "description": MODES[m]} for m in allowed],
        }

    def _profile(self, session: Session) -> str:
        profiles = self.backend.profiles
        return session.profile or self.backend.default_profile or (profiles or ["general"])[0]

    def _config_options(self, session: Session) -> list[dict[str, Any]]:
        profiles = self.backend.profiles
        current = self._profile(session)
        return [
            {
                "id": "profile",
                "name": "Profile",
                "type": "select",
                "currentValue": current,
                "description": "navi's profile for the next turns",
                "options": [{"value": p, "name": p} for p in profiles],
            }
        ]

    def _config_update(self, session: Session) -> dict[str, Any]:
        return {
            "sessionUpdate": "config_option_update",
            "configOptions": self._config_options(session),
        }

    async def _mode_changed(self, session: Session, mode: str) -> None:
        """navi gave the run another mode than the editor's (the role's ceiling, the
        profile's policy): the editor shows the one in force."""
        session.mode = mode
        await self.notify(
            session.session_id, {"sessionUpdate": "current_mode_update", "currentModeId": mode}
        )

    def _opened(self, session: Session) -> dict[str, Any]:
        return {"modes": self._modes(session), "configOptions": self._config_options(session)}

    async def _commands(self, session_id: str) -> None:
        """Tell the editor navi's commands and those kept as files in the session's folder; a
        command of ours wins over a file of its name."""
        offered = [{"name": n, "description": d} for n, d in COMMANDS.items()]
        session = self.sessions.get(session_id)
        if session is not None:
            session.files = await self._file_commands(session)
            for name, c in session.files.items():
                item: dict[str, Any] = {"name": name, "description": c.get("description", "")}
                if c.get("argument_hint"):
                    item["input"] = {"hint": c["argument_hint"]}
                offered.append(item)
        await self.notify(
            session_id, {"sessionUpdate": "available_commands_update", "availableCommands": offered}
        )

    async def _file_commands(self, session: Session) -> dict[str, dict[str, str]]:
        try:
            listed = await self._request(wire.commands(session.cwd, session.session_id))
        except RpcError as exc:  # an older daemon, a folder refused: navi's own only
            log.warning("no commands kept as files for %s: %s", session.cwd, exc)
            return {}
        items = [c for c in listed.get("commands") or [] if isinstance(c, dict)]
        kept, notices = usable(items, COMMANDS)
        for notice in [*notices, *(str(n) for n in listed.get("notices") or [])]:
            log.warning("%s", notice)
        return kept

    def _cwd(self, cwd: str) -> str:
        if not os.path.isabs(cwd):
            raise RpcError(INVALID_PARAMS, f"cwd {cwd!r} must be an absolute path")
        if not Path(cwd).is_dir():
            raise RpcError(INVALID_PARAMS, f"cwd {cwd!r} is not a folder")
        return cwd

    async def _mcp_servers(self, servers: list[Any]) -> EditorServers | None:
        """The editor's MCP servers started here, for one session (see editors.md)."""
        if not servers:
            return None
        if self.server_host is None:
            raise RpcError(INVALID_PARAMS, "mcpServers: this agent runs no MCP servers")
        return await self.server_host.start(servers)

    def _adopt(self, session: Session, servers: EditorServers | None) -> None:
        """`session` uses `servers` from now on (those it had are stopped)."""
        if session.servers is not None and session.servers is not servers:
            session.servers.stop()
        session.servers = servers

    async def new_session(self, params: dict[str, Any]) -> Any:
        req = parse(schema.NewSessionRequest, params)
        cwd = self._cwd(req.cwd)
        servers = await self._mcp_servers(req.mcp_servers)
        try:
            sid = await self._create(cwd)
        except BaseException:
            if servers is not None:
                servers.stop()
            raise
        session = Session(sid, cwd, self.default_mode or "workspace", self.default_profile)
        session.servers = servers
        self.sessions[sid] = session
        return AndThen({"sessionId": sid, **self._opened(session)}, lambda: self._commands(sid))

    async def load_session(self, params: dict[str, Any]) -> Any:
        req = parse(schema.LoadSessionRequest, params)
        cwd = self._cwd(req.cwd)
        sid = req.session_id
        reply = await self._request(wire.history(sid))
        messages = [m for m in reply.get("messages") or [] if isinstance(m, dict)]
        old = self.sessions.get(sid)
        session = old or Session(sid, cwd, self.default_mode or "workspace", None)
        session.cwd = cwd
        self._adopt(session, await self._mcp_servers(req.mcp_servers))
        self.sessions[sid] = session
        for update in up.history(cwd, messages):
            await self.notify(sid, update)
        return AndThen(self._opened(session), lambda: self._commands(sid))

    async def fork_session(self, params: dict[str, Any]) -> Any:
        """navi's fork: a new session with the history so far (the files stay shared)."""
        req = parse(schema.ForkSessionRequest, params)
        cwd = self._cwd(req.cwd)
        reply = await self._request(wire.fork(req.session_id))
        sid = str(reply.get("new_session_id"))
        source = self.sessions.get(req.session_id)
        mode = source.mode if source else self.default_mode or "workspace"
        session = Session(sid, cwd, mode, source.profile if source else None)
        self._adopt(session, await self._mcp_servers(req.mcp_servers or []))
        self.sessions[sid] = session
        return AndThen({"sessionId": sid, **self._opened(session)}, lambda: self._commands(sid))

    async def resume_session(self, params: dict[str, Any]) -> Any:
        """As `session/load` without the replay: the editor shows what it has."""
        req = parse(schema.ResumeSessionRequest, params)
        cwd = self._cwd(req.cwd)
        await self._request(wire.history(req.session_id, limit=1))  # it exists, and is ours
        session = self.sessions.get(req.session_id) or Session(
            req.session_id, cwd, self.default_mode or "workspace", None
        )
        session.cwd = cwd
        self._adopt(session, await self._mcp_servers(req.mcp_servers or []))
        self.sessions[req.session_id] = session
        return AndThen(self._opened(session), lambda: self._commands(req.session_id))

    async def list_sessions(self, params: dict[str, Any]) -> Any:
        req = parse(schema.ListSessionsRequest, params)
        reply = await self._request(wire.sessions_list())
        rows = []
        for s in reply.get("sessions") or []:
            sid = str(s.get("session_id"))
            known = self.sessions.get(sid)
            cwd = known.cwd if known else (req.cwd or str(Path.home()))
            row = {"sessionId": sid, "cwd": cwd, "title": s.get("title") or None}
            if isinstance(s.get("updated_at"), str):
                row["updatedAt"] = s["updated_at"]
            rows.append(row)
        return {"sessions": rows}

    async def set_mode(self, params: dict[str, Any]) -> Any:
        req = parse(schema.SetSessionModeRequest, params)
        session = self._session(req.session_id)
        allowed = self._modes(session)["availableModes"]
        if req.mode_id not in {m["id"] for m in allowed}:
            raise RpcError(
                INVALID_PARAMS,
                f"unknown mode {req.mode_id!r} (modes: {', '.join(m['id'] for m in allowed)})",
            )
        session.mode = req.mode_id
        return {}

    async def set_config_option(self, params: dict[str, Any]) -> Any:
        req = parse(schema.SetSessionConfigOptionSelectRequest, params)
        session = self._session(req.session_id)
        if req.config_id != "profile":
            raise RpcError(
                INVALID_PARAMS, f"unknown config option {req.config_id!r} (options: profile)"
            )
        if req.value not in self.backend.profiles:
            raise RpcError(
                INVALID_PARAMS,
                f"unknown profile {req.value!r} (profiles: {', '.join(self.backend.profiles)})",
            )
        session.profile = req.value
        return {"configOptions": self._config_options(session)}

    async def cancel(self, params: dict[str, Any]) -> None:
        req = parse(schema.CancelNotification, params)
        session = self.sessions.get(req.session_id)
        if session is not None and session.prompt is not None:
            session.prompt.cancel()

    async def prompt(self, params: dict[str, Any]) -> Any:
        req = parse(schema.PromptRequest, params)
        session = self._session(req.session_id)
        if session.prompt is not None:
            raise RpcError(
                INVALID_REQUEST,
                f"session {session.session_id!r} is already "
                "running a prompt: cancel it or wait for its answer",
            )
        text = prompt_text(req.prompt)
        session.prompt = prompt = Prompt()
        try:
            words = text.strip().split(maxsplit=1)
            command, rest = (words + ["", ""])[:2]
            name = command.removeprefix("/")
            if command.startswith("/") and name in COMMANDS:
                return await self._command(session, name)
            kept = None
            if command.startswith("/"):  # read now: the files may have changed since
                session.files = await self._file_commands(session)
                kept = session.files.get(name)
            if kept is not None:  # a command kept as a file: its prompt, with the rest
                try:
                    text = expand_command(kept.get("body", ""), rest)
                except CommandTooLongError as exc:
                    raise RpcError(INVALID_PARAMS, f"prompt: {command}: {exc}") from None
            return await self._run(session, prompt, text)
        finally:
            session.prompt = None

    async def _command(self, session: Session, name: str) -> Any:
        sid = session.session_id
        if name == "compact":
            await self._request(wire.compact(sid))
            said = "navi: the context is compacted"
        elif name == "rewind":
            said = await self._rewind_last(sid)
        else:
            reply = await self._request(wire.fork(sid))
            new = reply.get("new_session_id")
            said = f"navi: forked into session {new} (open it with session/load)"
        await self.notify(
            sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": said}}
        )
        return {"stopReason": "end_turn"}

    async def _rewind_last(self, sid: str) -> str:
        """navi's rewind to before the session's last message, chat and files: the
        preview, then its confirmation (as `navi rewind` does)."""
        listed = await self._request(wire.checkpoints(sid))
        messages = [m for m in listed.get("messages") or [] if isinstance(m, dict)]
        if not messages:
            return "navi: nothing to rewind: this session has no messages"
        to = str(messages[-1].get("message_id"))
        preview = await self._request(wire.rewind(sid, to=to))
        done = await self._request(wire.rewind(sid, to=to, confirm=str(preview.get("token"))))
        removed = done.get("messages_removed", preview.get("messages_removed"))
        text = up.cut(" ".join(str(messages[-1].get("text", "")).split()), 80)
        return f"navi: rewound to before {text!r} ({removed} messages removed, files restored)"

    async def _run(self, session: Session, prompt: Prompt, text: str) -> Any:
        from navi_trio.api.daemon_client import DaemonConnection, OurRun
        from navi_trio.api.redial import open_redialing

        sid = session.session_id
        mapper = up.Updates(session.cwd)
        end: Frame | None = None
        failure = ""  # the run's own error event, if any
        servers = session.servers

        async def declare(daemon: DaemonConnection) -> None:
            """On each connection: the daemon calls them through it, for this run."""
            if servers is not None and servers.tools:
                await daemon.request(servers.declaration(sid))

        with daemon_errors():
            async with (
                open_redialing(
                    self.backend.connect,
                    url=self.backend.url,
                    backoff=self.backoff,
                    on_connect=declare,
                ) as daemon,
                trio.open_nursery() as nursery,
            ):
                await declare(daemon.daemon)
                accepted = await daemon.send_message(
                    text,
                    session_id=sid,
                    profile=session.profile,
                    cwd=session.cwd,
                    mode=session.mode,
                )
                ours = OurRun.of(accepted, text)
                if accepted.mode is not None and accepted.mode != session.mode:
                    await self._mode_changed(session, accepted.mode)

                async def send_stop() -> None:
                    await prompt.stop_wanted.wait()
                    if not ours.started:  # queued behind another run: not ours to stop
                        nursery.cancel_scope.cancel()
                        return
                    await daemon.send(wire.stop(sid))

                nursery.start_soon(send_stop)
                while not ours.ended:
                    frame = await daemon.receive()
                    if frame["type"] == wire.CLIENT_TOOL_CALL:
                        nursery.start_soon(self._client_call, daemon, session, frame)
                        continue
                    if frame["type"] == wire.ERROR and not isinstance(frame.get("seq"), int):
                        log.warning("the daemon refused: %s", frame.get("message"))
                        continue
                    if not ours.ours(frame):
                        continue
                    if frame["type"] == "approval_request":
                        nursery.start_soon(self._permission, daemon, session, mapper, frame)
                    switched = mapper.profile_switched(frame)
                    for update in mapper.of(frame):
                        await self.notify(sid, update)
                    if switched is not None and switched != self._profile(session):
                        session.profile = switched
                        await self.notify(sid, self._config_update(session))
                    if wire.is_top_end(frame):
                        end = frame
                    elif frame["type"] == wire.ERROR and not frame.get("is_subagent"):
                        failure = str(frame.get("message") or "")
                nursery.cancel_scope.cancel()
        if end is None or prompt.cancelled:
            return {"stopReason": "cancelled"}
        if end.get("reason") in ("error", "context_too_large"):
            why = failure or str(end.get("reason"))
            raise RpcError(INTERNAL_ERROR, f"the run failed: {why}")
        result: dict[str, Any] = {"stopReason": up.stop_reason(end)}
        used = up.usage(end)
        if used is not None:
            result["usage"] = used
        return result

    async def _permission(
        self, daemon: Any, session: Session, mapper: up.Updates, frame: Frame
    ) -> None:
        call_id = str(frame.get("call_id"))
        name, args = mapper.calls.get(call_id, (str(frame.get("tool")), {}))
        call: dict[str, Any] = {
            "toolCallId": call_id,
            "title": up.tool_title(name, args)
            if args
            else up.cut(str(frame.get("summary", "")), 200),
            "kind": up.tool_kind(name, args),
            "status": "pending",
            "rawInput": args or {"summary": frame.get("summary")},
        }
        change = up.diff(session.cwd, name, args)
        call["content"] = [change] if change else [up.text_content(str(frame.get("summary", "")))]
        parsed = [*part_lines(frame), grant_line(frame, '"Allow always"')]
        if frame.get("parts"):
            call["content"].append(up.text_content("\n".join(line for line in parsed if line)))
        try:
            reply = await self._peer().request(
                "session/request_permission",
                {
                    "sessionId": session.session_id,
                    "toolCall": call,
                    "options": PERMISSION_OPTIONS,
                },
            )
            outcome = reply.get("outcome") if isinstance(reply, dict) else None
            chosen = outcome.get("optionId") if isinstance(outcome, dict) else None
            approve, scope = ANSWERS.get(str(chosen), (False, "once"))
        except RpcError as exc:
            log.warning("the editor did not answer the permission request: %s", exc.message)
            approve, scope = False, "once"
        await daemon.send(wire.approval(approve, session.session_id, call_id, scope))

    async def _client_call(self, daemon: Any, session: Session, frame: Frame) -> None:
        """A call of one of the session's MCP tools, run here; its result to the daemon."""
        call_id, name = str(frame.get("call_id")), str(frame.get("name"))
        args = frame.get("arguments")
        if session.servers is None:
            ok, output = False, f"{name}: this session has no MCP servers of the editor"
        else:
            ok, output = await session.servers.call(name, args if isinstance(args, dict) else {})
        result = {"type": wire.CLIENT_TOOL_RESULT, "call_id": call_id, "ok": ok, "output": output}
        await daemon.send(result)

    def stop_all(self) -> None:
        """Stop every run in flight (stdin closed): each prompt sends its stop."""
        for session in self.sessions.values():
            if session.prompt is not None:
                session.prompt.cancel()


def prompt_text(blocks: list[Any]) -> str:
    """The user message for a prompt's content blocks (bounded: `MAX_PROMPT_BYTES`)."""
    parts: list[str] = []
    for block in blocks:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource_link":
            parts.append(f"[file: {_uri_path(block.uri)}]")
        elif kind == "resource":
            res = block.resource
            body = getattr(res, "text", None)
            where = _uri_path(res.uri)
            if body is None:
                parts.append(f"[file: {where}]")
            else:
                parts.append(f'<file path="{where}">\n{body}\n</file>')
        else:
            raise RpcError(
                INVALID_PARAMS,
                f"prompt: a {kind} block is not supported "
                "(navi takes text, resource_link and resource)",
            )
    text = "\n\n".join(parts)
    if not text.strip():
        raise RpcError(INVALID_PARAMS, "prompt: no text")
    size = len(text.encode("utf-8"))
    if size > MAX_PROMPT_BYTES:
        raise RpcError(INVALID_PARAMS, f"prompt: {size} bytes, more than {MAX_PROMPT_BYTES}")
    return text


def _uri_path(uri: str) -> str:
    return uri[len("file://") :] if uri.startswith("file://") else uri


@contextmanager
def daemon_errors() -> Iterator[None]:
    """The daemon's refusals and a lost daemon as JSON-RPC errors (also out of a
    nursery, where they come as a group of one)."""
    try:
        yield
    except (NaviError, BaseExceptionGroup) as exc:
        leaf = exc
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]
        if isinstance(leaf, RemoteError):
            raise _refused(leaf) from None
        if isinstance(leaf, NaviError):
            raise RpcError(INTERNAL_ERROR, str(leaf)) from None
        raise


def _refused(exc: RemoteError) -> RpcError:
    code = RESOURCE_NOT_FOUND if exc.code == "not_found" else INVALID_PARAMS
    if exc.code in ("internal", "storage", "storage_full"):
        code = INTERNAL_ERROR
    return RpcError(code, f"navi: {exc.detail} ({exc.code})")


@asynccontextmanager
async def stdio() -> AsyncIterator[tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream]]:
    """Our own handles on stdin and stdout; fd 1 is then pointed at stderr, so that a
    stray print or a library's banner cannot get between the editor's messages."""
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(os.dup(1))
    os.dup2(2, 1)
    try:
        yield stdin, stdout
    finally:
        with trio.CancelScope(shield=True):
            await stdin.aclose()
            await stdout.aclose()


async def serve_on(
    agent: Agent, stdin: trio.abc.ReceiveStream, stdout: trio.abc.SendStream
) -> None:
    """Serve ACP until `stdin` ends; then the runs in flight are stopped and their
    prompts get `STOP_GRACE` seconds to answer."""
    peer = Peer(LineReader(stdin), stdout, agent.methods(), agent.notifications())
    agent.peer = peer
    await peer.serve(agent.stop_all, STOP_GRACE)
