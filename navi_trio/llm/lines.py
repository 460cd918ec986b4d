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
    """Feed it a body's bytes as they arrive; it returns the lines each read ended.

    Linear in the body's length however the reads fall: the line under way grows in
    one buffer, and line ends are looked for only in the bytes a read brings (a long
    line in many small reads is neither copied nor searched again at every read).
    """

    __slots__ = ("_limit", "_part", "_cr")

    def __init__(self, limit: int = LINE_MAX_BYTES) -> None:
        self._limit = limit
        self._part = bytearray()  # the line under way: no line end in it
        self._cr = False  # the last read ended with CR: an LF first in the next is its end

    def feed(self, data: bytes) -> list[bytes]:
        """The lines `data` completes, without their line ends."""
        if not data:
            return []
        if self._cr:
            self._cr = False
            if data[0] == 0x0A:  # the LF of a CRLF cut between two reads
                data = data[1:]
        if b"\r" in data:
            self._cr = data[-1] == 0x0D
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        rest = lines.pop()
        part = self._part
        if not lines:  # no line end: the line under way grows
            if len(part) + len(rest) > self._limit:
                raise self._too_long(bytes(part[:800]) + rest[:800])
            part.extend(rest)
            return lines
        if part:
            lines[0] = bytes(part) + lines[0]
            part.clear()
        for line in lines:
            if len(line) > self._limit:
                raise self._too_long(line)
        if rest:
            if len(rest) > self._limit:
                raise self._too_long(rest)
            part.extend(rest)
        return lines

    def finish(self) -> list[bytes]:
        """At the end of the body: its last line, if it had no line end."""
        part = bytes(self._part)
        self._part.clear()
        return [part] if part else []

    def _too_long(self, line: bytes) -> LLMMalformedStreamError:
        start = clip(line[:800].decode("utf-8", "replace"), 200)
        return LLMMalformedStreamError(
            f"the LLM sent a line over {self._limit} bytes (the bound of one stream line); "
            f"it starts: {start!r}"
        )
