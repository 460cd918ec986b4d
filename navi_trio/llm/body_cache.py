"""A chat request's JSON body, with each message's JSON kept between requests.

A tool loop sends the whole history on every call, and the history only grows: a turn's
context builder hands the same message dicts to every call (core/turn/context.py,
`ContextViews`). Converting every message to the dialect's shape and encoding it again
each round was most of a long loop's per-round cost; here each message is converted and
encoded once, and the body is joined from the kept pieces.

Keyed by message identity, with the message kept alive next to its JSON (so its id
cannot be reused while cached). The contract that makes this right: a message dict is
never mutated once it was sent (the agent replaces messages, it never edits them).
The bytes are exactly `json_body` of the dict body the dialect builds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from navi_trio.llm.http import json_text as _text

Convert = Callable[[dict[str, Any]], dict[str, Any]]
# Enough for a few hundred sessions' histories; past either bound (entries, characters
# of JSON kept), the oldest entries go first.
MAX_ENTRIES = 50_000
MAX_CHARS = 64 << 20


class BodyCache:
    """The JSON of recently sent messages (one cache per backend, never global)."""

    def __init__(
        self, convert: Convert, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS
    ) -> None:
        if max_entries < 1 or max_chars < 1:
            raise ValueError(
                f"max_entries and max_chars must be at least 1, got {max_entries}, {max_chars}"
            )
        self._convert = convert
        self._max = max_entries
        self._max_chars = max_chars
        self._chars = 0
        self._json: dict[int, tuple[dict[str, Any], str]] = {}

    def __len__(self) -> int:
        return len(self._json)

    @property
    def chars(self) -> int:
        """Characters of JSON kept (the bound on the memory the cache holds)."""
        return self._chars

    def message(self, msg: dict[str, Any]) -> str:
        """The JSON of `msg` in the dialect's shape (converted and encoded once)."""
        entry = self._json.get(id(msg))
        if entry is not None and entry[0] is msg:
            return entry[1]
        text = _text(self._convert(msg))
        if len(text) > self._max_chars:
            return text  # too big to keep
        while self._json and (
            len(self._json) >= self._max or self._chars + len(text) > self._max_chars
        ):
            oldest = next(iter(self._json))
            self._chars -= len(self._json.pop(oldest)[1])
        self._json[id(msg)] = (msg, text)
        self._chars += len(text)
        return text

    def body(self, body: dict[str, Any], messages: Sequence[dict[str, Any]]) -> bytes:
        """`json_body` of `body` with ``"messages"`` (its second key, after ``"model"``)
        set to `messages` in the dialect's shape."""
        keys = list(body)
        if keys[:2] != ["model", "messages"]:
            raise ValueError(f"a chat body starts with model and messages, got {keys[:2]}")
        head = _text({"model": body["model"]})[:-1]
        rest = {k: body[k] for k in keys[2:]}
        tail = ", " + _text(rest)[1:] if rest else "}"
        parts = ", ".join([self.message(m) for m in messages])
        return f'{head}, "messages": [{parts}]{tail}'.encode()
