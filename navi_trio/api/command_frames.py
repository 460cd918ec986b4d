"""The client commands: one `attrs.frozen` class per frame type, and their union `Command`.

Each field says its type (structured by the strict converter: a string refuses a number,
a `Literal` names its choices) and its checks (the validators of `frame_fields`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import attrs

from navi_trio.api import frame_fields as check
from navi_trio.profiles import BudgetConfig

SIGNIN_CODE_MAX = 64


@attrs.frozen
class Hello:
    """The first frame: a token, or a one-time sign-in code (api/signin.py) that the
    daemon exchanges for the token that asked for it."""

    token: str | None = attrs.field(default=None, validator=check.at_most(1024))
    code: str | None = attrs.field(default=None, validator=check.at_most(SIGNIN_CODE_MAX))

    def __attrs_post_init__(self) -> None:
        if (self.token is None) == (self.code is None):
            raise ValueError("a hello carries a token or a sign-in code (one of the two)")
        if not (self.token or self.code or "").strip():
            raise ValueError("the hello's token must not be empty")


@attrs.frozen
class SigninCode:
    """Ask for a one-time sign-in code for the browser page (``navi web``)."""


@attrs.frozen
class SendMessage:
    content: str = attrs.field(validator=check.not_blank)
    session_id: str | None = attrs.field(default=None, validator=check.session_id)
    cwd: str | None = attrs.field(
        default=None, validator=[check.at_most(check.PATH_MAX_CHARS), check.absolute]
    )
    profile: str | None = attrs.field(default=None, validator=check.name)
    # The tool policy's mode: clamped to what the sender's role allows.
    mode: Literal["read-only", "workspace", "full"] | None = None
    # What to do when the session is busy (core/turn/steering.py); None: the profile's.
    on_busy: Literal["enqueue", "reject", "interrupt", "steer"] | None = None
    # Budgets for this run, config.json's shape: they only lower the configured ones.
    budget: BudgetConfig | None = None
    # The W3C trace context its run continues (a peer daemon's ask sends it): any JSON
    # here, checked by api/tracing.py `trace_carrier`; a bad one is dropped, not refused.
    traceparent: Any = None
    tracestate: Any = None
    # The client's key for this message: a second message of the session with the same
    # key does not run; its ok repeats the first one's, with ``duplicate: true``.
    key: str | None = attrs.field(default=None, validator=check.message_key)


@attrs.frozen
class Stop:
    session_id: str = attrs.field(validator=check.session_id)


@attrs.frozen
class Compact:
    session_id: str = attrs.field(validator=check.session_id)


@attrs.frozen
class Subscribe:
    session_id: str = attrs.field(validator=check.session_id)
    last_seq: int | None = None
    epoch: str | None = attrs.field(default=None, validator=check.name)


@attrs.frozen
class Unsubscribe:
    session_id: str = attrs.field(validator=check.session_id)


@attrs.frozen
class CommandList:
    """The commands kept as files of a run in `cwd` (checked as a message's cwd is,
    for `session_id`'s owner), and the user's own."""

    session_id: str | None = attrs.field(default=None, validator=check.session_id)
    cwd: str | None = attrs.field(
        default=None, validator=[check.at_most(check.PATH_MAX_CHARS), check.absolute]
    )


@attrs.frozen
class Tasks:
    action: Literal["list", "check", "cancel"]
    session_id: str | None = attrs.field(default=None, validator=check.session_id)
    task_id: str | None = attrs.field(default=None, validator=check.name)


@attrs.frozen
class Sessions:
    action: Literal["list", "create", "delete", "history", "rename"]
    session_id: str | None = attrs.field(default=None, validator=check.session_id)
    profile: str | None = attrs.field(default=None, validator=check.name)
    # history: at most `limit` messages in the reply, from after `cursor` (a reply's
    # next_cursor; none: from the first message).
    limit: int | None = attrs.field(
        default=None, validator=[check.history_limit, check.history_only]
    )
    cursor: str | None = attrs.field(default=None, validator=[check.cursor, check.history_only])
    # create: the cwd the session's messages will carry, checked now as a message's is,
    # so that a client learns of a refused folder before any message.
    cwd: str | None = attrs.field(
        default=None,
        validator=[check.at_most(check.PATH_MAX_CHARS), check.absolute, check.create_only],
    )
    # rename: the session's new title (one line, cut as a first message's title is).
    title: str | None = attrs.field(
        default=None, validator=[check.at_most(check.TITLE_MAX_CHARS), check.rename_only]
    )


CLIENT_TOOLS_MAX = 64
CLIENT_TOOL_SCHEMA_MAX_BYTES = 64 * 1024
# Named as an MCP server's tools are, so that the policy asks for them as for those.
_CLIENT_TOOL = re.compile(r"mcp__[A-Za-z0-9_-]{1,40}__[A-Za-z0-9_.-]{1,64}")


def _client_tool_name(_inst: Any, attr: attrs.Attribute[Any], value: str) -> None:
    if not _CLIENT_TOOL.fullmatch(value):
        raise ValueError(
            f"field {attr.name!r} must be mcp__<server>__<tool> (letters, digits, _ - .), "
            f"not {check.shown(value)}"
        )


def _schema(_inst: Any, attr: attrs.Attribute[Any], value: dict[str, Any]) -> None:
    size = len(json.dumps(value).encode("utf-8"))
    if size > CLIENT_TOOL_SCHEMA_MAX_BYTES:
        raise ValueError(
            f"field {attr.name!r} is {size} bytes, more than {CLIENT_TOOL_SCHEMA_MAX_BYTES}"
        )


@attrs.frozen
class ClientToolSpec:
    name: str = attrs.field(validator=_client_tool_name)
    description: str = attrs.field(validator=check.at_most(4096))
    parameters: dict[str, Any] = attrs.field(validator=_schema)


def _few_tools(_inst: Any, attr: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    if len(value) > CLIENT_TOOLS_MAX:
        raise ValueError(
            f"field {attr.name!r} holds {len(value)} tools, more than {CLIENT_TOOLS_MAX}"
        )


@attrs.frozen
class ClientTools:
    """The tools this connection runs for one session of its user (none: withdrawn)."""

    session_id: str = attrs.field(validator=check.session_id)
    tools: tuple[ClientToolSpec, ...] = attrs.field(validator=_few_tools)


@attrs.frozen
class ClientToolResult:
    """This connection's answer to one of its ``client_tool_call`` frames."""

    call_id: str = attrs.field(validator=[check.not_blank, check.at_most(64)])
    ok: bool
    output: str = ""


@attrs.frozen
class Approval:
    """approve / deny: the session owner's answer to an `approval_request`."""

    session_id: str = attrs.field(validator=check.session_id)
    call_id: str = attrs.field(validator=[check.not_blank, check.at_most(check.CALL_ID_MAX_CHARS)])
    scope: Literal["once", "session", "always"] = "once"
    decision: Literal["approve", "deny"] = "approve"  # from the frame's type


@attrs.frozen
class Context:
    """The project files in effect for a run in `cwd` of `session_id` (its session
    folder; None: no session yet)."""

    cwd: str | None = attrs.field(
        default=None, validator=[check.at_most(check.PATH_MAX_CHARS), check.absolute]
    )
    session_id: str | None = attrs.field(default=None, validator=check.session_id)


@attrs.frozen
class Grants:
    """List the approvals granted "for the session" or "always", or revoke one by id."""

    action: Literal["list", "revoke"] = "list"
    grant_id: str | None = attrs.field(default=None, validator=check.grant)


@attrs.frozen
class Checkpoints:
    """A session's rewind points, checkpoints and branches."""

    session_id: str = attrs.field(validator=check.session_id)


@attrs.frozen
class Rewind:
    """Preview a rewind (no `confirm`), or do what the preview with that token showed."""

    session_id: str = attrs.field(validator=check.session_id)
    to: str | None = attrs.field(default=None, validator=check.point)
    branch: str | None = attrs.field(default=None, validator=check.point)
    restore: Literal["chat", "files", "both"] = "both"
    confirm: str | None = attrs.field(default=None, validator=check.token)
    # A file both the session's calls and someone else changed since: kept as it is
    # (keep), or put back as the checkpoint has it too (restore).
    conflicts: Literal["keep", "restore"] = "keep"


@attrs.frozen
class Fork:
    """A new session from this one's history up to `at` (all of it without), with a copy
    of its files (`files`) in `folder` (default: inside the new session's folder)."""

    session_id: str = attrs.field(validator=check.session_id)
    at: str | None = attrs.field(default=None, validator=check.point)
    files: bool = False
    folder: str | None = attrs.field(
        default=None, validator=[check.at_most(check.PATH_MAX_CHARS), check.absolute]
    )
    new_session_id: str | None = attrs.field(default=None, validator=check.session_id)


@attrs.frozen
class Folders:
    """The sub-folders of `path` the sender may use as a cwd (no `path`: where to start
    and the folders they used last), for session `session_id` (None: a new one)."""

    path: str | None = attrs.field(
        default=None, validator=[check.at_most(check.PATH_MAX_CHARS), check.absolute]
    )
    session_id: str | None = attrs.field(default=None, validator=check.session_id)


@attrs.frozen
class Changes:
    """What the session's tool calls changed since user message `since` (None: since
    its first), as diffs."""

    session_id: str = attrs.field(validator=check.session_id)
    since: str | None = attrs.field(default=None, validator=check.point)


@attrs.frozen
class Schedule:
    """schedule add / list / remove / pause / resume (core/triggers/schedules.py)."""

    action: Literal["add", "list", "remove", "pause", "resume"]
    schedule_id: str | None = attrs.field(default=None, validator=check.name)
    session_id: str | None = attrs.field(default=None, validator=check.session_id)
    new: bool = False  # each run in a new session (of `profile`)
    profile: str | None = attrs.field(default=None, validator=check.name)
    cron: str | None = attrs.field(default=None, validator=check.at_most(check.SPEC_MAX_CHARS))
    every: str | None = attrs.field(default=None, validator=check.at_most(check.SPEC_MAX_CHARS))
    at: str | None = attrs.field(default=None, validator=check.at_most(check.SPEC_MAX_CHARS))
    message: str | None = attrs.field(
        default=None, validator=check.at_most(check.SCHEDULE_MESSAGE_MAX)
    )
    catch_up: bool = True  # a due time missed while no daemon ran: run once at start-up
    budget: BudgetConfig | None = None


@attrs.frozen
class Usage:
    """What the runs spent, summed by `by`: the asker's own (an admin: everyone's, or
    `user`'s), one session's, since a time (``7d``, ``12h``, a date, or epoch seconds)."""

    by: Literal["model", "profile", "day", "session", "user"] = "model"
    session_id: str | None = attrs.field(default=None, validator=check.session_id)
    user: str | None = attrs.field(default=None, validator=check.name)
    since: str | None = attrs.field(default=None, validator=check.at_most(64))


Command = (
    Hello
    | ClientTools
    | ClientToolResult
    | SendMessage
    | Stop
    | Compact
    | Subscribe
    | Unsubscribe
    | Tasks
    | CommandList
    | Sessions
    | Approval
    | Grants
    | Checkpoints
    | Rewind
    | Fork
    | Folders
    | Changes
    | Schedule
    | Usage
    | Context
    | SigninCode
)
