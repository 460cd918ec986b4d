"""The checks on a client frame's fields: their limits and the `attrs` validators.

Each validator raises a `ValueError` naming its field and the problem in the client's
terms; `shown` quotes a client's value the way every error message does (at most ~64
characters, with the full length said).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from navi_trio.strict import LongNumber
from navi_trio.text import CLIP_CHARS, clip

NAME_MAX_CHARS = 128  # profile, task_id, epoch: names of ours
CALL_ID_MAX_CHARS = 256  # the model's server chooses tool-call ids
PATH_MAX_CHARS = 4096
SPEC_MAX_CHARS = 128  # a schedule's cron, every or at
SCHEDULE_MESSAGE_MAX = 16_000  # a schedule's message (core/triggers/schedules.py MESSAGE_MAX_CHARS)
HISTORY_LIMIT_MAX = 1000  # messages in one history reply (also the default)
TITLE_MAX_CHARS = 200  # a title a client gives (stored cut to the title length)
Validator = Callable[[Any, "attrs.Attribute[Any]", "str | None"], None]


def _long_number(value: Any) -> str:
    """A LongNumber inside a list or an object, as the error message quotes it (a fuzzed
    frame found that `json.dumps` refused it: an internal error instead of bad_frame)."""
    if isinstance(value, LongNumber):
        return f"<a number of {value.digits} digits>"
    raise TypeError(f"not JSON: {type(value).__name__}")


def shown(value: Any) -> str:
    """A client's value as an error message quotes it: a string as 'text', anything else
    as JSON, cut at ~64 characters (with the full length said)."""
    if isinstance(value, LongNumber):
        return f"a number of {value.digits} digits"
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, ensure_ascii=False, default=_long_number)
    )
    quoted = repr(clip(text)) if isinstance(value, str) else clip(text)
    if len(text) > CLIP_CHARS:
        quoted += f" ({len(text)} characters)"
    return quoted


def matching(pattern: str, what: str, *, quote: bool = True) -> Validator:
    """A validator: a value, when given, matches `pattern` whole, else "must be `what`"
    (with the value `quote`d)."""
    regex = re.compile(pattern)

    def check(_inst: Any, attr: attrs.Attribute[Any], value: str | None) -> None:
        if value is not None and not regex.fullmatch(value):
            got = f", not {shown(value)}" if quote else ""
            raise ValueError(f"field {attr.name!r} must be {what}{got}")

    return check


session_id = matching(
    r"[A-Za-z0-9_][A-Za-z0-9._@+=-]{0,127}",
    "1-128 letters, digits or . _ @ + = - (not starting with . @ + = -)",
)


MESSAGE_KEY_MAX_CHARS = 64  # a message's client key (api/message_command.py)
message_key = matching(
    rf"[\x21-\x7e]{{1,{MESSAGE_KEY_MAX_CHARS}}}",
    f"1-{MESSAGE_KEY_MAX_CHARS} printable ASCII characters, no spaces",
)


def not_blank(_inst: Any, attr: attrs.Attribute[Any], value: str) -> None:
    if not value.strip():
        raise ValueError(f"field {attr.name!r} must not be empty")


def at_most(limit: int) -> Validator:
    def check(_inst: Any, attr: attrs.Attribute[Any], value: str | None) -> None:
        if value is not None and len(value) > limit:
            raise ValueError(
                f"field {attr.name!r} must be at most {limit} characters, not {len(value)}"
            )

    return check


def absolute(_inst: Any, attr: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not Path(value).is_absolute():
        raise ValueError(f"field {attr.name!r} must be an absolute path, not {shown(value)}")


name = at_most(NAME_MAX_CHARS)


# A message or branch id of ours.
point = matching(r"[A-Za-z0-9_-]{1,64}", "a message or branch id (1-64 letters, digits, _ or -)")
token = matching(r"[0-9a-f]{0,64}\.[0-9a-f]{0,64}", "the token of a rewind's preview", quote=False)
grant = matching(r"g-[0-9a-f]{12}", "a grant's id (g- and 12 hex digits)", quote=False)


# A history cursor is the position of a page's last message: opaque to clients, who send
# back the `next_cursor` of a reply as it came.
cursor = matching(
    r"-?[0-9]{1,20}(?:\.[0-9]{1,20})?(?:e[+-]?[0-9]{1,3})?", "the next_cursor of a history reply"
)


def history_cursor(position: float) -> str:
    return repr(float(position))


def cursor_position(cursor: str) -> float:
    return float(cursor)


def history_limit(_inst: Any, attr: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and not 1 <= value <= HISTORY_LIMIT_MAX:
        raise ValueError(f"field {attr.name!r} must be 1 to {HISTORY_LIMIT_MAX}, not {value}")


def only_for(action: str) -> Callable[[Any, attrs.Attribute[Any], object], None]:
    """A validator: a field given only with the frame's `action`."""

    def check(inst: Any, attr: attrs.Attribute[Any], value: object) -> None:
        if value is not None and inst.action != action:
            raise ValueError(f"field {attr.name!r} is for action {action!r} only")

    return check


history_only = only_for("history")
create_only = only_for("create")
rename_only = only_for("rename")
