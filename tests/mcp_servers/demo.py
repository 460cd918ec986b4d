"""An MCP server for tests/test_mcp_client.py, written with the SDK's MCPServer.

    python tests/mcp_servers/demo.py            # stdio
    python tests/mcp_servers/demo.py --http [--port N]   # streamable HTTP on 127.0.0.1

Over HTTP the server binds port N (default 0: a free one) itself and prints
``PORT <n>`` on stdout once it listens, so the test never races for a port. What a
test must see the server do (a call started, a call cancelled) is written to stderr
as ``EVENT <what>`` lines.

Environment: ``DEMO_BIG_SCHEMA=<n>`` adds a tool whose input schema is over n
characters; ``DEMO_CRASH_ONCE=<file>`` makes ``crash`` exit only while <file> does not
exist (it creates it), so the restarted server answers; ``DEMO_ESCAPE=<file>`` starts,
at start-up, a ``sleep`` that leaves the process group with an empty environment (no
tag: only a cgroup holds it) and writes ``<server pid> <sleep pid>`` to <file>, once.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Annotated

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    AudioContent,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)
from pydantic import Field

server = MCPServer("demo")


def event(what: str) -> None:
    print(f"EVENT {what}", file=sys.stderr, flush=True)


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    event(f"echo {text}")
    return f"echo: {text}"


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ToolError(f"failed on purpose: {reason}")


@server.tool()
def crash() -> str:
    """Kill the server process at once (no answer)."""
    marker = os.environ.get("DEMO_CRASH_ONCE")
    if marker:
        if os.path.exists(marker):
            return "survived: this is the restarted server"
        open(marker, "w").close()
    event("crash")
    os._exit(3)


@server.tool()
async def hang(label: str = "") -> str:
    """Never answers; says on stderr when it starts and when it is cancelled."""
    event(f"hang-started {label}")
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        event(f"hang-cancelled {label}")
        raise
    return "unreachable"


@server.tool()
def media() -> list[TextContent | ImageContent | AudioContent | EmbeddedResource | ResourceLink]:
    """One block of each kind of content."""
    png = base64.b64encode(b"\x89PNG" + b"\0" * 12284).decode()
    return [
        TextContent(text="here is the media"),
        ImageContent(data=png, mime_type="image/png"),
        AudioContent(data=base64.b64encode(b"RIFF" * 10).decode(), mime_type="audio/wav"),
        EmbeddedResource(
            resource=TextResourceContents(uri="file:///tmp/notes.txt", text="the notes")
        ),
        ResourceLink(name="report", uri="file:///x/report.pdf", mime_type="application/pdf"),
    ]


@server.tool()
def spawn() -> str:
    """Start a grandchild that leaves the process group; the pids, as JSON."""
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    return json.dumps({"server": os.getpid(), "child": child.pid})


@server.tool()
def bomb() -> str:
    """Fork until a fork is refused (100 at most), end the children, fail with the count."""
    children: list[int] = []
    try:
        for _ in range(100):
            pid = os.fork()
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children.append(pid)
    except OSError:
        pass
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    raise ToolError(f"forked {len(children)} times, then a fork was refused or I stopped")


def escape(where: str) -> None:
    """A sleep out of the process group, without our environment (see DEMO_ESCAPE);
    once: a restarted server starts none."""
    if os.path.exists(where):
        return
    sleep = shutil.which("sleep") or "/bin/sleep"
    child = subprocess.Popen([sleep, "600"], start_new_session=True, env={})
    with open(where, "w", encoding="utf-8") as f:
        f.write(f"{os.getpid()} {child.pid}")


@server.tool()
def whoami(path: str = "") -> str:
    """The server's uid and gid, and whether it can read `path`, as JSON."""
    try:
        with open(path, "rb") as f:
            read = f"read {len(f.read())} bytes"
    except OSError as exc:
        read = exc.strerror or str(exc)
    return json.dumps({"uid": os.getuid(), "gid": os.getgid(), "read": read})


@server.tool()
def shout(text: str) -> str:
    """Upper-case the text (a second tool for allow-lists)."""
    return text.upper()


big = int(os.environ.get("DEMO_BIG_SCHEMA", "0"))
if big:

    @server.tool()
    def huge(
        value: Annotated[str, Field(description="x" * big)],
    ) -> str:
        """A tool whose schema is far too large."""
        return value


def main() -> None:
    if os.environ.get("DEMO_ESCAPE"):
        escape(os.environ["DEMO_ESCAPE"])
    if "--http" not in sys.argv:
        server.run()
        return
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 0
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    userver = uvicorn.Server(config)

    async def serve() -> None:
        sock.listen(16)
        print(f"PORT {port}", flush=True)
        await userver.serve(sockets=[sock])

    anyio.run(serve)


if __name__ == "__main__":
    main()
