"""A chat request's JSON body, with each message's JSON kept between requests.

A tool loop sends the whole history on every call, and the history only grows: a turn's
context builder hands the same message dicts to every call (core/turn/context.py,
`ContextViews`). Converting every message to the dialect's shape and encoding it again
each round was most of a long loop's per-round cost; here each message is converted and
encoded once, and the body is joined from the kept pieces.

The tool schemas sent with every call are kept the same way (the turn hands the same
schema dicts to every call while the tools offered stay the same: ToolExecutor.schemas),
and so is the model's part of the body: a few dozen tools are kilobytes of JSON a round.

Keyed by identity, with the message (or schema) kept alive next to its JSON (so its id
cannot be reused while cached). The contract that makes this right: a message or schema
dict is never mutated once it was sent (the agent replaces messages, it never edits
them). The bytes are exactly `json_body` of the dict body the dialect builds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from navi_trio.caches import remember
from navi_trio.llm.http import json_text as _text

Convert = Callable[[dict[str, Any]], dict[str, Any]]
# Enough for a few hundred sessions' histories; past either bound (entries, characters
# of JSON kept), the oldest entries go first.
MAX_ENTRIES = 50_000
MAX_CHARS = 64 << 20
MAX_MODELS = 64  # model names whose body opening is kept


class BodyCache:
    """The JSON of recently sent messages and tool schemas (one cache per backend, never
    global)."""

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
        # Tool schemas as they are (no dialect's conversion): a table of their own, so
        # that a dict is never taken for the other kind.
        self._tools: dict[int, tuple[dict[str, Any], str]] = {}
        self._models: dict[str, str] = {}  # model name -> the body's opening

    def __len__(self) -> int:
        return len(self._json) + len(self._tools)

    @property
    def chars(self) -> int:
        """Characters of JSON kept (the bound on the memory the cache holds)."""
        return self._chars

    def message(self, msg: dict[str, Any]) -> str:
        """The JSON of `msg` in the dialect's shape (converted and encoded once)."""
        entry = self._json.get(id(msg))
        if entry is not None and entry[0] is msg:
            return entry[1]
        return self._keep(self._json, msg, _text(self._convert(msg)))

    def tool(self, schema: Any) -> str:
        """The JSON of one tool schema (encoded once while the same dict is offered)."""
        entry = self._tools.get(id(schema))
        if entry is not None and entry[0] is schema:
            return entry[1]
        return self._keep(self._tools, schema, _text(schema))

    def _keep(self, table: dict[int, tuple[Any, str]], obj: Any, text: str) -> str:
        """Keep `text` as `obj`'s JSON in `table`, the oldest entries of both tables
        going first past either bound; `text` itself."""
        if len(text) > self._max_chars:
            return text  # too big to keep
        while len(self) >= self._max or self._chars + len(text) > self._max_chars:
            oldest = self._json if self._json else self._tools  # messages, most of them, first
            self._chars -= len(oldest.pop(next(iter(oldest)))[1])
        table[id(obj)] = (obj, text)
        self._chars += len(text)
        return text

    def body(self, body: dict[str, Any], messages: Sequence[dict[str, Any]]) -> bytes:
        """`json_body` of `body` with ``"messages"`` (its second key, after ``"model"``)
        set to `messages` in the dialect's shape."""
        keys = list(body)
        if keys[:2] != ["model", "messages"]:
            raise ValueError(f"a chat body starts with model and messages, got {keys[:2]}")
        model = body["model"]
        head = self._models.get(model) if isinstance(model, str) else None
        if head is None:
            head = _text({"model": model})[:-1]
            if isinstance(model, str):
                remember(self._models, model, head, MAX_MODELS)
        # The rest as json.dumps writes a dict (", " between items): a list of tools
        # joined from their kept JSON, what is before and after it encoded as it comes.
        rest = keys[2:]
        at = rest.index("tools") if "tools" in rest else len(rest)
        members = [_members({k: body[k] for k in rest[:at]})]
        if at < len(rest):
            tools = body["tools"]
            if isinstance(tools, list):
                members.append('"tools": [' + ", ".join([self.tool(t) for t in tools]) + "]")
            else:
                members.append(_members({"tools": tools}))
            members.append(_members({k: body[k] for k in rest[at + 1 :]}))
        tail = "".join(", " + m for m in members if m) + "}"
        parts = ", ".join([self.message(m) for m in messages])
        return f'{head}, "messages": [{parts}]{tail}'.encode()


def _members(value: dict[Any, Any]) -> str:
    """The JSON of `value`'s members, without the braces ("" for none)."""
    return _text(value)[1:-1] if value else ""
