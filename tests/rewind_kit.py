"""Helpers for the rewind and fork tests (tests/test_rewind*.py, test_fork*.py, the WebSocket
and CLI ones): a profile whose model is the fake LLM's script, with no planning, tools
that write (filesystem, terminal and code_exec allowed to run without asking in full
mode, since this box may have no bubblewrap), and the replies that make the model call
them. The folders compared are real ones under tmp_path, with `tree_of` (the oracle of
the engine's own tests: content, permission bits, links, empty folders).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from test_checkpoints_support import diff as diff
from test_checkpoints_support import tree_of as tree_of
from test_checkpoints_support import users_own

from navi_trio.testing import Harness
from navi_trio.tools.base import Tool

TIMEOUT = 60
# Terminal and code_exec run unsandboxed (no bwrap here): full mode, as the admin.
FULL: dict[str, Any] = {"user_role": "admin", "mode": "full"}
PROFILES: dict[str, dict[str, Any]] = {
    "general": {
        "planning_first_message": False,
        "anti_stall_enabled": False,
        "think_enabled": False,
        "policy": {
            "rules": [
                {"tool": "terminal", "decision": "allow"},
                {"tool": "code_exec", "decision": "allow"},
            ]
        },
    }
}


def call(tool: str, /, **arguments: Any) -> dict[str, Any]:
    return {"name": tool, "arguments": arguments}


def calls(*items: dict[str, Any]) -> dict[str, Any]:
    """A reply of the fake LLM making these calls in one round."""
    return {"tool_calls": list(items)}


def say(text: str) -> dict[str, Any]:
    return {"text": text}


def write(path: str, content: str) -> dict[str, Any]:
    return call("filesystem", action="write", path=path, content=content)


def run(command: str, **extra: Any) -> dict[str, Any]:
    return call("terminal", action="run", command=command, **extra)


def user_texts(body: Mapping[str, Any]) -> list[str]:
    """The user messages an LLM request carried, in order."""
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def frames_of(frames: Iterable[Mapping[str, Any]], type_: str) -> list[Mapping[str, Any]]:
    return [f for f in frames if f["type"] == type_]


def workspace(tmp_path: Path) -> Path:
    """A working folder outside navi's data folder, with a first tree in it."""
    work = tmp_path / "work"
    (work / "d").mkdir(parents=True)
    (work / "a.txt").write_text("alpha\n")
    (work / "c.txt").write_text("x marks\n")
    (work / "d" / "e.txt").write_text("to be removed\n")
    (work / "f.txt").write_text("to be moved\n")
    (work / "empty").mkdir()
    (work / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (work / "run.sh").chmod(0o755)
    return users_own(work.resolve())  # the user's own files


def with_block(tools: list[Tool], block: Tool) -> list[Tool]:
    return [*tools, block]


async def turn(h: Harness, sid: str, text: str, **kwargs: Any) -> list[dict[str, Any]]:
    """One message's frames up to its stream_end, then until its actor is idle (a
    rewind is refused while the run is still ending)."""
    frames: list[dict[str, Any]] = await h.turn(sid, text, **kwargs)
    actor = h.runtime.sessions.actor(sid)
    if actor is not None:
        await actor.idle.wait()
    return frames
