"""What the embedded model is asked, in which shape: plain roles, notes and grammars.

Pure functions, no llama.cpp: the model host process (llm/model_host.py) builds every
prompt and grammar with them, and tests read them without loading a model.

Tool calls: a 135M model does not write them reliably by itself, so the host asks in
two constrained steps (llama.cpp grammars). First the model chooses, under a grammar
that admits only ``message`` or ``tool:<name>`` for the offered tools; then it either
streams its answer freely, or writes the arguments under a grammar built from that tool's
JSON schema. Whatever the model does, a tool call is well-formed and names a real tool.
A small model also tends to call the same tool again and again: after ``tool_rounds``
rounds of tool calls since the user's last message (``NAVI_LOCAL_TOOL_ROUNDS``, default
1), it is asked to answer, without tools.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

CHOICE_MAX_TOKENS = 24
ARGS_MAX_TOKENS = 512
DEFAULT_MAX_TOKENS = 1024
REPEAT_PENALTY = 1.2

ANSWER_NOTE = (
    "The tool's result is above. Now answer the user's message in plain words, using "
    "that result. Do not write tool calls."
)


def _call_text(call: dict[str, Any]) -> str:
    return f"{call.get('name', '')} {json.dumps(call.get('arguments') or {})}"


def json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def local_messages(messages: Iterable[dict[str, Any]]) -> list[dict[str, str]]:
    """Internal messages as plain role/content pairs every chat template accepts.

    A tool call and its result become one user-side note (``[tool NAME {args} returned]``
    and the result): a call written as the assistant's own words is what a small model
    copies into its next answer. Any text the assistant wrote with the call stays.
    """
    out: list[dict[str, str]] = []
    calls_by_id: dict[str, str] = {}
    for msg in messages:
        role = msg.get("role", "user")
        content = msg.get("content") or ""
        if not isinstance(content, str):
            content = json.dumps(content)
        if role == "assistant" and msg.get("tool_calls"):
            for call in msg["tool_calls"]:
                calls_by_id[str(call.get("id", ""))] = _call_text(call)
            if content:
                out.append({"role": "assistant", "content": content})
        elif role == "tool":
            call = calls_by_id.get(str(msg.get("tool_call_id", "")), msg.get("name") or "")
            out.append({"role": "user", "content": f"[tool {call} returned]\n{content}"})
        elif role in ("system", "user", "assistant"):
            out.append({"role": role, "content": content})
    # Templates want one system message, first.
    systems = [m["content"] for m in out if m["role"] == "system"]
    rest = [m for m in out if m["role"] != "system"]
    return ([{"role": "system", "content": "\n\n".join(systems)}] if systems else []) + rest


def tool_functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The offered tools by name (OpenAI-style function schemas, or bare functions)."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools:
        fn = tool.get("function", tool)
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            found[fn["name"]] = fn
    return found


def choice_note(functions: dict[str, dict[str, Any]], after_tool: bool) -> str:
    lines = ["You can answer the user, or call one of these tools:"]
    for name, fn in functions.items():
        lines.append(f"- {name}: {str(fn.get('description', '')).strip()[:300]}")
    lines.append(
        "Reply `message` to answer in words, or `tool:NAME` to call a tool. "
        "Call a tool when the user asks for one or when it can do what they ask."
    )
    if after_tool:
        lines.append("A tool result is above: if it answers the user, reply `message`.")
    return "\n".join(lines)


def _gbnf_literal(text: str) -> str:
    return json.dumps(text)  # GBNF string literals take JSON's escapes


def choice_grammar_text(names: Iterable[str]) -> str:
    alts = " | ".join(_gbnf_literal(f"tool:{n}") for n in names)
    return f'root ::= "message" | {alts}'


def args_note(name: str, fn: dict[str, Any]) -> str:
    schema = json.dumps(fn.get("parameters") or {"type": "object"})
    return f"Call the tool {name} now. Write only its arguments, as JSON matching: {schema}"


def args_schema(fn: dict[str, Any]) -> dict[str, Any]:
    schema = fn.get("parameters")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return {"type": "object"}
    return schema


def sampling(options: dict[str, Any], seed: int) -> dict[str, Any]:
    """llama-cpp-python's sampling parameters from a request's options."""
    max_tokens = options.get("max_tokens") or options.get("num_predict") or DEFAULT_MAX_TOKENS
    return {
        "temperature": float(options.get("temperature", 0.2)),
        "seed": int(options.get("seed", seed)),
        "max_tokens": int(max_tokens),
        # A small model at a low temperature loops on one sentence without it.
        "repeat_penalty": float(options.get("repeat_penalty", REPEAT_PENALTY)),
    }


def tool_rounds(messages: list[dict[str, Any]]) -> int:
    """Assistant tool-call messages since the last user message."""
    rounds = 0
    for msg in reversed(messages):
        if msg.get("role") == "user":
            break
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            rounds += 1
    return rounds


def with_system(messages: list[dict[str, str]], note: dict[str, str]) -> list[dict[str, str]]:
    """`messages` with `note` added to their one system message (first)."""
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": messages[0]["content"] + "\n\n" + note["content"]}
        return [first, *messages[1:]]
    return [note, *messages]
