"""An approval request's parsed command, in lines of plain text for every client.

A terminal line's approval request carries its simple commands (``parts``: each with its
decision, its path arguments and whether each is inside the workspace) and ``grant``:
in words, what an approval "for the session" (or "always") covers. The chat's card, the
MCP elicitation's question and the ACP permission request show the same lines.
"""

from __future__ import annotations

from typing import Any

LINE_MAX = 300  # characters of one part's line
PARTS_SHOWN = 16  # parts listed; the rest are counted

_MARK = {"allow": "✓", "ask": "?", "deny": "✗"}


def _cut(text: str, limit: int = LINE_MAX) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def part_lines(frame: dict[str, Any]) -> list[str]:
    """One line per part: its decision's mark, the command, the paths outside."""
    parts = frame.get("parts")
    parts = [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []
    lines = []
    for part in parts[:PARTS_SHOWN]:
        decision = str(part.get("decision", "?"))
        line = f"{_MARK.get(decision, '?')} {decision}: {part.get('text', '')}"
        paths = part.get("paths")
        outside = [
            str(p.get("path"))
            for p in (paths if isinstance(paths, list) else [])
            if isinstance(p, dict) and not p.get("inside")
        ]
        if outside:
            line += f" (outside the workspace: {', '.join(outside)})"
        lines.append(_cut(line))
    if len(parts) > PARTS_SHOWN:
        lines.append(f"… and {len(parts) - PARTS_SHOWN} more")
    return lines


def grant_line(frame: dict[str, Any], scope: str = "for the session") -> str:
    """What an approval with `scope` grants, in words ("" when the request says not)."""
    grant = frame.get("grant")
    return (
        _cut(f"{scope} allows: {grant}", 2 * LINE_MAX) if isinstance(grant, str) and grant else ""
    )
