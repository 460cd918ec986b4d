"""Wire protocol v1: the one place a client frame becomes a command and an event a frame.

Client frames are JSON objects with a ``type``; each type is an `attrs.frozen` command
class (`COMMANDS` says which), structured by strict.py's converter (a string field
refuses a number, an unknown key is refused, a `Literal` names its choices). Anything
wrong raises a `ProtocolError` naming the field and the problem in JSON's terms, quoting
at most ~64 characters of what the client sent, its ``request_id`` the frame's ``id``
when it could be read. A lone surrogate in any field is refused: stored, it would break
every later request of the session.

Server frames are plain dicts, all built here (the core gets `event_frame` and
`resync_frame` handed in, since it may not import this module). `for_user` is what a
user gets of a frame: every address in an error or warning hidden from all but admins,
and the credentials an address carries from everyone. The frames are described in
docs/pages/protocol.md.
"""

from __future__ import annotations

import json
import re
import typing
from typing import Any, Literal

import attrs
import cattrs

from navi_trio import __version__, wire

# The command classes are re-exported: every importer takes them from here.
from navi_trio.api.command_frames import Approval as Approval
from navi_trio.api.command_frames import Changes as Changes
from navi_trio.api.command_frames import Checkpoints as Checkpoints
from navi_trio.api.command_frames import ClientToolResult as ClientToolResult
from navi_trio.api.command_frames import ClientTools as ClientTools
from navi_trio.api.command_frames import Command as Command
from navi_trio.api.command_frames import CommandList as CommandList
from navi_trio.api.command_frames import Compact as Compact
from navi_trio.api.command_frames import Context as Context
from navi_trio.api.command_frames import Folders as Folders
from navi_trio.api.command_frames import Fork as Fork
from navi_trio.api.command_frames import Grants as Grants
from navi_trio.api.command_frames import Hello as Hello
from navi_trio.api.command_frames import Rewind as Rewind
from navi_trio.api.command_frames import Schedule as Schedule
from navi_trio.api.command_frames import SendMessage as SendMessage
from navi_trio.api.command_frames import Sessions as Sessions
from navi_trio.api.command_frames import SigninCode as SigninCode
from navi_trio.api.command_frames import Stop as Stop
from navi_trio.api.command_frames import Subscribe as Subscribe
from navi_trio.api.command_frames import Tasks as Tasks
from navi_trio.api.command_frames import Unsubscribe as Unsubscribe
from navi_trio.api.command_frames import Usage as Usage
from navi_trio.api.frame_fields import shown
from navi_trio.caches import remember
from navi_trio.errors import FrameTooLargeError, ProtocolError, RequestError, UnknownTypeError
from navi_trio.events import (
    AgentEvent,
    ErrorEvent,
    TaskUpdate,
    TextDelta,
    ThinkingDelta,
    ToolResultEvent,
    WarningEvent,
    event_to_dict,
)
from navi_trio.jsonenc import dumps_with
from navi_trio.notices import Notice
from navi_trio.profiles import BudgetConfig, parse_budgets
from navi_trio.strict import (
    NUMBER_MAX_DIGITS,
    LongNumber,
    WrongTypeError,
    json_kind,
    parse_int,
    strict_converter,
)
from navi_trio.text import clean_json, clean_text, clip, has_lone_surrogate
from navi_trio.wire import PROTOCOL_VERSION as PROTOCOL_VERSION
from navi_trio.wire import Frame as Frame

RequestId = str | int | None
KEEP_MAX_CHARS = 64_000  # an `EventFrame` keeps its JSON text up to this length
ID_SCAN_CHARS = 4096  # of a frame too large to parse: where its id is looked for
ERROR_MAX_CHARS = 1000  # an error frame's message is cut there, whoever wrote it

COMMANDS: dict[str, type[Any]] = {
    wire.HELLO: Hello,
    wire.MESSAGE: SendMessage,
    wire.STOP: Stop,
    wire.COMPACT: Compact,
    wire.SUBSCRIBE: Subscribe,
    wire.UNSUBSCRIBE: Unsubscribe,
    wire.TASKS: Tasks,
    wire.SESSIONS: Sessions,
    wire.APPROVE: Approval,
    wire.DENY: Approval,
    wire.CHECKPOINTS: Checkpoints,
    wire.REWIND: Rewind,
    wire.FORK: Fork,
    wire.SCHEDULE: Schedule,
    wire.CLIENT_TOOLS: ClientTools,
    wire.CLIENT_TOOL_RESULT: ClientToolResult,
    wire.FOLDERS: Folders,
    wire.CHANGES: Changes,
    wire.USAGE: Usage,
    wire.CONTEXT: Context,
    wire.SIGNIN_CODE: SigninCode,
    wire.COMMANDS: CommandList,
    wire.GRANTS: Grants,
}


def _wire_problem(exc: WrongTypeError) -> str:
    """A strict hook's refusal in the client's terms: what follows "field 'x' "."""
    value = exc.value
    if exc.typ is int and isinstance(value, LongNumber):
        return (
            f"must be a whole number of at most {NUMBER_MAX_DIGITS} digits, "
            f"not one of {value.digits}"
        )
    got = shown(value) if exc.typ is int and isinstance(value, float) else json_kind(value)
    return f"must be {exc.wanted}, not {got}"


def _budget(value: Any, _: Any) -> BudgetConfig:
    # Every scope and limit checked and bounded (profiles/_control.py); a ValueError
    # names the field inside ("budget.turn.tokens must be a whole number ...").
    return parse_budgets(value)


converter = strict_converter()
converter.register_structure_hook(BudgetConfig, _budget)


def _choices(type_: Any) -> list[str]:
    """The strings a `Literal` field (or an optional one) takes."""
    if typing.get_origin(type_) is Literal:
        return [str(a) for a in typing.get_args(type_)]
    return [c for arg in typing.get_args(type_) for c in _choices(arg)]


def _field_problem(name: str, exc: BaseException, type_: Any, value: Any) -> str:
    if isinstance(exc, KeyError):
        return f"field {name!r} is required"
    choices = _choices(type_)
    if choices:
        return f"field {name!r} must be one of {', '.join(choices)}, not {shown(value)}"
    if isinstance(exc, WrongTypeError):
        return f"field {name!r} {_wire_problem(exc)}"
    return f"field {name!r}: {clip(str(exc), ERROR_MAX_CHARS // 4)}"


def _problems(exc: BaseException, body: dict[str, Any]) -> list[str]:
    """Each problem cattrs found, in the client's terms (no Python type names)."""
    if not isinstance(exc, cattrs.ClassValidationError):
        return [clip(str(exc), ERROR_MAX_CHARS // 4)]
    noted, other = exc.group_exceptions()
    out = [_field_problem(n.name, e, n.type, body.get(n.name)) for e, n in noted]
    for e in other:
        if isinstance(e, cattrs.ForbiddenExtraKeysError):
            names = sorted(e.extra_fields)
            listed = ", ".join(repr(clip(n)) for n in names[:5])
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            out.append(f"unknown field{'s' if len(names) > 1 else ''} {listed}{more}")
        else:  # a validator of ours: it names its field
            out.append(clip(str(e), ERROR_MAX_CHARS // 4))
    return out


def _request_id(data: dict[str, Any]) -> RequestId:
    rid = data.get("id")
    if isinstance(rid, str) and len(rid) <= 128 and not has_lone_surrogate(rid):
        return rid
    if isinstance(rid, int) and not isinstance(rid, bool):
        return rid
    return None


_SPACE = re.compile(r"[ \t\n\r]*")


def _skip_space(text: str, pos: int) -> int:
    found = _SPACE.match(text, pos)
    return pos if found is None else found.end()


def leading_id(message: str) -> RequestId:
    """The top-level ``id`` of a frame too large to parse whole, when it comes within
    its first `ID_SCAN_CHARS` characters (clients send it before the content); else None.

    Only that prefix is read, key by key at the top level (a nested ``id`` is not the
    frame's): a value that runs past it ends the search. So the work and the memory are
    bounded whatever the frame holds, and the id is checked as any frame's."""
    text = message[:ID_SCAN_CHARS]
    decoder = json.JSONDecoder(parse_int=parse_int)
    pos = _skip_space(text, 0)
    if not text.startswith("{", pos):
        return None
    pos += 1
    while True:
        try:
            key, pos = decoder.raw_decode(text, _skip_space(text, pos))
            pos = _skip_space(text, pos)
            if not isinstance(key, str) or not text.startswith(":", pos):
                return None
            value, pos = decoder.raw_decode(text, _skip_space(text, pos + 1))
        except (ValueError, RecursionError):
            return None  # past the prefix, or not JSON: no id to echo
        if key == "id":
            return _request_id({"id": value})
        pos = _skip_space(text, pos)
        if not text.startswith(",", pos):
            return None
        pos += 1


def _lone_surrogate_field(data: dict[str, Any]) -> str | None:
    """The first field whose name or value holds a lone surrogate, or None."""
    for key, value in data.items():
        if clean_text(key) is not key or clean_json(value) is not value:
            return clean_text(key)
    return None


def parse_frame(message: str | bytes, max_bytes: int) -> tuple[RequestId, Command]:
    """The command in one client frame, or a `ProtocolError` naming what is wrong."""
    if isinstance(message, bytes):
        raise ProtocolError("binary frames are not accepted: send JSON text frames")
    size = len(message.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise FrameTooLargeError(
            f"the frame has {size} bytes; the limit is {max_bytes}",
            request_id=leading_id(message),
        )
    try:
        data = json.loads(message, parse_int=parse_int)
    except ValueError as exc:
        raise ProtocolError(f"the frame is not JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("the frame is nested too deeply to read") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"a frame must be a JSON object, not {json_kind(data)}")
    rid = _request_id(data)
    # A text frame is UTF-8, so a surrogate can only come from a \uD800-\uDFFF escape.
    if "\\ud" in message or "\\uD" in message:
        field = _lone_surrogate_field(data)
        if field is not None:
            kind = data.get("type")
            where = f"bad {kind!r} frame: " if isinstance(kind, str) and kind in COMMANDS else ""
            raise ProtocolError(
                f"{where}field {clip(field)!r} holds a lone surrogate (a \\uD800-\\uDFFF escape "
                "without its pair), which is not text: send valid Unicode",
                request_id=rid,
            )
    if "id" in data and rid is None:
        raise ProtocolError(
            "field 'id' must be a string of at most 128 characters or a whole number "
            f"of at most {NUMBER_MAX_DIGITS} digits, not {shown(data['id'])}"
        )
    kind = data.get("type")
    body = {k: v for k, v in data.items() if k not in ("type", "id")}
    if not isinstance(kind, str):
        got = f", not {json_kind(kind)}" if "type" in data else ""
        raise ProtocolError(f'a frame needs a "type" string{got}', request_id=rid)
    cls = COMMANDS.get(kind)
    if cls is None:
        known = ", ".join(COMMANDS)
        raise UnknownTypeError(f"unknown frame type {shown(kind)} (known: {known})", request_id=rid)
    if cls is Approval:
        if "decision" in body:
            raise ProtocolError(f"bad {kind!r} frame: unknown field 'decision'", request_id=rid)
        body["decision"] = kind
    try:
        command = converter.structure(body, cls)
    except Exception as exc:  # cattrs raises exception groups of field errors
        problems = "; ".join(_problems(exc, body))
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
            text = self._json()
            if len(text) <= KEEP_MAX_CHARS:
                self._text: str = text
            return text

    def _json(self) -> str:
        return _dumps(self)


class _TokenFrame(EventFrame):
    """A text or thinking delta's frame, as `event_frame` makes it (its keys in that
    order, never changed): its JSON is a template of the fields a source's deltas share
    (`_token_parts`), its seq, and its text quoted; the bytes of the general encoder."""

    __slots__ = ()

    def _json(self) -> str:
        text, seq, sub = self["text"], self["seq"], self["is_subagent"]
        # Only what the template is sure for (1 is a key equal to True, but not its JSON).
        if type(text) is not str or type(sub) is not bool or not (seq is None or type(seq) is int):
            return _dumps(self)
        key = (self["type"], self["session_id"], self.get("epoch"), sub, self["agent_id"])
        try:
            head, middle = _TOKEN_PARTS.get(key) or _token_parts(key, self)
        except TypeError:  # a field that is no key: the general path
            return _dumps(self)
        json_text = head + ("null" if seq is None else str(seq)) + middle + _QUOTE(text) + "}"
        return _dumps(self) if has_lone_surrogate(json_text) else json_text


# A token frame's JSON around its seq and its text, by the fields its source's deltas
# share; emptied when full (one entry a session's source, made again at its next delta).
_TOKEN_PARTS: dict[tuple[Any, ...], tuple[str, str]] = {}
TOKEN_PARTS_MAX = 1024


def _token_parts(key: tuple[Any, ...], frame: Frame) -> tuple[str, str]:
    """The JSON of `frame` before its seq, and between its seq and its text's quote."""
    head = _FRAME_JSON({"type": frame["type"], "session_id": frame["session_id"]})
    rest: Frame = {k: frame[k] for k in ("epoch", "is_subagent", "agent_id") if k in frame}
    parts = (head[:-1] + ',"seq":', "," + _FRAME_JSON(rest)[1:-1] + ',"text":')
    return remember(_TOKEN_PARTS, key, parts, TOKEN_PARTS_MAX)


def event_frame(
    event: AgentEvent, session_id: str, seq: int | None, epoch: str | None = None
) -> Frame:
    """An AgentEvent as a session frame: type, session_id, seq (and epoch), then fields."""
    if type(event) is TextDelta or type(event) is ThinkingDelta:  # a token: no cattrs
        token = _TokenFrame(type=type(event).type, session_id=session_id, seq=seq)
        if epoch is not None:
            token["epoch"] = epoch
        token["is_subagent"] = event.is_subagent
        token["agent_id"] = event.agent_id
        token["text"] = event.text
        return token
    frame = EventFrame(type=type(event).type, session_id=session_id, seq=seq)
    if epoch is not None:
        frame["epoch"] = epoch
    body = event_to_dict(event)
    del body["type"]
    frame.update(body)
    return frame


def resync_frame(session_id: str, seq: int, epoch: str) -> Frame:
    """The asked seq is gone (or another daemon life's): reload the history; the live
    frames go on after `seq`."""
    return {"type": wire.RESYNC, "session_id": session_id, "seq": seq, "epoch": epoch}


def lagged_frame(session_id: str, missed_from: int, missed_to: int) -> Frame:
    """The client fell behind and missed the frames `missed_from`..`missed_to`; the
    frames after its last one follow (the connection subscribed again from there)."""
    return {
        "type": wire.LAGGED,
        "session_id": session_id,
        "missed_from": missed_from,
        "missed_to": missed_to,
    }


def notice_frame(notice: Notice) -> Frame:
    """A user's notice (a scheduled run ended), out of band: no session seq."""
    return {"type": wire.SCHEDULE_RUN, **attrs.asdict(notice)}


def error_frame(
    code: str,
    message: str,
    *,
    request_id: RequestId = None,
    session_id: str | None = None,
) -> Frame:
    """An error frame. The message is cut at `ERROR_MAX_CHARS` and the session id at
    the longest valid one, whatever the caller quoted in them: an error never echoes
    a client's value whole."""
    frame: Frame = {"type": wire.ERROR, "code": code, "message": clip(message, ERROR_MAX_CHARS)}
    if request_id is not None:
        frame["id"] = request_id
    if session_id is not None:
        frame["session_id"] = clip(session_id, 128)
    return frame


def error_frame_for(exc: RequestError) -> Frame:
    frame = error_frame(exc.code, str(exc), request_id=exc.request_id, session_id=exc.session_id)
    run_id = getattr(exc, "run_id", None)
    if run_id is not None:
        frame["run_id"] = run_id  # session_busy of a rejected message: the running run
    return frame


def welcome_frame(
    name: str,
    role: str,
    llm_backend: str | None = None,
    *,
    profiles: list[str] | None = None,
    default_profile: str | None = None,
    default_modes: dict[str, str] | None = None,
    token: str | None = None,
) -> Frame:
    frame: Frame = {
        "type": wire.WELCOME,
        "protocol": PROTOCOL_VERSION,
        "server": f"navi_trio {__version__}",
        "user": {"name": name, "role": role},
    }
    if profiles is not None:  # what a new session or a switch may name
        frame["profiles"] = profiles
        frame["default_profile"] = default_profile
    if default_modes is not None:  # by profile: the mode a run gets when none is asked
        frame["default_modes"] = default_modes
    if token is not None:  # a hello with a sign-in code: the token it stood for
        frame["token"] = token
    if llm_backend is not None:
        frame["llm_backend"] = llm_backend  # `navi chat --local` tells a mismatch
    return frame


# An address in a text: a URL (a scheme and what follows up to a space or a quote, without
# the sentence's punctuation after it), an IP address (with its port), or a name with a
# port (``all attempts to connect to gpu-box:11434 failed``, in the HTTP library's words);
# and the credentials a URL may carry (``user:pass@``).
_ADDRESS = re.compile(
    r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,:;)\]]"
    r"|\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?"
    r"|\b[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?::[0-9]{1,5})?\b"
    r"|\b[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*:[0-9]{1,5}\b"
)
_CREDENTIALS = re.compile(r"(?<=://)[^/\s'\"<>@]+@")
ADDRESS_HIDDEN = "[address hidden]"
_NAMING_ENDPOINTS = frozenset({ErrorEvent.type, WarningEvent.type, wire.ERROR})
# Frame types `for_user` returns as they are, whoever the user (a token's: asked first).
SHOWN_AS_IS = frozenset({TextDelta.type, ThinkingDelta.type})
_TASKS = "tasks"


def hide_addresses(text: str, *, admin: bool = False) -> str:
    """`text` with every address (``http://host:port/…``, ``10.0.0.5:11434``) replaced by
    `ADDRESS_HIDDEN`; for an admin, only the credentials in a URL (``http://***@host…``)."""
    if admin:
        return _CREDENTIALS.sub("***@", text) if "@" in text else text
    return _ADDRESS.sub(ADDRESS_HIDDEN, text)


def for_user(frame: Frame, *, admin: bool) -> Frame:
    """`frame` as a user gets it: in the message of an error or warning, and in what a
    failed tool call or background job says (a sub-agent's failed LLM call is told
    there), every address is hidden from a user who is not an admin (the LLM endpoint's
    is the admins' to know), and the credentials an address carries from everyone. Any
    other frame, or one with nothing to hide, is `frame` itself."""
    kind = frame.get("type")
    if kind in _NAMING_ENDPOINTS:
        return _hidden_in(frame, ("message",), admin)
    if kind == ToolResultEvent.type and frame.get("ok") is False:
        return _hidden_in(frame, ("error", "output"), admin)
    if kind == TaskUpdate.type:
        return _hidden_in(frame, ("error", "result_excerpt"), admin)
    task = frame.get("task")
    if kind == _TASKS and isinstance(task, dict) and "error" in task:  # `tasks check`
        shown = _hidden_in(task, ("error", "result"), admin)
        return frame if shown is task else {**frame, "task": shown}
    return frame


def _hidden_in(frame: dict[str, Any], fields: tuple[str, ...], admin: bool) -> dict[str, Any]:
    """`frame` with the addresses in its text `fields` hidden (`hide_addresses`)."""
    changed = {}
    for field in fields:
        text = frame.get(field)
        if isinstance(text, str) and (hidden := hide_addresses(text, admin=admin)) != text:
            changed[field] = hidden
    return {**frame, **changed} if changed else frame


def history_for_user(messages: list[dict[str, Any]], *, admin: bool) -> list[dict[str, Any]]:
    """Display messages as `for_user` shows frames: the error a turn ended with (kept on
    its last message) and a failed tool call's result, with their addresses hidden."""
    fields = ("error",)
    return [
        _hidden_in(m, ("error", "content") if m.get("ok") is False else fields, admin)
        for m in messages
    ]


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


# A frame's JSON text: ``json.dumps(frame, ensure_ascii=False, separators=(",", ":"))``
# with its encoder made once (a token's frame is small: making one was most of its time).
_FRAME_JSON = dumps_with(ensure_ascii=False, separators=(",", ":"))
_QUOTE = json.encoder.encode_basestring  # a string's JSON, as the encoder above quotes it


def _dumps(frame: Frame) -> str:
    text = _FRAME_JSON(frame)
    if has_lone_surrogate(text):
        # UTF-8 cannot carry it, and a JSON escape would hand it to the client, whose
        # terminal or store fails the same way: it goes out as U+FFFD.
        text = _FRAME_JSON(clean_json(frame))
    return text
