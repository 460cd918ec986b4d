"""What a tool returns, and how long text is cut to size.

The bottom of the tools layer: `procs`, `services` and `base` build on it.
"""

from __future__ import annotations

from typing import Any

import attrs

from navi_trio.text import clean_json, clean_text


def _clean_error(error: str | None) -> str | None:
    return None if error is None else clean_text(error)


def _clean_data(data: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if data is None else clean_json(data)


@attrs.frozen
class ToolResult:
    """What a tool returns. `content()` is what the model sees in the tool message.

    Every tool's text passes here, whoever made it (a process, an MCP or peer server,
    a file): a lone surrogate becomes U+FFFD before it can be stored or sent."""

    ok: bool
    output: str = attrs.field(default="", converter=clean_text)
    error: str | None = attrs.field(default=None, converter=_clean_error)
    # structured extras (task_id, exit code ...)
    data: dict[str, Any] | None = attrs.field(default=None, converter=_clean_data)

    def content(self) -> str:
        if self.ok:
            return self.output
        if self.output:
            return f"Error: {self.error}\n{self.output}"
        return f"Error: {self.error}"

    @classmethod
    def fail(cls, error: str, output: str = "", **data: Any) -> ToolResult:
        return cls(ok=False, output=output, error=error, data=data or None)

    @classmethod
    def success(cls, output: str, **data: Any) -> ToolResult:
        return cls(ok=True, output=output, data=data or None)


def cap_text(text: str, limit: int) -> str:
    """Head and tail of `text` within `limit` characters, with a marker in between."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[… {len(text) - limit} characters cut …]\n{text[-tail:]}"
