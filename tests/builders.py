"""Builders of history messages, in the store's internal shape (navi_trio.llm.base).

    history = [user("go"), assistant(call("c1"), call("c2")), result("c1"), result("c2")]

`call` and `result` take `None` for a call or result without an id (what a model may
send, and what repair must cope with). Shared by the store's and repair's tests; the
agent's tests build replies for the fake LLM instead (tests/agent_tools.py `call`).
"""

from __future__ import annotations

from typing import Any


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def call(cid: str | None, name: str = "shell") -> dict[str, Any]:
    """One tool call of an assistant message (no arguments)."""
    c: dict[str, Any] = {"name": name, "arguments": {}}
    if cid is not None:
        c["id"] = cid
    return c


def assistant(*calls: dict[str, Any], text: str = "") -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = list(calls)
    return msg


def result(cid: str | None, content: str = "ok") -> dict[str, Any]:
    """The tool message answering call `cid`."""
    msg: dict[str, Any] = {"role": "tool", "name": "shell", "content": content}
    if cid is not None:
        msg["tool_call_id"] = cid
    return msg
