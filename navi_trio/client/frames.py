"""The client's half of the wire protocol (protocol v1): frames built and read as dicts.

Only what `navi chat` sends and needs to recognise lives here; the server's encoder is
in `api/`. Keeping the client on plain JSON keeps it independent of `core/`.
"""

from __future__ import annotations

import json
from typing import Any

PROTOCOL = 1
Frame = dict[str, Any]

# Out-of-band or reply frames: never part of a session's seq stream.
REPLY_TYPES = frozenset(
    {"welcome", "ok", "session", "sessions", "tasks", "resync", "lagged", "task_update"}
)


class BadFrame(ValueError):
    """A server frame that is not a JSON object with a string "type"."""


def decode(text: str | bytes) -> Frame:
    """The frame in `text`, or `BadFrame` naming what is wrong with it."""
    if isinstance(text, bytes):
        raise BadFrame("the server sent a binary frame (expected JSON text)")
    try:
        frame = json.loads(text)
    except ValueError as exc:
        raise BadFrame(f"the server sent a frame that is not JSON: {exc}") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise BadFrame(f"the server sent a frame without a type: {text[:80]!r}")
    return frame


def encode(frame: Frame) -> str:
    return json.dumps(frame, ensure_ascii=False)


def hello(token: str) -> Frame:
    return {"type": "hello", "token": token}


def message(
    content: str,
    session_id: str | None,
    profile: str | None = None,
    cwd: str | None = None,
    mode: str | None = None,
) -> Frame:
    frame: Frame = {"type": "message", "content": content}
    if session_id:
        frame["session_id"] = session_id
    if profile:
        frame["profile"] = profile
    if cwd:
        frame["cwd"] = cwd
    if mode:
        frame["mode"] = mode
    return frame


def approval(approve: bool, session_id: str, call_id: str, scope: str = "once") -> Frame:
    """The owner's answer to an `approval_request`: approve or deny, once/session/always."""
    kind = "approve" if approve else "deny"
    return {"type": kind, "session_id": session_id, "call_id": call_id, "scope": scope}


def stop(session_id: str) -> Frame:
    return {"type": "stop", "session_id": session_id}


def compact(session_id: str) -> Frame:
    return {"type": "compact", "session_id": session_id}


def subscribe(session_id: str, last_seq: int | None, epoch: str | None = None) -> Frame:
    frame: Frame = {"type": "subscribe", "session_id": session_id, "last_seq": last_seq}
    if epoch is not None:
        frame["epoch"] = epoch
    return frame


def unsubscribe(session_id: str) -> Frame:
    return {"type": "unsubscribe", "session_id": session_id}


def tasks_list(session_id: str | None) -> Frame:
    frame: Frame = {"type": "tasks", "action": "list"}
    if session_id:
        frame["session_id"] = session_id
    return frame


def sessions_list() -> Frame:
    return {"type": "sessions", "action": "list"}


def history(session_id: str) -> Frame:
    return {"type": "sessions", "action": "history", "session_id": session_id}


def is_session_frame(frame: Frame) -> bool:
    """A frame of a session's stream (it carries an int seq)."""
    return frame.get("type") not in REPLY_TYPES and isinstance(frame.get("seq"), int)
