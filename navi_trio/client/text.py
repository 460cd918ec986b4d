"""Text shaped for the terminal: one line of it, and the finished Markdown blocks."""

from __future__ import annotations

from navi_trio.text import terminal_safe

ARGS_MAX = 60
RESULT_MAX = 100


def one_line(text: str, limit: int = 0) -> str:
    flat = terminal_safe(" ".join(str(text).split()))
    if limit and len(flat) > limit:
        return flat[: limit - 1] + "…"
    return flat


def split_blocks(buffer: str) -> tuple[str, str]:
    """(finished Markdown blocks, the rest): cut at the last blank line outside a fence."""
    in_fence = False
    cut = pos = 0
    lines = buffer.split("\n")
    for line in lines[:-1]:  # the last piece has no newline yet
        pos += len(line) + 1
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not stripped and not in_fence:
            cut = pos
    return buffer[:cut], buffer[cut:]
