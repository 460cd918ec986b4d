"""A scripted MCP server over stdio, written by hand (newline-delimited JSON-RPC), for
the failures a well-behaved SDK server cannot show: tests/test_mcp_failures.py.

    python tests/mcp_servers/scripted.py

Environment:

- ``SCRIPT_PLAN``: what each start does, comma-separated (the last one repeats):
  ``silent`` (reads every request, answers none), ``no-list`` (answers ``initialize``,
  never ``tools/list``), ``fail`` (exits at once with code 1), ``ready-crash``
  (answers both, then exits with code 3 at its first call: a crash the client meets once
  it is surely ready, never one racing its ``tools/list`` answer), ``ready`` (answers
  both, and calls);
- ``SCRIPT_COUNTER``: a file counting the starts (the plan's index), kept by the server;
- ``SCRIPT_TOOLS``: the ``tools/list`` result's tools, as JSON (default: one ``echo``).

What the server got is written to stderr as ``EVENT <what>`` lines; end of input ends it
(``EVENT end of input``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ECHO = {
    "name": "echo",
    "description": "Return the text.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
}


def event(what: str) -> None:
    print(f"EVENT {what}", file=sys.stderr, flush=True)


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def this_start() -> tuple[int, str]:
    """(which start this is, from 1; what it does)."""
    counter = Path(os.environ["SCRIPT_COUNTER"])
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    plan = os.environ.get("SCRIPT_PLAN", "ready").split(",")
    return n, plan[min(n, len(plan)) - 1]


def main() -> None:
    n, mode = this_start()
    event(f"start {n} {mode}")
    if mode == "fail":
        sys.exit(1)
    tools = json.loads(os.environ.get("SCRIPT_TOOLS", "null")) or [ECHO]
    for line in sys.stdin:
        request = json.loads(line)
        method, rid = request.get("method"), request.get("id")
        event(f"got {method}")
        if rid is None or mode == "silent":
            continue  # a notification, or a server that answers nothing
        if method == "initialize":
            result = {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "scripted", "version": "0"},
            }
            send({"id": rid, "result": result})
        elif method == "tools/list":
            if mode == "no-list":
                continue
            send({"id": rid, "result": {"tools": tools}})
        elif method == "tools/call" and mode == "ready-crash":
            event("crash")
            sys.exit(3)
        elif method == "tools/call":
            text = request["params"].get("arguments", {}).get("text", "")
            send({"id": rid, "result": {"content": [{"type": "text", "text": f"echo: {text}"}]}})
        else:
            send({"id": rid, "error": {"code": -32601, "message": f"no method {method}"}})
    event("end of input")


if __name__ == "__main__":
    main()
