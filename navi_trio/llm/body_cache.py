"""A chat request's JSON body, with each message's JSON kept between requests.

A tool loop sends the whole history on every call, and the history only grows: a turn's
context builder hands the same message dicts to every call (core/turn/context.py,
`ContextViews`). Converting every message to the dialect's shape and encoding it again
each round was most of a long loop's per-round cost; here each message is converted and
encoded once, and the body is joined from the kept pieces.

The messages' part of the body is kept too, per conversation: a round's history is the
last round's with a few messages added, so the body joins the new messages onto the
last round's joined text instead of looking every message up again (a long history
cost a lookup per message per round). Trailing ``system`` messages (a round's notes,
which change from round to round) are left out of what is kept.

The tool schemas sent with every call are kept the same way (the turn hands the same
schema dicts to every call while the tools offered stay the same: ToolExecutor.schemas),
and so is the model's part of the body: a few dozen tools are kilobytes of JSON a round.

Keyed by identity, with the message (or schema) kept alive next to its JSON (so its id
cannot be reused while cached). The contract that makes this right: a message or schema
dict is never mutated once it was sent (the agent replaces messages, it never edits
them). The bytes are exactly `json_body` of the dict body the dialect builds.
"""

from __future__ import annotations

import operator
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
MAX_PREFIXES = 1024  # conversations whose joined messages are kept


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
        # id(a conversation's first message) -> (the messages joined, their joined JSON).
        # The list keeps the first message alive, so its id is not reused while kept;
        # bounded by MAX_PREFIXES entries and `max_chars` characters of its own.
        self._prefixes: dict[int, tuple[list[dict[str, Any]], str]] = {}
        self._prefix_chars = 0

    def __len__(self) -> int:
        return len(self._json) + len(self._tools)

    @property
    def chars(self) -> int:
        """Characters of JSON kept (the bound on the memory the cache holds)."""
        return self._chars

    @property
    def prefix_chars(self) -> int:
        """Characters of the conversations' joined JSON kept (bounded by `max_chars` too)."""
        return self._prefix_chars

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
        return f'{head}, "messages": [{self._joined(messages)}]{tail}'.encode()

    def _joined(self, messages: Sequence[dict[str, Any]]) -> str:
        """``", ".join`` of the messages' JSON: the new ones joined onto the text kept
        for the same conversation when its messages begin `messages` (the same objects)."""
        if not messages:
            return ""
        first = messages[0]
        kept = self._prefixes.get(id(first))
        start, text = 0, ""
        if kept is not None:
            done, joined = kept
            # Identity, not equality: equal dicts with their keys in another order
            # are other JSON. `map` stops at the shorter list, hence the length first.
            if len(done) <= len(messages) and all(map(operator.is_, done, messages)):
                start, text = len(done), joined
        # What is kept next: up to the last message that is not a system note.
        end = len(messages)
        while end > start and messages[end - 1].get("role") == "system":
            end -= 1
        if end > start:
            new = ", ".join(map(self.message, messages[start:end]))
            text = f"{text}, {new}" if text else new
            self._keep_prefix(first, messages[:end], text)
        if end == len(messages):
            return text
        rest = ", ".join(map(self.message, messages[end:]))
        return f"{text}, {rest}" if text else rest

    def _keep_prefix(
        self, first: dict[str, Any], done: Sequence[dict[str, Any]], text: str
    ) -> None:
        """Keep `text` as the joined JSON of `done`, the conversation's that `first` begins."""
        old = self._prefixes.pop(id(first), None)
        if old is not None:
            self._prefix_chars -= len(old[1])
        if len(text) > self._max_chars:
            return  # too big to keep
        if len(self._prefixes) >= MAX_PREFIXES or self._prefix_chars + len(text) > self._max_chars:
            self._prefixes.clear()  # navi's caches' rule: emptied when full (caches.py)
            self._prefix_chars = 0
        self._prefixes[id(first)] = (done if isinstance(done, list) else list(done), text)
        self._prefix_chars += len(text)


def _members(value: dict[Any, Any]) -> str:
    """The JSON of `value`'s members, without the braces ("" for none)."""
    return _text(value)[1:-1] if value else ""
