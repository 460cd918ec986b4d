"""The wire vocabulary (protocol v1): frame types, the protocol version, client frames.

Both ends import it and nothing else of navi_trio: `api/protocol.py` (the daemon's strict
reader of client frames and its encoder of server frames) takes the version and the
type names from here; every client (`api/daemon_client.py`'s `open_daemon`, the chat)
builds its frames with the builders below and reads the daemon's with `decode`.

Frames are plain dicts of JSON; the full protocol is in docs/pages/protocol.md
("WebSocket protocol"). Importing this module costs nothing beyond `json` and `secrets`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any

PROTOCOL_VERSION = 1
Frame = dict[str, Any]

# -- frame types ----------------------------------------------------------------------

# Client -> daemon.
HELLO = "hello"
MESSAGE = "message"
STOP = "stop"
COMPACT = "compact"
SUBSCRIBE = "subscribe"
UNSUBSCRIBE = "unsubscribe"
TASKS = "tasks"
SESSIONS = "sessions"
APPROVE = "approve"
DENY = "deny"
CHECKPOINTS = "checkpoints"  # a session's rewind points, checkpoints and branches
REWIND = "rewind"  # preview a rewind, or confirm one
FORK = "fork"
FOLDERS = "folders"  # the folders a user may pick as a cwd (and their replies)
CHANGES = "changes"  # what a session's tools changed since a message, as diffs
SCHEDULE = "schedule"  # add / list / remove / pause / resume
CLIENT_TOOLS = "client_tools"  # the tools this connection runs for a session
CLIENT_TOOL_RESULT = "client_tool_result"  # its answer to a client_tool_call
USAGE = "usage"  # what the runs spent (the accounts): asked, and its reply
CONTEXT = "context"  # the project files (instruction files, skills) in effect for a cwd
COMMANDS = "commands"  # the commands kept as files (navi_trio/command_text.py); its reply
SIGNIN_CODE = "signin_code"  # a one-time code that signs the browser page in (and its reply)
GRANTS = "grants"  # list / revoke the approvals given "for the session" or "always"
CLIENT_TYPES = (
    HELLO,
    MESSAGE,
    STOP,
    COMPACT,
    SUBSCRIBE,
    UNSUBSCRIBE,
    TASKS,
    SESSIONS,
    APPROVE,
    DENY,
    CHECKPOINTS,
    REWIND,
    FORK,
    SCHEDULE,
    CLIENT_TOOLS,
    CLIENT_TOOL_RESULT,
    FOLDERS,
    CHANGES,
    USAGE,
    CONTEXT,
    SIGNIN_CODE,
    COMMANDS,
    GRANTS,
)
CLIENT_TOOL_CALL = "client_tool_call"  # daemon -> the client that declared the tool

# Daemon -> client, besides a session's events (whose types are the AgentEvents').
WELCOME = "welcome"
ERROR = "error"
OK = "ok"
SESSION = "session"  # a new session's id, before the `ok` of the message that made it
RESYNC = "resync"  # the frames asked for are gone: reload the history
LAGGED = "lagged"  # the client fell behind and was cut off: subscribe again
TASK_UPDATE = "task_update"
# The run-ending and queueing events a follower of one message's run counts.
STREAM_END = "stream_end"
MESSAGE_QUEUED = "message_queued"
STEERED = "steered"  # a message sent with on_busy steer joined the running turn
# A `warning`'s code: a queued message the queue's cap dropped (or a stop let go of).
MESSAGE_DROPPED = "message_dropped"
QUEUE_FULL = "the queue was full"  # how a drop by the cap begins
EXCERPT_CHARS = 120  # what such a warning quotes of the message it names
SCHEDULES = "schedules"  # its replies
SCHEDULE_RUN = "schedule_run"  # a scheduled run ended (to its owner's clients, no seq)
ON_BUSY = ("enqueue", "reject", "interrupt", "steer")

# Out-of-band or reply frames: never part of a session's seq stream.
REPLY_TYPES = frozenset(
    {
        WELCOME,
        OK,
        SESSION,
        SESSIONS,
        TASKS,
        RESYNC,
        LAGGED,
        TASK_UPDATE,
        CHECKPOINTS,
        REWIND,
        FORK,
        FOLDERS,
        CHANGES,
        SCHEDULES,
        SCHEDULE_RUN,
        USAGE,
        CONTEXT,
        SIGNIN_CODE,
        COMMANDS,
        GRANTS,
    }
)


# -- reading the daemon's frames ------------------------------------------------------


class BadFrame(ValueError):
    """A daemon frame that is not a JSON object with a string "type"."""


def decode(text: str | bytes) -> Frame:
    """The frame in `text`, or `BadFrame` naming what is wrong with it."""
    if isinstance(text, bytes):
        raise BadFrame("the server sent a binary frame (expected JSON text)")
    try:
        frame = json.loads(text)
    except ValueError as exc:
        raise BadFrame(f"the server sent a frame that is not JSON: {exc}") from None
    except RecursionError:
        raise BadFrame("the server sent a frame nested too deeply to read") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise BadFrame(f"the server sent a frame without a type: {text[:80]!r}")
    return frame


def is_session_frame(frame: Frame) -> bool:
    """A frame of a session's stream (it carries an int seq)."""
    return frame.get("type") not in REPLY_TYPES and isinstance(frame.get("seq"), int)


def is_top_end(frame: Frame) -> bool:
    """The end of a top-level run (a sub-agent's stream_end is not)."""
    return frame.get("type") == STREAM_END and not frame.get("is_subagent")


def dropped_excerpt(text: str) -> str:
    """How a warning names a dropped message: its text on one line, cut short."""
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def dropped_by_the_cap(frame: Frame, text: str | None = None) -> bool:
    """Whether `frame` is the warning of a message the queue's cap dropped (with
    `text`: that message)."""
    said = str(frame.get("message", ""))
    if frame.get("type") != "warning" or frame.get("code") != MESSAGE_DROPPED:
        return False
    if not said.startswith(QUEUE_FULL):
        return False
    return text is None or f"the message {dropped_excerpt(text)!r}," in said


# -- the client's frames --------------------------------------------------------------


def encode(frame: Frame) -> str:
    return json.dumps(frame, ensure_ascii=False)


def hello(token: str) -> Frame:
    return {"type": HELLO, "token": token}


def message(
    content: str,
    session_id: str | None,
    profile: str | None = None,
    cwd: str | None = None,
    mode: str | None = None,
    on_busy: str | None = None,
    trace: Mapping[str, str] | None = None,
    key: str | None = None,
) -> Frame:
    """A user message; `key`: the client's key for it (sent again with the same key, it
    is not run twice: docs/pages/protocol.md)."""
    frame: Frame = {"type": MESSAGE, "content": content}
    if key:
        frame["key"] = key
    for key in ("traceparent", "tracestate"):  # the W3C trace context, when tracing
        if trace and trace.get(key):
            frame[key] = trace[key]
    if on_busy:
        frame["on_busy"] = on_busy
    if session_id:
        frame["session_id"] = session_id
    if profile:
        frame["profile"] = profile
    if cwd:
        frame["cwd"] = cwd
    if mode:
        frame["mode"] = mode
    return frame


def new_session_id() -> str:
    """A new session's id, chosen by the client (its first message makes the session)."""
    return "s-" + secrets.token_hex(6)


def message_key() -> str:
    """A new client key for a message (16 URL-safe characters): sent again with it, the
    message is not run twice."""
    return secrets.token_urlsafe(12)


def approval(approve: bool, session_id: str, call_id: str, scope: str = "once") -> Frame:
    """The owner's answer to an `approval_request`: approve or deny, once/session/always."""
    kind = APPROVE if approve else DENY
    return {"type": kind, "session_id": session_id, "call_id": call_id, "scope": scope}


def grants(action: str = "list", grant_id: str | None = None) -> Frame:
    """List the sender's approval grants (an admin's: everyone's), or revoke one."""
    frame: Frame = {"type": GRANTS, "action": action}
    if grant_id is not None:
        frame["grant_id"] = grant_id
    return frame


def stop(session_id: str) -> Frame:
    return {"type": STOP, "session_id": session_id}


def compact(session_id: str) -> Frame:
    return {"type": COMPACT, "session_id": session_id}


def subscribe(session_id: str, last_seq: int | None, epoch: str | None = None) -> Frame:
    frame: Frame = {"type": SUBSCRIBE, "session_id": session_id, "last_seq": last_seq}
    if epoch is not None:
        frame["epoch"] = epoch
    return frame


def unsubscribe(session_id: str) -> Frame:
    return {"type": UNSUBSCRIBE, "session_id": session_id}


def usage(
    by: str = "model",
    *,
    session_id: str | None = None,
    user: str | None = None,
    since: str | None = None,
) -> Frame:
    frame: Frame = {"type": USAGE, "by": by}
    for key, value in (("session_id", session_id), ("user", user), ("since", since)):
        if value is not None:
            frame[key] = value
    return frame


def tasks(action: str, session_id: str | None = None, task_id: str | None = None) -> Frame:
    frame: Frame = {"type": TASKS, "action": action}
    if session_id:
        frame["session_id"] = session_id
    if task_id:
        frame["task_id"] = task_id
    return frame


def tasks_list(session_id: str | None) -> Frame:
    return tasks("list", session_id)


def sessions(action: str, session_id: str | None = None) -> Frame:
    frame: Frame = {"type": SESSIONS, "action": action}
    if session_id:
        frame["session_id"] = session_id
    return frame


def signin_code() -> Frame:
    """Ask for a one-time code that signs the browser page in as this connection's user."""
    return {"type": SIGNIN_CODE}


def sessions_list() -> Frame:
    return sessions("list")


def history(session_id: str, cursor: str | None = None, limit: int | None = None) -> Frame:
    """A page of the session's history: from the first message, or after `cursor` (the
    `next_cursor` of the page before); at most `limit` messages (none: the daemon's)."""
    frame = sessions("history", session_id)
    if cursor is not None:
        frame["cursor"] = cursor
    if limit is not None:
        frame["limit"] = limit
    return frame


def context(cwd: str | None, session_id: str | None) -> Frame:
    """Ask which project files a run in `cwd` (of `session_id`) would be given."""
    frame: Frame = {"type": CONTEXT}
    if cwd is not None:
        frame["cwd"] = cwd
    if session_id is not None:
        frame["session_id"] = session_id
    return frame


def checkpoints(session_id: str) -> Frame:
    return {"type": CHECKPOINTS, "session_id": session_id}


def rewind(
    session_id: str,
    *,
    to: str | None = None,
    branch: str | None = None,
    restore: str = "both",
    confirm: str | None = None,
    conflicts: str | None = None,
) -> Frame:
    """Without `confirm`: the preview; with the preview's token: the rewind itself.
    `conflicts`: "restore" puts back files someone else changed too (default: kept)."""
    frame: Frame = {"type": REWIND, "session_id": session_id, "restore": restore}
    fields = (("to", to), ("branch", branch), ("confirm", confirm), ("conflicts", conflicts))
    for key, value in fields:
        if value is not None:
            frame[key] = value
    return frame


def fork(
    session_id: str,
    *,
    at: str | None = None,
    files: bool = False,
    folder: str | None = None,
    new_session_id: str | None = None,
) -> Frame:
    frame: Frame = {"type": FORK, "session_id": session_id, "files": files}
    for key, value in (("at", at), ("folder", folder), ("new_session_id", new_session_id)):
        if value is not None:
            frame[key] = value
    return frame


def schedule(action: str, **fields: object) -> Frame:
    """A ``schedule`` frame: add (with `session_id` or `new`, `profile`, one of `cron`,
    `every`, `at`, `message`, `catch_up`, `budget`), list, remove / pause / resume
    (`schedule_id`). Fields left None are not sent."""
    frame: Frame = {"type": SCHEDULE, "action": action}
    frame.update({k: v for k, v in fields.items() if v is not None})
    return frame


def commands(cwd: str | None = None, session_id: str | None = None) -> Frame:
    """Ask for the commands kept as files of a run in `cwd` (and the user's own)."""
    frame: Frame = {"type": COMMANDS}
    if cwd:
        frame["cwd"] = cwd
    if session_id:
        frame["session_id"] = session_id
    return frame
