"""The demo server's tools over stdio, written by hand without the SDK, for the tests in
which the server is only a stand-in (tests/test_mcp_client.py: caps, content, allow-lists,
restarts, approvals, background calls, shutdown, `navi mcp list`, `navi doctor`).

    python -S tests/mcp_servers/plain.py

It needs only the standard library, so it starts in tens of milliseconds where the SDK's
server (tests/mcp_servers/demo.py, which the protocol tests keep) spends most of a second
importing the SDK. Same tool names and answers as demo.py for echo, shout, fail, crash,
hang, media, spawn and huge; same ``EVENT`` lines on stderr; same ``DEMO_BIG_SCHEMA`` and
``DEMO_CRASH_ONCE``. Calls are answered one at a time, in order; ``hang`` answers only
its cancellation (``EVENT hang-cancelled <label>``).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any


def event(what: str) -> None:
    print(f"EVENT {what}", file=sys.stderr, flush=True)


def claim_wire() -> tuple[Any, Any]:
    """The protocol's input and output on private copies of fds 0 and 1 (not inherited),
    with /dev/null and stderr in their place, as the SDK's server does: what a tool starts
    cannot hold the pipe open, so the client sees EOF when this process dies."""
    wire_in, wire_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return open(wire_in, encoding="utf-8"), open(wire_out, "w", encoding="utf-8")


WIRE_IN, WIRE_OUT = claim_wire() if __name__ == "__main__" else (sys.stdin, sys.stdout)


def send(message: dict[str, Any]) -> None:
    WIRE_OUT.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    WIRE_OUT.flush()


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def schema(name: str, **properties: dict[str, Any]) -> dict[str, Any]:
    """An input schema as the SDK derives it from a function's parameters."""
    props = {k: {"title": k.title(), "type": "string", **v} for k, v in properties.items()}
    required = [k for k, v in properties.items() if "default" not in v]
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "title": f"{name}Arguments",
    }


def tools() -> dict[str, tuple[str, dict[str, Any]]]:
    """Each tool's description and input schema, in demo.py's order."""
    listed = {
        "echo": ("Return the text unchanged.", schema("echo", text={})),
        "fail": ("Always fails with the reason.", schema("fail", reason={})),
        "crash": ("Kill the server process at once (no answer).", schema("crash")),
        "hang": (
            "Never answers; says on stderr when it starts and when it is cancelled.",
            schema("hang", label={"default": ""}),
        ),
        "media": ("One block of each kind of content.", schema("media")),
        "spawn": ("Start a grandchild that leaves the process group; the pids, as JSON.",
                  schema("spawn")),
        "shout": ("Upper-case the text (a second tool for allow-lists).", schema("shout", text={})),
    }  # fmt: skip
    big = int(os.environ.get("DEMO_BIG_SCHEMA", "0"))
    if big:
        listed["huge"] = ("A tool whose schema is far too large.",
                          schema("huge", value={"description": "x" * big}))  # fmt: skip
    return listed


def echo(args: dict[str, Any]) -> list[dict[str, Any]]:
    event(f"echo {args['text']}")
    return [text(f"echo: {args['text']}")]


def crash(args: dict[str, Any]) -> list[dict[str, Any]]:
    marker = os.environ.get("DEMO_CRASH_ONCE")
    if marker:
        if os.path.exists(marker):
            return [text("survived: this is the restarted server")]
        open(marker, "w").close()
    event("crash")
    os._exit(3)


def media(args: dict[str, Any]) -> list[dict[str, Any]]:
    png = base64.b64encode(b"\x89PNG" + b"\0" * 12284).decode()
    notes = {"uri": "file:///tmp/notes.txt", "text": "the notes"}
    return [
        text("here is the media"),
        {"type": "image", "data": png, "mimeType": "image/png"},
        {"type": "audio", "data": base64.b64encode(b"RIFF" * 10).decode(), "mimeType": "audio/wav"},
        {"type": "resource", "resource": notes},
        {"type": "resource_link", "name": "report", "uri": "file:///x/report.pdf",
         "mimeType": "application/pdf"},
    ]  # fmt: skip


def spawn(args: dict[str, Any]) -> list[dict[str, Any]]:
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    return [text(json.dumps({"server": os.getpid(), "child": child.pid}))]


class ToolError(Exception):
    pass


def fail(args: dict[str, Any]) -> list[dict[str, Any]]:
    raise ToolError(f"failed on purpose: {args['reason']}")


CALLS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "echo": echo,
    "shout": lambda args: [text(args["text"].upper())],
    "huge": lambda args: [text(args["value"])],
    "fail": fail,
    "crash": crash,
    "media": media,
    "spawn": spawn,
}


def answer(rid: Any, method: str, params: dict[str, Any], hanging: dict[Any, str]) -> None:
    """Answer one request (a `hang` call is kept in `hanging` and answered never)."""
    if method == "initialize":
        result = {
            "protocolVersion": params["protocolVersion"],
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "demo", "version": "0"},
        }
        send({"id": rid, "result": result})
    elif method == "tools/list":
        listed = [{"name": n, "description": d, "inputSchema": s} for n, (d, s) in tools().items()]
        send({"id": rid, "result": {"tools": listed}})
    elif method == "tools/call" and params["name"] == "hang":
        hanging[rid] = params.get("arguments", {}).get("label", "")
        event(f"hang-started {hanging[rid]}")
    elif method == "tools/call":
        name, args = params["name"], params.get("arguments") or {}
        try:
            content = CALLS[name](args)
        except (ToolError, KeyError) as exc:
            send({"id": rid, "result": {"content": [text(str(exc))], "isError": True}})
        else:
            send({"id": rid, "result": {"content": content, "isError": False}})
    elif method == "ping":
        send({"id": rid, "result": {}})
    else:
        send({"id": rid, "error": {"code": -32601, "message": f"Method not found: {method}"}})


def main() -> None:
    hanging: dict[Any, str] = {}
    for line in WIRE_IN:
        request = json.loads(line)
        method, rid = request.get("method", ""), request.get("id")
        params = request.get("params") or {}
        if rid is not None and method:
            answer(rid, method, params, hanging)
        elif method == "notifications/cancelled" and params.get("requestId") in hanging:
            event(f"hang-cancelled {hanging.pop(params['requestId'])}")


if __name__ == "__main__":
    main()
