"""Wire protocol v1: the one place a client frame becomes a command and an event a frame.

Client frames are JSON objects with a ``type``; each type is an `attrs.frozen` command
class, structured by one strict cattrs converter (a string field refuses a number, an
unknown key is refused, a `Literal` names its choices). Anything wrong raises a
`ProtocolError` subclass whose message names the problem and whose ``request_id``
echoes the frame's ``id`` when it could be read.

Server frames are plain dicts built here: `event_frame` (an AgentEvent with its
session id and seq), `error_frame`, `welcome_frame`. The full protocol is in the
README ("WebSocket protocol").
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import attrs
import cattrs

from navi_trio import __version__
from navi_trio.errors import FrameTooLargeError, ProtocolError, RequestError, UnknownTypeError
from navi_trio.events import AgentEvent, event_to_dict

PROTOCOL_VERSION = 1
Frame = dict[str, Any]
RequestId = str | int | None
KEEP_MAX_CHARS = 64_000  # an `EventFrame` keeps its JSON text up to this length

_SESSION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@+=-]{0,127}")


def _session_id(_inst: Any, attr: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not _SESSION_ID.fullmatch(value):
        raise ValueError(
            f"{attr.name} {value!r}: use 1-128 letters, digits or . _ @ + = - "
            "(not starting with . @ + = -)"
        )


def _not_blank(_inst: Any, attr: attrs.Attribute[Any], value: str) -> None:
    if not value.strip():
        raise ValueError(f"{attr.name} must not be empty")


def _absolute(_inst: Any, attr: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not Path(value).is_absolute():
        raise ValueError(f"{attr.name} {value!r} must be an absolute path")


# -- commands (client -> server) ----------------------------------------------------


@attrs.frozen
class Hello:
    token: str = attrs.field(validator=_not_blank)


@attrs.frozen
class SendMessage:
    content: str = attrs.field(validator=_not_blank)
    session_id: str | None = attrs.field(default=None, validator=_session_id)
    cwd: str | None = attrs.field(default=None, validator=_absolute)
    profile: str | None = None
    # The tool policy's mode: clamped to what the sender's role allows.
    mode: Literal["read-only", "workspace", "full"] | None = None


@attrs.frozen
class Stop:
    session_id: str = attrs.field(validator=_session_id)


@attrs.frozen
class Compact:
    session_id: str = attrs.field(validator=_session_id)


@attrs.frozen
class Subscribe:
    session_id: str = attrs.field(validator=_session_id)
    last_seq: int | None = None
    epoch: str | None = None


@attrs.frozen
class Unsubscribe:
    session_id: str = attrs.field(validator=_session_id)


@attrs.frozen
class Tasks:
    action: Literal["list", "check", "cancel"]
    session_id: str | None = attrs.field(default=None, validator=_session_id)
    task_id: str | None = None


@attrs.frozen
class Sessions:
    action: Literal["list", "create", "delete", "history"]
    session_id: str | None = attrs.field(default=None, validator=_session_id)
    profile: str | None = None


@attrs.frozen
class Approval:
    """approve / deny: the session owner's answer to an `approval_request`."""

    session_id: str = attrs.field(validator=_session_id)
    call_id: str = attrs.field(validator=_not_blank)
    scope: Literal["once", "session", "always"] = "once"
    decision: Literal["approve", "deny"] = "approve"  # from the frame's type


Command = (
    Hello | SendMessage | Stop | Compact | Subscribe | Unsubscribe | Tasks | Sessions | Approval
)

COMMANDS: dict[str, type[Any]] = {
    "hello": Hello,
    "message": SendMessage,
    "stop": Stop,
    "compact": Compact,
    "subscribe": Subscribe,
    "unsubscribe": Unsubscribe,
    "tasks": Tasks,
    "sessions": Sessions,
    "approve": Approval,
    "deny": Approval,
}


def _strict_str(value: Any, _: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _strict_int(value: Any, _: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a whole number, got {type(value).__name__}")
    return value


converter = cattrs.Converter(forbid_extra_keys=True)
converter.register_structure_hook(str, _strict_str)
converter.register_structure_hook(int, _strict_int)


def _why(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown field(s): {', '.join(sorted(exc.extra_fields))}"
    text = str(exc)
    if " not in literal " in text:
        return "must be one of " + ", ".join(repr(a) for a in getattr(type_, "__args__", ()))
    return text or type(exc).__name__


def _request_id(data: dict[str, Any]) -> RequestId:
    rid = data.get("id")
    if isinstance(rid, str | int) and not isinstance(rid, bool) and len(str(rid)) <= 128:
        return rid
    return None


def parse_frame(message: str | bytes, max_bytes: int) -> tuple[RequestId, Command]:
    """The command in one client frame, or a `ProtocolError` naming what is wrong."""
    if isinstance(message, bytes):
        raise ProtocolError("binary frames are not accepted: send JSON text frames")
    size = len(message.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise FrameTooLargeError(f"the frame has {size} bytes; the limit is {max_bytes}")
    try:
        data = json.loads(message)
    except ValueError as exc:
        raise ProtocolError(f"the frame is not JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("the frame is nested too deeply to read") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"a frame must be a JSON object, not {type(data).__name__}")
    rid = _request_id(data)
    if "id" in data and rid is None:
        raise ProtocolError("id must be a string or a whole number (at most 128 characters)")
    kind = data.get("type")
    body = {k: v for k, v in data.items() if k not in ("type", "id")}
    if not isinstance(kind, str):
        raise ProtocolError('a frame needs a "type" string', request_id=rid)
    cls = COMMANDS.get(kind)
    if cls is None:
        known = ", ".join(COMMANDS)
        raise UnknownTypeError(f"unknown frame type {kind!r} (known: {known})", request_id=rid)
    if cls is Approval:
        if "decision" in body:
            raise ProtocolError(
                f"bad {kind!r} frame: unknown field(s): decision", request_id=rid
            )
        body["decision"] = kind
    try:
        command = converter.structure(body, cls)
    except Exception as exc:  # cattrs raises exception groups of field errors
        if isinstance(exc, cattrs.BaseValidationError):
            problems = "; ".join(cattrs.transform_error(exc, path=kind, format_exception=_why))
        else:
            problems = str(exc)
        raise ProtocolError(f"bad {kind!r} frame: {problems}", request_id=rid) from None
    return rid, command


# -- frames (server -> client) --------------------------------------------------------


class EventFrame(dict[str, Any]):
    """A session frame that keeps its JSON text once encoded.

    The session actor sends the same frame object to every subscriber (and keeps it
    for replay); each connection's writer `encode`s it, and only the first pays for
    ``json.dumps``. Frames are never changed once published: a merged delta is a new
    (plain) dict, encoded on its own. A text longer than `KEEP_MAX_CHARS` is not kept:
    the replay buffer may hold the frame for long, and a big tool output twice (dict
    and text) is not worth a second ``json.dumps`` saved.
    """

    __slots__ = ("_text",)

    def text(self) -> str:
        try:
            return self._text
        except AttributeError:
            text = _dumps(self)
            if len(text) <= KEEP_MAX_CHARS:
                self._text: str = text
            return text


def event_frame(
    event: AgentEvent, session_id: str, seq: int | None, epoch: str | None = None
) -> Frame:
    """An AgentEvent as a session frame: type, session_id, seq (and epoch), then fields."""
    frame = EventFrame(type=type(event).type, session_id=session_id, seq=seq)
    if epoch is not None:
        frame["epoch"] = epoch
    body = event_to_dict(event)
    del body["type"]
    frame.update(body)
    return frame


def error_frame(
    code: str,
    message: str,
    *,
    request_id: RequestId = None,
    session_id: str | None = None,
) -> Frame:
    frame: Frame = {"type": "error", "code": code, "message": message}
    if request_id is not None:
        frame["id"] = request_id
    if session_id is not None:
        frame["session_id"] = session_id
    return frame


def error_frame_for(exc: RequestError) -> Frame:
    return error_frame(exc.code, str(exc), request_id=exc.request_id, session_id=exc.session_id)


def welcome_frame(name: str, role: str, llm_backend: str | None = None) -> Frame:
    frame: Frame = {
        "type": "welcome",
        "protocol": PROTOCOL_VERSION,
        "server": f"navi_trio {__version__}",
        "user": {"name": name, "role": role},
    }
    if llm_backend is not None:
        frame["llm_backend"] = llm_backend  # `navi chat --local` tells a mismatch
    return frame


def reply(request_id: RequestId, type_: str, **fields: Any) -> Frame:
    """A reply to a request: its type, the echoed id, and `fields`."""
    frame: Frame = {"type": type_, **fields}
    if request_id is not None:
        frame["id"] = request_id
    return frame


def encode(frame: Frame) -> str:
    """The frame's JSON text (an `EventFrame` is encoded once, whoever asks)."""
    if isinstance(frame, EventFrame):
        return frame.text()
    return _dumps(frame)


def _dumps(frame: Frame) -> str:
    text = json.dumps(frame, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON escapes carry it, UTF-8 cannot
        text = json.dumps(frame, separators=(",", ":"))
    return text
