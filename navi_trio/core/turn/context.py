"""What the model sees on each call: the context builder.

In order: the system message (built fresh, cached per profile and config, with the
project's files and skills), the memory message, the session context without stored
system messages (except ``keep`` and ``summary`` ones), and ``extra`` notes for this
call only. A message over ``settings.message_token_budget`` is cut in the built copy
only. `ContextViews` lets each round copy, check and count only the messages added
since the previous one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from navi_trio.errors import ContextTooLargeError
from navi_trio.profiles import AgentProfile, NaviConfig
from navi_trio.settings import Settings

from .tokens import TokenCounter

MEMORY_HEADER = "## What I remember about the user"
SEPARATOR = "\n\n---\n\n"
TRUNCATED_ROLES = ("tool", "assistant")
# Room for the marker line and its newlines when a message is cut.
_MARKER_ROOM = 16
# With parallel tool calls, every call of one answer runs at once, in no set order: a
# model that batches "read the file" with "edit it" gets nonsense back.
PARALLEL_CALLS_NOTE = """## Several tool calls in one answer
The tool calls of one answer run at the same time, in no fixed order, and you see all
their results together. Batch only calls that are independent of each other: none needs
another one's result, and no two write the same file or act on the same process or
terminal. A call that depends on another (read a file, then edit it; start a process,
then read its output) goes in a later answer, after you have seen the first result."""


def is_kept_system(msg: Mapping[str, Any]) -> bool:
    """True for stored system messages that must reach the model (notes, summaries)."""
    return bool(msg.get("keep")) or bool(msg.get("summary"))


@attrs.define
class RunningSum:
    """A count over ``views[:upto]``, extended by what was appended since."""

    upto: int = 0
    total: int = 0

    def over(self, views: list[dict[str, Any]], count: Callable[[Sequence[Any]], int]) -> int:
        if self.upto < len(views):
            self.total += count(views[self.upto :])
            self.upto = len(views)
        return self.total


@attrs.define(eq=False)
class ContextViews:
    """The built copies of one context list's messages, kept between the rounds of a turn.

    Valid while the list only grows: a different or shorter list, or a first or last entry
    that is no longer the same object, starts over; replacing an entry in the middle in
    place needs `invalidate()`. A round copies and counts only what is new."""

    source: list[Any] | None = None
    seen: int = 0  # entries of `source` processed (stripped system messages included)
    first: object = None  # source[0] and source[seen - 1] as processed
    last: object = None
    views: list[dict[str, Any]] = attrs.field(factory=list)
    estimate: RunningSum = attrs.field(factory=RunningSum)
    bound: RunningSum = attrs.field(factory=RunningSum)
    # The last list `build` returned with these views, and where its views sit in it.
    built: list[dict[str, Any]] | None = None
    head: int = 0
    # The system and memory messages last built: the same dicts again while their text
    # is the same (the backend then sends their kept JSON, the counter its kept count).
    heads: list[dict[str, Any]] = attrs.field(factory=list)

    def same_heads(self, heads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`heads`, each replaced by the one built before at its place when equal (all
        their values are text, so equal dicts send the same JSON)."""
        kept = self.heads
        out = [kept[i] if i < len(kept) and kept[i] == h else h for i, h in enumerate(heads)]
        self.heads = out
        return out

    def invalidate(self) -> None:
        self.source = None

    def _fresh(self, context: Sequence[Any]) -> bool:
        if self.source is not context or len(context) < self.seen:
            return False
        return self.seen == 0 or (context[0] is self.first and context[self.seen - 1] is self.last)

    def _reset(self, context: Sequence[Any]) -> None:
        self.source = context if isinstance(context, list) else None
        self.seen = 0
        self.estimate, self.bound = RunningSum(), RunningSum()
        self.first = self.last = None
        self.views = []
        self.built = None


class ContextBuilder:
    """Builds the message list for one LLM call. Holds only the system prompt cache.

    An entry of the cache serves only the config it was built from, so a turn on an older
    config never hands its prompt to a turn on a newer one; `invalidate()` drops entries."""

    def __init__(self, settings: Settings, counter: TokenCounter) -> None:
        self._settings = settings
        self._counter = counter
        self._system_cache: dict[tuple[str, bool], tuple[NaviConfig, str]] = {}

    def system_prompt(
        self,
        config: NaviConfig,
        profile: AgentProfile,
        *,
        subagent: bool = False,
        override: str | None = None,
    ) -> str:
        """persona + ``---`` + the profile prompt (a sub-agent's own when it has one); `override`
        is a complete prompt, used verbatim and not cached."""
        if override is not None:
            if not isinstance(override, str):
                raise TypeError(f"system prompt override must be a string, got {override!r}")
            return override
        key = (profile.id, subagent)
        cached = self._system_cache.get(key)
        if cached is not None and cached[0] is config:
            return cached[1]
        body = profile.system_prompt
        if subagent and profile.subagent_system_prompt:
            body = profile.subagent_system_prompt
        parts = [p.strip() for p in (config.persona, body) if p and p.strip()]
        text = SEPARATOR.join(parts)
        self._system_cache[key] = (config, text)
        return text

    def parallel_calls(self, profile: AgentProfile) -> bool:
        """Whether `profile` runs the calls of one answer at once (else the setting)."""
        value = profile.parallel_tool_calls
        return self._settings.parallel_tool_calls if value is None else value

    def invalidate(self, profile_id: str | None = None) -> None:
        """Drop the cached system prompts of `profile_id` (of every profile when None)."""
        if profile_id is None:
            self._system_cache.clear()
            return
        for key in [k for k in self._system_cache if k[0] == profile_id]:
            del self._system_cache[key]

    def build(
        self,
        *,
        config: NaviConfig,
        profile: AgentProfile,
        context: Sequence[Mapping[str, Any]],
        memories: Sequence[str] = (),
        extra: Sequence[Mapping[str, Any]] = (),
        system_override: str | None = None,
        subagent: bool = False,
        views: ContextViews | None = None,
        project: str = "",
    ) -> list[dict[str, Any]]:
        """The messages for one call; every dict is a new (shallow) copy.

        `project`: the run's instruction files and skills, after the profile's prompt. Nested
        values are shared with the input, and with `views` the copies (and the system and
        memory messages, while their text is the same) are reused by the next build:
        callers must not mutate any dict of the result."""
        system = self.system_prompt(config, profile, subagent=subagent, override=system_override)
        if project:
            system = f"{system}{SEPARATOR}{project}" if system else project
        if self.parallel_calls(profile):
            system = f"{system}{SEPARATOR}{PARALLEL_CALLS_NOTE}" if system else PARALLEL_CALLS_NOTE
        built: list[dict[str, Any]] = [{"role": "system", "content": system}]
        memory = memory_message(memories)
        if memory is not None:
            built.append(memory)
        if views is None:
            built.extend(self._views(context, 0))
        else:
            built = views.same_heads(built)[:]
            if not views._fresh(context):
                views._reset(context)
            if len(context) > views.seen:
                views.views.extend(self._views(context, views.seen))
                views.seen = len(context)
                views.first, views.last = context[0], context[-1]
            views.head = len(built)
            built.extend(views.views)
            views.built = built
        for i, msg in enumerate(extra):
            _check_message(msg, f"extra[{i}]")
            built.append(dict(msg))
        return built

    def _views(self, context: Sequence[Mapping[str, Any]], start: int) -> list[dict[str, Any]]:
        budget = self._settings.message_token_budget
        out = []
        for i in range(start, len(context)):
            msg = context[i]
            _check_message(msg, f"context[{i}]")
            if msg["role"] == "system" and not is_kept_system(msg):
                continue
            out.append(self._view(msg, budget))
        return out

    def estimate(
        self, built: Sequence[Mapping[str, Any]], views: ContextViews | None = None
    ) -> int:
        """`counter.estimate_messages(built)`; with the `views` that built it, only the
        messages not counted by an earlier call are counted (a running sum)."""
        count = self._counter.estimate_messages
        return _running(built, views, count, None if views is None else views.estimate)

    def bound(self, built: Sequence[Mapping[str, Any]], views: ContextViews | None = None) -> int:
        """`counter.bound_messages(built)`, with a running sum like `estimate`."""
        count = self._counter.bound_messages
        return _running(built, views, count, None if views is None else views.bound)

    def check_context_size(
        self,
        built: Sequence[Mapping[str, Any]],
        *,
        num_ctx: int,
        reserve: int | None = None,
        views: ContextViews | None = None,
    ) -> int:
        """Estimated tokens of `built`; ContextTooLargeError when it leaves no `reserve` (default
        ``min(1024, num_ctx // 8)``) to answer. While the encoding loads, a bound that fits."""
        if num_ctx <= 0:
            raise ValueError(f"num_ctx must be positive, got {num_ctx}")
        room = min(1024, num_ctx // 8) if reserve is None else reserve
        if room < 0 or room >= num_ctx:
            raise ValueError(f"reserve must be between 0 and num_ctx ({num_ctx}), got {room}")
        limit = num_ctx - room
        if not self._counter.loaded:  # the first call need not wait for the encoding
            bound = self.bound(built, views)
            if bound <= limit:
                return bound
        tokens = self.estimate(built, views)
        if tokens > limit:
            raise ContextTooLargeError(tokens, limit)
        return tokens

    def _view(self, msg: Mapping[str, Any], budget: int) -> dict[str, Any]:
        view = dict(msg)
        if msg["role"] not in TRUNCATED_ROLES or budget <= 0:
            return view
        if not self._counter.loaded and self._counter.bound_messages([msg]) <= budget:
            return view  # fits for sure: no need to wait for the encoding
        size = self._counter.estimate_message(msg)
        if size <= budget:
            return view
        content = msg.get("content") or ""
        # What is not content (tool calls, framing) cannot be cut without breaking it.
        fixed = size - self._counter.count_text(content)
        room = max(budget - fixed - _MARKER_ROOM, 0)
        view["content"], _ = self._counter.truncate_middle(content, room)
        return view


def memory_message(memories: Sequence[str]) -> dict[str, Any] | None:
    """The ``## What I remember about the user`` system message, or None when empty."""
    if isinstance(memories, str):
        raise TypeError("memories must be a list of strings, not one string")
    facts = []
    for i, fact in enumerate(memories):
        if not isinstance(fact, str):
            raise TypeError(f"memories[{i}] must be a string, got {type(fact).__name__}")
        if fact.strip():
            facts.append(f"- {fact.strip()}")
    if not facts:
        return None
    return {"role": "system", "content": MEMORY_HEADER + "\n" + "\n".join(facts)}


def _running(
    built: Sequence[Mapping[str, Any]],
    views: ContextViews | None,
    count: Callable[[Sequence[Any]], int],
    total: RunningSum | None,
) -> int:
    """`count(built)`, the part of `built` that is `views` taken from the running `total`."""
    part = _views_part(built, views)
    if part is None or views is None or total is None:
        return count(built)
    start, end = part
    return total.over(views.views, count) + count(built[:start]) + count(built[end:])


def _views_part(
    built: Sequence[Mapping[str, Any]], views: ContextViews | None
) -> tuple[int, int] | None:
    """Where `views`' messages sit in `built`, when `built` is the list built with them."""
    if views is None or views.built is not built:
        return None
    end = views.head + len(views.views)
    if end > len(built):
        return None
    return views.head, end


def _check_message(msg: Any, where: str) -> None:
    if type(msg) is not dict and not isinstance(msg, Mapping):  # the ABC's check last
        raise TypeError(f"{where} must be a message dict, got {type(msg).__name__}")
    role = msg.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise ValueError(f"{where} has role {role!r}; expected system, user, assistant or tool")
