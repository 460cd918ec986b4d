"""`LineSplitter`: an LLM stream's body bytes cut into lines, each line bounded.

Both wire dialects are lines: Ollama's NDJSON ends each with LF, server-sent events
end a line with LF, CRLF or CR. The splitter cuts at exactly those three, and nowhere
else: a JSON string may carry U+2028, U+2029 or U+0085 unescaped (llama.cpp's
encoder leaves them so), and a split there would break a valid line in two, as a
``str.splitlines`` split would. A CRLF cut between two reads is one line end.

A line is bounded in bytes (`LINE_MAX_BYTES`): a longer one, or a body that goes on
past the bound with no line end, is `LLMMalformedStreamError` naming the bound, before
more of it is kept. The bound is far over the largest real line (an Ollama tool call
arrives whole in one line; an answer is capped at ``answer_max_chars``).
"""

from __future__ import annotations

from navi_trio.errors import LLMMalformedStreamError
from navi_trio.text import clip

LINE_MAX_BYTES = 8 * 1024 * 1024


class LineSplitter:
    """Feed it a body's bytes as they arrive; it returns the lines each read ended."""

    __slots__ = ("_limit", "_part", "_cr")

    def __init__(self, limit: int = LINE_MAX_BYTES) -> None:
        self._limit = limit
        self._part = b""  # the line under way: no line end in it
        self._cr = False  # the last read ended with CR: an LF first in the next is its end

    def feed(self, data: bytes) -> list[bytes]:
        """The lines `data` completes, without their line ends."""
        if self._cr:
            self._cr = False
            if data[:1] == b"\n":
                data = data[1:]
        if self._part:
            data = self._part + data
        if b"\r" in data:
            self._cr = data[-1:] == b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        self._part = lines.pop()
        if len(self._part) > self._limit:
            raise self._too_long(self._part)
        for line in lines:
            if len(line) > self._limit:
                raise self._too_long(line)
        return lines

    def finish(self) -> list[bytes]:
        """At the end of the body: its last line, if it had no line end."""
        part, self._part = self._part, b""
        return [part] if part else []

    def _too_long(self, line: bytes) -> LLMMalformedStreamError:
        start = clip(line[:800].decode("utf-8", "replace"), 200)
        return LLMMalformedStreamError(
            f"the LLM sent a line over {self._limit} bytes (the bound of one stream line); "
            f"it starts: {start!r}"
        )
