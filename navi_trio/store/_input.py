"""A store's input, checked and serialised on the caller's side, before any SQL.

Nothing here knows SQLite: the session id and text checks, session meta, JSON values
(`_dump`: never NaN, lone surrogates kept) and the history rows a message becomes
(`_prepare`). A store checks and serialises on the caller's side so that its worker
gets a snapshot the caller cannot change, and a bad argument fails before a job is
queued, with a `StoreError` naming it. A second store (PostgreSQL) uses the same.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from navi_trio.errors import NotQueuedError, StoreError
from navi_trio.jsonenc import dumps_with

_SESSION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@+=-]{0,127}")
_ID_SHOWN_MAX = 60  # an error message quotes at most this much of a bad session id


def check_session_id(session_id: object) -> str:
    """`session_id` if it is a valid id; StoreError naming it (cut when long) if not."""
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        if isinstance(session_id, str) and not session_id:
            raise StoreError("the session id is empty")
        shown = repr(session_id)
        if len(shown) > _ID_SHOWN_MAX:
            size = f"{len(session_id)} characters" if isinstance(session_id, str) else "long"
            shown = f"{shown[: _ID_SHOWN_MAX - 1]}… ({size})"
        raise StoreError(
            f"invalid session id {shown}: use 1-128 letters, digits or . _ @ + = -"
            " (not starting with . @ + = -)"
        )
    return session_id


def _check_text(value: object, name: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value):
        raise StoreError(f"{name} must be a non-empty string, got {value!r}")
    return value


def token_digest(token: object) -> str:
    """A user token as it is stored: its SHA-256 (tokens are random secrets: no salt)."""
    token = _check_text(token, "user token")
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _check_meta(meta: object) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise StoreError(f"session meta must be a dict, not {type(meta).__name__}")
    return meta


class _Row(NamedTuple):
    """A message ready for a history table: columns for queries, `data` for the dict."""

    role: str | None
    content: str | None
    is_plan: bool
    data: str


# ensure_ascii keeps lone surrogates (valid in JSON, invalid in UTF-8) round-tripping.
# allow_nan=False: NaN / Infinity are not JSON; stored, they would come back to be
# sent to the LLM, which refuses them (a poisoned session).
_ROW_JSON = dumps_with(ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def _dump(value: Any, what: str) -> str:
    try:
        return _ROW_JSON(value)
    except ValueError as exc:
        if "Out of range float" in str(exc):
            raise StoreError(
                f"{what} holds a number that is not finite (NaN or Infinity), "
                "which JSON cannot carry"
            ) from None
        raise StoreError(f"{what} is not JSON-serialisable: {exc}") from None
    except TypeError as exc:
        raise StoreError(f"{what} is not JSON-serialisable: {exc}") from None


def _prepare(
    items: Sequence[dict[str, Any]], what: str, done: dict[int, _Row] | None = None
) -> list[_Row]:
    """Serialise on the caller's side: the thread gets a snapshot the caller cannot mutate.

    `done` maps id(message) to its row for messages of the same call already serialised
    (a message that goes to both the display history and the context is one dict)."""
    if isinstance(items, dict | str | bytes):
        raise StoreError(f"{what} must be a sequence of message dicts, not {type(items).__name__}")
    rows: list[_Row] = []
    for i, msg in enumerate(items):
        if done is not None and id(msg) in done:
            rows.append(done[id(msg)])
            continue
        if not isinstance(msg, dict):
            raise StoreError(f"{what}[{i}] must be a dict, not {type(msg).__name__}")
        role = msg.get("role")
        content = msg.get("content")
        if not isinstance(content, str):
            content = None if content is None else _dump(content, f"{what}[{i}].content")
        rows.append(
            _Row(
                role=_column_text(role) if isinstance(role, str) else None,
                content=_column_text(content) if content is not None else None,
                is_plan=bool(msg.get("is_plan")),
                data=_dump(msg, f"{what}[{i}]"),
            )
        )
    return rows


def _column_text(text: str) -> str:
    """Columns are for queries; `data` keeps the exact text, lone surrogates included."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


class _Rewrite(NamedTuple):
    """`rewrite_history`'s input, checked and serialised (both stores use it)."""

    keep: int
    messages: list[_Row]
    context: list[_Row]
    kv_set: list[tuple[str, str, str]]
    kv_delete: list[tuple[str, str]]


def _prepare_rewrite(
    keep: object,
    messages: Sequence[dict[str, Any]],
    context: Sequence[dict[str, Any]],
    kv_set: Sequence[tuple[str, str, Any]],
    kv_delete: Sequence[tuple[str, str]],
) -> _Rewrite:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise StoreError(f"keep must be a whole number of messages, 0 or more, not {keep!r}")
    msg_rows = _prepare(messages, "messages")
    done = {id(m): row for m, row in zip(messages, msg_rows, strict=True)}
    sets = []
    for scope, key, value in kv_set:
        _check_text(scope, "kv scope")
        _check_text(key, "kv key", allow_empty=True)
        sets.append((scope, key, _dump(value, f"kv value for {scope}/{key}")))
    deletes = []
    for scope, key in kv_delete:
        deletes.append(
            (_check_text(scope, "kv scope"), _check_text(key, "kv key", allow_empty=True))
        )
    return _Rewrite(keep, msg_rows, _prepare(context, "context", done), sets, deletes)


def check_page(limit: int, max_bytes: int) -> None:
    """`load_messages_page`'s bounds: each a whole number of 1 or more."""
    for name, value in (("limit", limit), ("max_bytes", max_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise StoreError(
                f"a history page's {name} must be a whole number of 1 or more, not {value!r}"
            )


def page_end(
    sizes: Iterable[tuple[float, int]], limit: int, max_bytes: int
) -> tuple[float, bool] | None:
    """Where a history page ends, from its candidates' (position, stored size) in order:
    the position of its last message and whether more follow (None: no candidates). A
    page takes messages while they number at most `limit` and add up to at most
    `max_bytes`, and always the first, however big. `sizes` is read only one past the
    page's end, so a lazy cursor reads no further."""
    last, total, count = 0.0, 0, 0
    for position, size in sizes:
        if count and (count == limit or total + size > max_bytes):
            return last, True
        last, total, count = float(position), total + size, count + 1
    return (last, False) if count else None


def check_keep(keep: int | None) -> int | None:
    """A queue cap: None (no cap) or at least 1 (the row just queued always stays)."""
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise StoreError(f"a queue's cap must be a whole number of at least 1, not {keep!r}")
    return keep


def not_queued(sid: str, key: str) -> NotQueuedError:
    """The refusal of an append whose queued message is no longer in the queue."""
    return NotQueuedError(
        f"session {sid!r}: queued message {key!r} is no longer in the queue (another "
        "daemon took it first, or the queue's cap dropped it): nothing was stored"
    )
