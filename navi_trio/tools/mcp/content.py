"""What the model reads of an MCP tool result: text as it is, everything else as a
short textual reference (``[image/png, 12 KB]``, ``[resource file:///x]``). Duck-typed
on the blocks' ``type`` field, so the SDK need not be imported.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def _size(b64: str) -> str:
    """The decoded size of base64 data, readable."""
    n = len(b64) * 3 // 4 - b64[-2:].count("=") if b64 else 0
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{round(n / 1024)} KB"
    return f"{n / (1024 * 1024):.1f} MB"


def block_text(block: Any) -> str:
    """One content block as text."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{block.mime_type or kind}, {_size(block.data or '')}]"
    if kind == "resource":
        res = block.resource
        text = getattr(res, "text", None)
        mime = f" ({res.mime_type})" if getattr(res, "mime_type", None) else ""
        if isinstance(text, str):
            return f"[resource {res.uri}{mime}]\n{text}"
        return f"[resource {res.uri}{mime}, {_size(getattr(res, 'blob', '') or '')}]"
    if kind == "resource_link":
        mime = f" ({block.mime_type})" if getattr(block, "mime_type", None) else ""
        return f"[resource {block.uri}{mime}]"
    return f"[{kind or type(block).__name__} content]"


def result_text(content: Iterable[Any], structured: Any = None) -> str:
    """The blocks of a CallToolResult joined by newlines; the structured result when
    there is no content at all."""
    parts = [block_text(b) for b in content]
    if not parts and structured is not None:
        return json.dumps(structured, ensure_ascii=False)
    return "\n".join(parts)
