"""The fake LLM server's two wire dialects: Ollama's NDJSON lines (``/api/chat``) and
OpenAI's SSE events (``/v1/chat/completions``) for one scripted reply.
"""

from __future__ import annotations

import json
from typing import Any

from navi_trio.llm.script import ContentItem, Reply, ScriptToolCall


def _interleave(lists: list[list[bytes]]) -> list[bytes]:
    """Round-robin: the first item of each list, then the second of each …"""
    out: list[bytes] = []
    for n in range(max((len(x) for x in lists), default=0)):
        out += [x[n] for x in lists if n < len(x)]
    return out


class _Dialect:
    """How one dialect writes a reply; `_Ollama` and `_OpenAI` fill it in."""

    content_type = "application/json"

    def __init__(self, reply: Reply, model: str, call_prefix: str) -> None:
        self.reply = reply
        self.model = model
        self.call_prefix = call_prefix

    def content(self, item: ContentItem) -> list[bytes]:
        raise NotImplementedError

    def final(self, prompt_tokens: int, completion_tokens: int) -> list[bytes]:
        raise NotImplementedError

    def malformed(self, line: str) -> bytes:
        raise NotImplementedError

    def error_line(self, message: str) -> bytes:
        raise NotImplementedError

    def error_body(self, message: str) -> dict[str, Any]:
        raise NotImplementedError


class _Ollama(_Dialect):
    content_type = "application/x-ndjson"

    def _line(self, message: dict[str, Any], **extra: Any) -> bytes:
        obj = {
            "model": self.model,
            "created_at": "2025-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": "", **message},
            "done": False,
            **extra,
        }
        return (json.dumps(obj) + "\n").encode()

    def content(self, item: ContentItem) -> list[bytes]:
        if item.kind == "thinking":
            return [self._line({"thinking": item.text})]
        if item.kind == "text":
            return [self._line({"content": item.text})]
        calls = [
            # A string is sent as-is: a real server may send cut or non-object JSON.
            {"function": {"name": c.name, "arguments": c.arguments}}
            for c in item.calls
        ]
        return [self._line({"tool_calls": calls})]

    def final(self, prompt_tokens: int, completion_tokens: int) -> list[bytes]:
        return [
            self._line(
                {},
                done=True,
                done_reason=self.reply.done_reason,
                total_duration=1000,
                prompt_eval_count=prompt_tokens,
                eval_count=completion_tokens,
            )
        ]

    def malformed(self, line: str) -> bytes:
        return (line + "\n").encode()

    def error_line(self, message: str) -> bytes:
        return (json.dumps({"error": message}) + "\n").encode()

    def error_body(self, message: str) -> dict[str, Any]:
        return {"error": message}


class _OpenAI(_Dialect):
    content_type = "text/event-stream"

    def __init__(self, reply: Reply, model: str, call_prefix: str) -> None:
        super().__init__(reply, model, call_prefix)
        self._role_sent = False

    @staticmethod
    def _event(obj: Any) -> bytes:
        return f"data: {json.dumps(obj)}\n\n".encode()

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        return self._event(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1735689600,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
        )

    def content(self, item: ContentItem) -> list[bytes]:
        if item.kind == "thinking":
            return [self._chunk({self.reply.thinking_field: item.text})]
        if item.kind == "text":
            return [self._chunk({"content": item.text})]
        style = self.reply.tool_call_style
        per_call = [self._fragments(i, call, style) for i, call in enumerate(item.calls)]
        if style == "reversed":
            # Later calls first, each call's fragments interleaved with the others'.
            return _interleave(per_call[::-1])
        return [frag for frags in per_call for frag in frags]

    def _fragments(self, i: int, call: ScriptToolCall, style: str) -> list[bytes]:
        """One call's fragments: the id and name first (or in every fragment), then the
        arguments in pieces, as each server style sends them."""
        args = call.arguments_json()
        cut = max(1, len(args) // 2)
        pieces = [args[:cut], args[cut:]] if args[cut:] else [args]
        call_id = f"{self.call_prefix}_{i}"
        if style == "repeat_name":
            # As llama-cpp-python 0.3 (chatml-function-calling) streams a call: every
            # fragment repeats the id, the type and the whole name with a few characters
            # of the arguments (also as the legacy function_call), an empty piece last.
            small = [args[n : n + 4] for n in range(0, len(args), 4)] + [""]
            return [
                self._chunk(
                    {
                        "role": None,
                        "content": None,
                        "function_call": {"name": call.name, "arguments": piece},
                        "tool_calls": [self._frag(i, call_id, call.name, piece)],
                    }
                )
                for piece in small
            ]
        if style == "split_name":
            half = max(1, len(call.name) // 2)
            names = [call.name[:half], call.name[half:]]
            out = [self._chunk({"tool_calls": [self._frag(i, call_id, names[0], "")]})]
            out.append(self._chunk({"tool_calls": [{"index": i, "function": {"name": names[1]}}]}))
            return out + [
                self._chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                for piece in pieces
            ]
        # OpenAI: the id and name with the first piece of the arguments, then the rest.
        out = [self._chunk({"tool_calls": [self._frag(i, call_id, call.name, pieces[0])]})]
        return out + [
            self._chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
            for piece in pieces[1:]
        ]

    @staticmethod
    def _frag(i: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
        return {
            "index": i,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def _reason(self) -> str:
        reason = self.reply.done_reason
        return "tool_calls" if self.reply.tool_calls and reason == "stop" else reason

    @staticmethod
    def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def whole(
        self, items: list[ContentItem], prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        """The non-streamed ``chat.completion`` body: the whole reply in one message."""
        text = "".join(i.text for i in items if i.kind == "text")
        thinking = "".join(i.text for i in items if i.kind == "thinking")
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if thinking:
            message[self.reply.thinking_field] = thinking
        calls = [c for i in items if i.kind == "tool_calls" for c in i.calls]
        if calls:
            message["tool_calls"] = [
                self._frag(n, f"{self.call_prefix}_{n}", c.name, c.arguments_json())
                for n, c in enumerate(calls)
            ]
            for call in message["tool_calls"]:
                del call["index"]
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1735689600,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self._reason()}],
            "usage": self._usage(prompt_tokens, completion_tokens),
        }

    def final(self, prompt_tokens: int, completion_tokens: int) -> list[bytes]:
        reason = self._reason()
        usage = self._usage(prompt_tokens, completion_tokens)
        usage_chunk = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1735689600,
            "model": self.model,
            "choices": [],
            "usage": usage,
        }
        return [self._chunk({}, reason), self._event(usage_chunk), b"data: [DONE]\n\n"]

    def malformed(self, line: str) -> bytes:
        return f"data: {line}\n\n".encode()

    def error_line(self, message: str) -> bytes:
        return self._event({"error": {"message": message, "type": "api_error"}})

    def error_body(self, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": "api_error", "param": None, "code": None}}
