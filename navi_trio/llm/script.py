"""The reply script: what a scripted model answers, one reply per request.

One definition shared by the in-process `ScriptedBackend` and the fake LLM HTTP server
(`navi_trio.testing.fake_llm`), so unit tests, HTTP tests and benchmarks speak the same
format. A script is a JSON list of reply objects; every key is optional:

===================  ======================================================================
key                  meaning
===================  ======================================================================
text                 the answer, streamed one word per chunk
thinking             reasoning, streamed one word per chunk before the text
tool_calls           list of ``{"name", "arguments"}``; arguments is an object, or a
                     string sent as-is (to simulate JSON cut by ``done_reason: length``)
model                the resolved model name reported back (default: the requested one)
delay_first          seconds to wait before the first chunk (prefill)
delay_chunk          seconds to wait before each later chunk
stall                true: after the content chunks send nothing more, keep the line open
drop_after           close the connection after N content chunks (at most all of them;
                     the final chunk is never sent)
status, error_body   answer this HTTP error status instead; error_body is a string (wrapped
                     in the dialect's error JSON) or an object (sent as JSON as it is)
error_raw            true: send error_body verbatim as text/plain, not wrapped in JSON
malformed            true (or a string: the line itself): send one unparseable line after
                     the content chunks, then end the stream
error_line           send ``{"error": "<this>"}`` inside the 200 stream after the content
                     chunks, then end the stream (as Ollama does)
prompt_tokens        usage reported at the end (default: ~characters/4 of the request)
completion_tokens    usage reported at the end (default: the number of content chunks)
done_reason          "stop" (default), "length" (the answer was cut) or any other word
thinking_field       OpenAI dialect only: "reasoning" (default, as Ollama sends it) or
                     "reasoning_content" (as vLLM / DeepSeek send it)
tool_call_style      OpenAI dialect only, how tool call fragments go out: "openai" (default:
                     id and name once, arguments in two pieces), "split_name" (the name in
                     two pieces), "repeat_name" (id and whole name in every fragment, as
                     llama-cpp-python sends them), "reversed" (calls out of index order,
                     their fragments interleaved)
empty_body           true: answer 200 with an empty body (what llama.cpp does when the
                     prompt is larger than its window)
endless              true: after the content, stream the text (or "more ") again and
                     again, never finishing (a model that does not stop)
hang_up              true: close the connection without answering (a server dropping an
                     idle keep-alive connection as the request comes); the client retries
                     once on a fresh connection and gets the next reply
===================  ======================================================================

An unknown key or a value of the wrong type is a `ConfigError` naming it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import attrs
import cattrs

from navi_trio.errors import ConfigError
from navi_trio.strict import describe, strict_converter

DEFAULT_MODEL = "fake-model"


def _non_negative(_inst: Any, attr: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"{attr.name} must be >= 0, got {value!r}")


def _arguments_value(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, dict | str):
        raise TypeError(f"arguments must be an object or a string, got {value!r}")


@attrs.frozen
class ScriptToolCall:
    name: str
    arguments: Any = attrs.field(factory=dict, validator=_arguments_value)

    def arguments_json(self) -> str:
        """The arguments as the JSON text a model would send (a string is sent as-is)."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


def _status(_inst: Any, _attr: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and not 400 <= value <= 599:
        raise ValueError(f"status must be an HTTP error status (400-599), got {value}")


def _error_body(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str | dict):
        raise TypeError(f"error_body must be a string or an object, got {value!r}")


def _malformed(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool | str):
        raise TypeError(f"malformed must be true/false or a string, got {value!r}")


@attrs.frozen(kw_only=True)
class Reply:
    text: str = ""
    thinking: str = ""
    tool_calls: list[ScriptToolCall] = attrs.field(factory=list)
    model: str | None = None
    delay_first: float = attrs.field(default=0.0, validator=_non_negative)
    delay_chunk: float = attrs.field(default=0.0, validator=_non_negative)
    stall: bool = False
    drop_after: int | None = attrs.field(default=None, validator=_non_negative)
    status: int | None = attrs.field(default=None, validator=_status)
    error_body: Any = attrs.field(default="", validator=_error_body)
    error_raw: bool = False
    malformed: Any = attrs.field(default=False, validator=_malformed)
    error_line: str | None = None
    prompt_tokens: int | None = attrs.field(default=None, validator=_non_negative)
    completion_tokens: int | None = attrs.field(default=None, validator=_non_negative)
    done_reason: str = "stop"
    thinking_field: Literal["reasoning", "reasoning_content"] = "reasoning"
    tool_call_style: Literal["openai", "split_name", "repeat_name", "reversed"] = "openai"
    empty_body: bool = False
    endless: bool = False
    hang_up: bool = False

    def content(self) -> list[ContentItem]:
        """The content chunks in stream order: thinking words, text words, tool calls."""
        items: list[ContentItem] = [ContentItem("thinking", w) for w in split_words(self.thinking)]
        items += [ContentItem("text", w) for w in split_words(self.text)]
        if self.tool_calls:
            items.append(ContentItem("tool_calls", "", tuple(self.tool_calls)))
        return items

    def malformed_line(self) -> str | None:
        if self.malformed is False:
            return None
        if self.malformed is True:
            return '{"message": {"content": "this line is cut'
        return str(self.malformed)

    def error_message(self) -> str:
        """The error text of an HTTP error reply, as a client would quote it."""
        body = self.error_body
        if isinstance(body, dict):
            # As `navi_trio.llm.http.error_text` reads it from an HTTP body.
            err = body.get("error")
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                return str(err["message"])
            if isinstance(err, str):
                return err
            return json.dumps(err if err is not None else body)
        return str(body) or f"HTTP {self.status}"


@attrs.frozen
class ContentItem:
    kind: Literal["thinking", "text", "tool_calls"]
    text: str
    calls: tuple[ScriptToolCall, ...] = ()


def split_words(text: str) -> list[str]:
    """Split into word chunks that join back to exactly `text` (spaces stay attached)."""
    parts = re.findall(r"\s*\S+\s*", text)
    if not parts and text:
        return [text]  # whitespace only
    return parts


def rough_tokens(request_messages: Iterable[Any]) -> int:
    """~characters/4 of the messages as sent (content, tool calls, names, ids), plus a
    few tokens of chat template per message: the fake's default prompt_tokens.

    Like a real server it counts the whole prompt: counting the content alone made a
    history of tool calls look cut to a third (navi's "prompt_truncated" check fired on
    the fake, compressed, and the script's next reply was no summary)."""
    chars = 0
    for msg in request_messages:
        if isinstance(msg, dict):
            chars += len(json.dumps(msg, ensure_ascii=False, default=str)) + 16
    return max(1, chars // 4)


_converter = strict_converter()


def parse_reply(data: Reply | dict[str, Any], where: str = "reply") -> Reply:
    """A Reply from its JSON object; `ConfigError` naming `where` and the bad key."""
    if isinstance(data, Reply):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {data!r:.80}")
    known = {f.name for f in attrs.fields(Reply)}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {', '.join(map(repr, unknown))} "
            f"(known keys: {', '.join(sorted(known))})"
        )
    try:
        return _converter.structure(data, Reply)
    except cattrs.BaseValidationError as exc:
        problems = describe(exc)
        raise ConfigError(f"{where}: {problems}") from None
    except (TypeError, ValueError) as exc:  # attrs validators run outside cattrs' wrapping
        raise ConfigError(f"{where}: {exc}") from None


def parse_script(data: Any, where: str = "script") -> list[Reply]:
    """A list of Replies from decoded JSON (a list of reply objects)."""
    if not isinstance(data, list):
        raise ConfigError(f"{where}: expected a JSON list of replies, got {type(data).__name__}")
    return [parse_reply(item, f"{where}: reply {i}") for i, item in enumerate(data)]


def load_script(path: str | Path) -> list[Reply]:
    """Read a script file (a JSON list of replies); errors name the file and the reply."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read script {p}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not valid JSON: {exc}") from None
    return parse_script(data, str(p))
