"""What a tool returns, and how long text is cut to size.

The bottom of the tools layer: `procs`, `services` and `base` build on it.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class ToolResult:
    """What a tool returns. `content()` is what the model sees in the tool message."""

    ok: bool
    output: str = ""
    error: str | None = None
    data: dict[str, Any] | None = None  # structured extras (task_id, exit code ...)

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
