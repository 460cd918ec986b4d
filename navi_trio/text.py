"""Text that can always be stored, sent and printed: no lone surrogates, and short echoes.

JSON can carry a lone UTF-16 surrogate (``"\\ud800"``) and `json.loads` turns it into
a Python string that UTF-8 cannot encode: stored, it breaks every later request of the
session (the LLM request body, the client's terminal). `clean_text` replaces each lone
surrogate with U+FFFD (a surrogate pair kept as two code points becomes its character),
and `clean_json` does it everywhere in a parsed JSON value. Both return the very object
they were given when it is clean, so the common case costs a scan and no copy.

They are used where text enters navi: client frames (api/protocol.py refuses them),
LLM stream lines and tool-call arguments (llm/http.py), tool results
(tools/result.py), rows the store reads back (a session saved by an older version),
and the frame encoder, which must never fail.

`clip` cuts a value quoted in an error message, so that a client or a model cannot make
the message big.

`terminal_safe` is the one gate between text a model, a tool or another user controls
and a terminal: every terminal client (navi run, navi chat, navi sessions|tasks|schedule,
the rewind and fork texts) passes what it prints through it.
"""

from __future__ import annotations

import json
import re
from typing import Any

REPLACEMENT = "\ufffd"
CLIP_CHARS = 64  # characters of a value echoed in an error message

_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a surrogate code point (which UTF-8 cannot encode)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def clean_text(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD; `text` itself when clean."""
    if not has_lone_surrogate(text):
        return text
    # UTF-16 with surrogatepass keeps each surrogate as its own unit; decoding joins the
    # units that form a pair and replaces the ones that do not.
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def clean_json(value: Any) -> Any:
    """A parsed JSON value with `clean_text` applied to every string, keys included;
    `value` itself (not a copy) when nothing needed it."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        items = [clean_json(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return items
    if isinstance(value, dict):
        pairs = [(clean_json(k), clean_json(v)) for k, v in value.items()]
        if all(k2 is k and v2 is v for (k2, v2), (k, v) in zip(pairs, value.items(), strict=True)):
            return value
        return dict(pairs)
    return value


def loads_clean(text: str) -> Any:
    """`json.loads(text)`, cleaned (`clean_json`) unless the text cannot hold a surrogate:
    ASCII JSON (what the store writes) without a ``\\ud``/``\\uD`` escape."""
    value = json.loads(text)
    if text.isascii() and "\\ud" not in text and "\\uD" not in text:
        return value
    return clean_json(value)


def clip(text: str, limit: int = CLIP_CHARS) -> str:
    """`text` cut to `limit` characters and "…" when it was longer (and clean)."""
    text = clean_text(text)
    return text if len(text) <= limit else text[:limit] + "…"


TITLE_CHARS = 80  # a session's title: the first words of its first message

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]+")


def title_from(text: str, limit: int = TITLE_CHARS) -> str:
    """A one-line title from a message: its first non-blank line, control characters and
    bidi overrides removed, whitespace collapsed, cut to `limit` characters."""
    for line in text.splitlines():
        line = " ".join(_CONTROL.sub(" ", line).split())
        if line:
            return clip(line, limit)  # which replaces lone surrogates
    return ""


# What a terminal would act on instead of showing: the C0 controls but newline and tab
# (ESC starts every CSI and OSC sequence; CR and BS overwrite what was shown), DEL, the
# C1 controls (0x9b is a CSI on its own, 0x9d an OSC), the bidirectional marks,
# embeddings, overrides and isolates (text shown in another order than it is), and the
# line and paragraph separators.
_ACTS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """`text` as a terminal shows it and never acts on it: each control character (see
    `_ACTS`) written as a visible escape (ESC as ``\\x1b``, U+202E as ``\\u202e``);
    newlines and tabs kept, a CRLF made a newline, a CR at the very end dropped (half of
    a CRLF a stream split). `text` itself when there is nothing to change."""
    if _ACTS.search(text) is None:
        return text
    return _escaped(text.removesuffix("\r"))


def _escaped(text: str) -> str:
    """Every CRLF of `text` a newline, every other control character an escape."""
    return _ACTS.sub(_shown, text.replace("\r\n", "\n"))


class TerminalStream:
    """`terminal_safe` over a text that arrives in pieces (an answer's deltas): a CR that
    ends a piece waits for the next one, since a CRLF may be split between two pieces,
    and is shown as ``\\x0d`` when no newline follows it, as in a whole text."""

    def __init__(self) -> None:
        self._cr = False

    def feed(self, piece: str) -> str:
        if self._cr:
            piece, self._cr = "\r" + piece, False
        if piece.endswith("\r"):
            piece, self._cr = piece[:-1], True
        # Not terminal_safe: a CR still at its end (of "\r\r") is shown, not dropped.
        return _escaped(piece)

    def end(self) -> str:
        """What is still held when the text ends."""
        held, self._cr = self._cr, False
        return _escaped("\r") if held else ""


def usage_table(reply: dict[str, Any]) -> list[str]:
    """A usage reply as aligned lines: one per group, model and kind, then the total."""
    lines = reply.get("lines") or []
    if not lines:
        return ["no usage recorded" + (" since then" if reply.get("since") else "")]
    head = [
        str(reply.get("by", "key")),
        "model",
        "kind",
        "runs",
        "in",
        "out",
        "llm s",
        "tools s",
        "cost",
    ]
    rows = [[str(v["key"]), str(v["model"]), str(v["kind"]), *_amounts(v)] for v in lines]
    rows.append(["total", "", "", *_amounts(reply["totals"])])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(row: list[str]) -> str:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in pairs]
        return "  ".join(cells).rstrip()

    return [fmt(head), *(fmt(r) for r in rows)]


def _amounts(v: dict[str, Any]) -> list[str]:
    cost = v.get("cost")
    return [
        str(v["runs"]),
        str(v["tokens_in"]),
        str(v["tokens_out"]),
        f"{v['llm_sec']:.1f}",
        f"{v['tool_sec']:.1f}",
        "-" if cost is None else f"{cost:.4f}",
    ]
