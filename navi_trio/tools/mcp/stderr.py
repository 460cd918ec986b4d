"""A stdio MCP server's stderr, into the log: one record per line, bounded.

A line is cut at `LINE_MAX` characters and at most `LINES_PER_MINUTE` lines are logged
per minute (the rest counted), so a chatty server can neither flood the log nor block
on a full pipe.
"""

from __future__ import annotations

import logging
import os
from typing import TextIO

import trio

LINE_MAX = 1000
LINES_PER_MINUTE = 300


def open_stderr_pipe() -> tuple[TextIO, trio.lowlevel.FdStream]:
    """(the write end for the child, the read end for `log_lines`)."""
    # Not inheritable: the spawn puts the write end on the child's fd 2 only, so no other
    # process started meanwhile holds it (EOF comes when the server's own tree is gone).
    r, w = os.pipe()
    return os.fdopen(w, "w"), trio.lowlevel.FdStream(r)


async def log_lines(stream: trio.lowlevel.FdStream, log: logging.Logger, name: str) -> None:
    """Log each line read from `stream` as ``[name] line`` (INFO), until EOF."""
    window_end = trio.current_time() + 60
    logged = dropped = 0
    buffer = b""
    async with stream:
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                chunk = b""
            if not chunk:
                break
            *lines, buffer = (buffer + chunk).split(b"\n")
            if len(buffer) > LINE_MAX * 4:  # a line with no end in sight: log its head
                lines.append(buffer)
                buffer = b""
            for raw in lines:
                now = trio.current_time()
                if now >= window_end:
                    if dropped:
                        log.warning(
                            "[%s] %d stderr lines not logged (over %d a minute)",
                            name,
                            dropped,
                            LINES_PER_MINUTE,
                        )
                    window_end, logged, dropped = now + 60, 0, 0
                if logged >= LINES_PER_MINUTE:
                    dropped += 1
                    continue
                text = raw.decode("utf-8", "replace").rstrip()
                if text:
                    logged += 1
                    extra = len(text) - LINE_MAX
                    cut = f" [… {extra} characters cut]" if extra > 0 else ""
                    log.info("[%s] %s%s", name, text[:LINE_MAX], cut)
    if dropped:
        log.warning(
            "[%s] %d stderr lines not logged (over %d a minute)", name, dropped, LINES_PER_MINUTE
        )
