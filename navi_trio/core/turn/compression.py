"""Context compression: summarise the older part of a context with the LLM.

The older part (tool calls and their results kept on one side) becomes one system
message marked ``summary`` and ``keep``: neither the user's words (the model would
answer them) nor the model's (it would continue them). A summary in the older part is
the summary so far, so summaries fold; an older part that is one summary is nothing to
compress. Forced compression (``shrink``) must leave a context that fits, so kept
messages are cut, biggest first, until they do; the display history keeps every word.
Nothing here persists or emits anything.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from navi_trio.errors import ConfigError, LLMError, NothingToCompactError
from navi_trio.profiles import AgentProfile, NaviConfig
from navi_trio.settings import Settings

from .context import is_kept_system
from .llm_call import StreamedReply, output_cap
from .tokens import TokenCounter

# complete(messages, purpose) -> the model's full answer (text, or a StreamedReply holding it);
# injected by the agent, which caps the answer at compression_max_tokens for PURPOSE.
Complete = Callable[[list[dict[str, Any]], str], Awaitable["str | StreamedReply"]]

SUMMARY_PREFIX = "[Summary of earlier conversation]"
DEFAULT_PROMPT_FILE = "compression.md"
PURPOSE = "compression"
# Before a pre_compact hook's text in a summary.
KEPT_PREFIX = "[Kept by a hook]"
# Room left in the summariser's own window for its prompt framing.
_FRAMING_ROOM = 256
# Room for the cut marker; and the least a kept message is cut to when shrinking.
_MARKER_ROOM = 16
_MIN_KEPT = 48


def is_summary(msg: Mapping[str, Any]) -> bool:
    if msg.get("summary"):
        return True
    content = msg.get("content")
    return isinstance(content, str) and content.startswith(SUMMARY_PREFIX)


def split_index(context: Sequence[Mapping[str, Any]], keep_recent: int) -> int:
    """Where the kept part starts: ``context[:i]`` is summarised, ``context[i:]`` kept.
    ``keep_recent`` from the end, moved back so no tool result is parted from its call."""
    if keep_recent < 0:
        raise ValueError(f"keep_recent must not be negative, got {keep_recent}")
    owners = _tool_owners(context)
    start = max(0, len(context) - keep_recent)
    moved = True
    while moved:
        moved = False
        while 0 < start < len(context) and context[start]["role"] == "tool":
            start -= 1
            moved = True
        earliest = min(
            (owners[i] for i in range(start, len(context)) if i in owners), default=start
        )
        if earliest < start:
            start = earliest
            moved = True
    return start


def _tool_owners(context: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """For each tool result's index, the index of the assistant message that called it."""
    owners: dict[int, int] = {}
    by_id: dict[str, int] = {}
    last_caller: int | None = None
    for i, msg in enumerate(context):
        if not isinstance(msg, Mapping) or not isinstance(msg.get("role"), str):
            raise TypeError(f"context[{i}] must be a message dict with a string 'role'")
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            last_caller = i
            for call in msg["tool_calls"]:
                if isinstance(call, Mapping) and call.get("id"):
                    by_id[str(call["id"])] = i
        elif msg["role"] == "tool":
            owner = by_id.get(str(msg.get("tool_call_id") or ""), last_caller)
            if owner is not None:
                owners[i] = owner
    return owners


@attrs.frozen
class CompressionOutcome:
    context: list[dict[str, Any]]  # [summary message] + the kept recent messages
    tokens_before: int
    tokens_after: int
    messages_summarised: int


def threshold(settings: Settings) -> int:
    """The estimated prompt size at which a context is compressed."""
    return int(settings.num_ctx * settings.compression_threshold)


def over_threshold(settings: Settings, tokens: int) -> bool:
    """Whether `tokens` reach the threshold: asked every round, with no Compressor made."""
    return tokens >= threshold(settings)


class Compressor:
    def __init__(
        self, settings: Settings, counter: TokenCounter, complete: Complete, prompts_dir: Path
    ) -> None:
        self._settings = settings
        self._counter = counter
        self._complete = complete
        self._prompts_dir = Path(prompts_dir)

    def threshold(self) -> int:
        return threshold(self._settings)

    def keep_recent(self, profile: AgentProfile) -> int:
        value = profile.compression_keep_recent
        return self._settings.compression_keep_recent if value is None else value

    def max_tokens(self, profile: AgentProfile) -> int:
        """The summary's size, which is also the summary call's output cap."""
        return output_cap(self._settings, profile, PURPOSE)

    def would_compress(
        self, context: Sequence[Mapping[str, Any]], *, profile: AgentProfile, shrink: bool = False
    ) -> bool:
        """True when the older part holds something that is not already one summary, or
        (with `shrink`) when the kept part is too big to fit."""
        start = split_index(context, self.keep_recent(profile))
        if self._has_older(context[:start]):
            return True
        return shrink and self._kept_too_big(context[:start], context[start:])

    @staticmethod
    def _has_older(older: Sequence[Mapping[str, Any]]) -> bool:
        parts = _summarisable(older)
        return bool(parts) and not (len(parts) == 1 and is_summary(parts[0]))

    def _kept_budget(self, head: Sequence[Mapping[str, Any]]) -> int:
        """Tokens the kept part may use: the threshold minus what goes before it."""
        return self.threshold() - self._counter.estimate_messages(head)

    def _kept_too_big(
        self, head: Sequence[Mapping[str, Any]], kept: Sequence[Mapping[str, Any]]
    ) -> bool:
        per = self._settings.message_token_budget
        sizes = [self._counter.estimate_message(m) for m in kept]
        return any(n > per for n in sizes) or sum(sizes) > self._kept_budget(head)

    async def compress(
        self,
        context: Sequence[Mapping[str, Any]],
        *,
        profile: AgentProfile,
        config: NaviConfig,
        reason: str,
        shrink: bool = False,
        keep: str = "",
    ) -> CompressionOutcome:
        """Summarise the older part; raises NothingToCompactError when there is none.

        `keep` (a pre_compact hook's text) is added to the summary as it is, so it survives
        whatever the model writes; with `shrink` the kept messages are cut until they fit."""
        start = split_index(context, self.keep_recent(profile))
        older = list(context[:start])
        if not self.would_compress(context, profile=profile, shrink=shrink):
            raise NothingToCompactError(
                f"nothing to compact ({reason}): the {len(context) - start} most recent "
                "messages are kept as they are and everything before them is already a summary"
            )
        head: list[dict[str, Any]] = [dict(m) for m in _summarisable(older)]
        if self._has_older(older):
            max_tokens = self.max_tokens(profile)
            if max_tokens < 1:
                raise ConfigError(
                    f"profile {profile.id!r}: compression_max_tokens must be 1 or more"
                )
            prompt = await self._prompt(profile, config, max_tokens)
            if keep:
                prompt += f"\n\nThe summary must keep this, as it is:\n{keep}"
            summary = await self._summarise(_summarisable(older), prompt, max_tokens)
            if keep:
                summary += f"\n\n{KEPT_PREFIX}\n{keep}"
            head = [
                {
                    "role": "system",
                    "content": f"{SUMMARY_PREFIX}\n{summary}",
                    "summary": True,
                    "keep": True,
                }
            ]
        kept = [dict(m) for m in context[start:]]
        if shrink:
            kept = self._shrink(kept, self._kept_budget(head))
        new_context = [*head, *kept]
        return CompressionOutcome(
            context=new_context,
            tokens_before=self._counter.estimate_messages(context),
            tokens_after=self._counter.estimate_messages(new_context),
            messages_summarised=len(older),
        )

    def _shrink(self, kept: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
        """Cut kept messages to the per-message budget, then the biggest ones further
        until their total fits `budget` (never below a small floor each)."""
        out = [self._cut(m, self._settings.message_token_budget) for m in kept]
        sizes = [self._counter.estimate_message(m) for m in out]
        if sum(sizes) <= budget:
            return out
        level = _level(sizes, max(budget, _MIN_KEPT * len(sizes)))
        return [self._cut(m, level) for m in out]

    def _cut(self, msg: dict[str, Any], limit: int) -> dict[str, Any]:
        size = self._counter.estimate_message(msg)
        if size <= limit:
            return msg
        if msg.get("tool_calls"):
            # A call's long string arguments (a file written whole) are cut too: the
            # call keeps its id, name and keys, so its result still pairs with it.
            msg = {**msg, "tool_calls": [self._cut_call(c, limit) for c in msg["tool_calls"]]}
            size = self._counter.estimate_message(msg)
        content = msg.get("content")
        if size <= limit or not isinstance(content, str) or not content:
            return msg
        fixed = size - self._counter.count_text(content)
        room = max(limit - fixed - _MARKER_ROOM, _MIN_KEPT // 2)
        cut, n = self._counter.truncate_middle(content, room)
        return {**msg, "content": cut} if n else msg

    def _cut_call(self, call: Any, limit: int) -> Any:
        args = call.get("arguments") if isinstance(call, Mapping) else None
        if not isinstance(args, Mapping):
            return call
        room = max(limit // (2 * max(len(args), 1)), _MIN_KEPT // 2)
        cut = {
            k: self._counter.truncate_middle(v, room)[0] if isinstance(v, str) else v
            for k, v in args.items()
        }
        return {**call, "arguments": cut}

    async def _prompt(self, profile: AgentProfile, config: NaviConfig, max_tokens: int) -> str:
        if profile.compression_prompt_file:
            path = config.resolve_path(profile.compression_prompt_file)
            whose = f"profile {profile.id!r} compression_prompt_file"
        else:
            path = self._prompts_dir / DEFAULT_PROMPT_FILE
            whose = "default compression prompt"
        try:
            text = await trio.Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{whose}: cannot read {path}: {exc.strerror}") from None
        limit = f"at most {max_tokens} tokens"
        if "{max_tokens}" in text:
            return text.replace("{max_tokens}", str(max_tokens))
        return f"{text.rstrip()}\n\nKeep the summary to {limit}."

    async def _summarise(self, older: list[Mapping[str, Any]], prompt: str, max_tokens: int) -> str:
        previous = [str(m.get("content") or "") for m in older if is_summary(m)]
        so_far = "\n\n".join(p.removeprefix(SUMMARY_PREFIX).strip() for p in previous)
        entries = [self._render(m) for m in older if not is_summary(m)]
        # The transcript must fit the summariser's own window: when it does not, fold it
        # in chunks, each chunk summarised together with the summary so far.
        # Each request holds the prompt, the summary so far (capped at max_tokens from
        # the second chunk on) and a chunk, and leaves max_tokens for the answer.
        carried = max(self._counter.count_text(so_far), max_tokens)
        room = self._settings.num_ctx - 2 * max_tokens - self._counter.count_text(prompt)
        room = max(room - _FRAMING_ROOM - (carried - max_tokens), _FRAMING_ROOM)
        for chunk in _chunks(entries, room, self._counter):
            answer = await self._complete(_request(prompt, so_far, chunk), PURPOSE)
            if isinstance(answer, StreamedReply):
                answer = answer.content
            if not isinstance(answer, str) or not answer.strip():
                raise LLMError(
                    "the model returned an empty summary; the context was left as it was"
                )
            so_far, _ = self._counter.truncate_middle(answer.strip(), max_tokens)
        return so_far

    def _render(self, msg: Mapping[str, Any]) -> str:
        role = msg["role"]
        content = str(msg.get("content") or "")
        if role == "tool":
            head = f"### tool result ({msg.get('name') or msg.get('tool_call_id') or 'tool'})"
        elif role == "system":
            head = "### note"
        else:
            head = f"### {role}"
        lines = [head]
        if content:
            lines.append(content)
        for call in msg.get("tool_calls") or ():
            args = call.get("arguments")
            args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            lines.append(f"[called {call.get('name')}({args_text})]")
        text = "\n".join(lines)
        # One huge tool output must not crowd out the rest of the transcript.
        budget = self._settings.message_token_budget
        return self._counter.truncate_middle(text, budget)[0] if budget > 0 else text


def _summarisable(older: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    # Stored system prompts are stripped from every built context: nothing to keep.
    return [m for m in older if m["role"] != "system" or is_kept_system(m)]


def _level(sizes: Sequence[int], budget: int) -> int:
    """The largest cap c with sum(min(size, c)) <= budget (water filling)."""
    left = budget
    ordered = sorted(sizes)
    for i, size in enumerate(ordered):
        share = left // (len(ordered) - i)
        if size > share:
            return max(share, _MIN_KEPT)
        left -= size
    return max(ordered, default=budget)


def _chunks(entries: list[str], room: int, counter: TokenCounter) -> list[list[str]]:
    chunks: list[list[str]] = [[]]
    used = 0
    for entry in entries:
        size = counter.count_text(entry) + 2
        if chunks[-1] and used + size > room:
            chunks.append([])
            used = 0
        chunks[-1].append(entry)
        used += size
    return chunks


def _request(prompt: str, so_far: str, chunk: list[str]) -> list[dict[str, Any]]:
    parts = []
    if so_far:
        parts.append(
            "Summary of the earlier conversation so far (fold its facts into your summary):\n"
            + so_far
        )
    if chunk:
        parts.append("Conversation to summarise:\n\n" + "\n\n".join(chunk))
    return [
        {"role": "system", "content": prompt},
        {"role": "user", "content": "\n\n".join(parts)},
    ]
