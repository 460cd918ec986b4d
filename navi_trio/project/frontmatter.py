"""The front matter of a ``SKILL.md``: a strict reader of the YAML subset skills use.

No YAML library is a dependency of navi (PyYAML comes only with the docs' tools), and
a skill's front matter needs little: top-level ``key: value`` lines, values plain,
single- or double-quoted, or a ``|`` / ``>`` block; a plain value may go on over
indented lines (folded with spaces, as YAML does). A key with an empty value may hold
an indented block (``metadata:`` with its own keys, a list): kept as its raw text,
never interpreted. Anything else (flow mappings as top-level lines, anchors, tags,
several documents) is a `FrontMatterError` naming the line and what was expected.
"""

from __future__ import annotations

import re

FENCE = "---"
_KEY = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*):(?:\s+(.*))?$")
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "/": "/"}


class FrontMatterError(ValueError):
    """Front matter navi cannot read; the message names the line and the problem."""


def split(text: str) -> tuple[dict[str, str], str] | None:
    """(the front matter's keys, the body after it), or None when the text does not
    start with a ``---`` line. `FrontMatterError` when it starts one but is not the
    subset described above."""
    lines = text.replace("\r\n", "\n").removeprefix("\ufeff").split("\n")
    if not lines or lines[0].rstrip() != FENCE:
        return None
    for end in range(1, len(lines)):
        if lines[end].rstrip() == FENCE:
            break
    else:
        raise FrontMatterError("the front matter has no closing '---' line")
    return parse(lines[1:end], first_line=2), "\n".join(lines[end + 1 :])


def parse(lines: list[str], *, first_line: int = 1) -> dict[str, str]:
    """The keys of front matter `lines` (line numbers in errors start at `first_line`)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line, number = lines[i], first_line + i
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] in " \t":
            raise FrontMatterError(f"line {number}: indented, but no key above it takes a block")
        match = _KEY.match(line.rstrip())
        if match is None:
            raise FrontMatterError(
                f"line {number}: expected 'key: value' (navi reads a subset of YAML: "
                "plain, quoted or | > block values)"
            )
        key, raw = match.group(1), (match.group(2) or "").strip()
        if key in out:
            raise FrontMatterError(f"line {number}: the key {key!r} is given twice")
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i][0] in " \t"):
            block.append(lines[i])
            i += 1
        out[key] = _value(raw, block, number)
    return out


def _value(raw: str, block: list[str], number: int) -> str:
    if raw in ("|", ">", "|-", ">-", "|+", ">+"):
        kept = _dedent(block)
        text = "\n".join(kept) if raw[0] == "|" else _fold(kept)
        return text.rstrip("\n") + ("\n" if raw[1:] in ("", "+") and text else "")
    if raw.startswith(("&", "*", "!", "{", "[")) and raw not in ("[]", "{}"):
        raise FrontMatterError(
            f"line {number}: anchors, tags and flow collections are not read; quote the value"
        )
    if raw.startswith('"'):
        return _double(raw, block, number)
    if raw.startswith("'"):
        return _single(raw, block, number)
    if not raw:
        return "\n".join(block).strip("\n")  # a nested block, kept as it is
    raw = _strip_comment(raw)
    more = [b.strip() for b in block if b.strip()]
    return " ".join([raw, *more])


def _dedent(block: list[str]) -> list[str]:
    indents = [len(b) - len(b.lstrip()) for b in block if b.strip()]
    cut = min(indents, default=0)
    return [b[cut:] for b in block]


def _fold(lines: list[str]) -> str:
    out: list[str] = []
    para: list[str] = []
    for line in lines:
        if line.strip():
            para.append(line.strip())
        else:
            if para:
                out.append(" ".join(para))
                para = []
            out.append("")
    if para:
        out.append(" ".join(para))
    return "\n".join(out)


def _strip_comment(raw: str) -> str:
    at = raw.find(" #")
    return raw[:at].rstrip() if at >= 0 else raw


def _only_comment(rest: str) -> bool:
    rest = rest.strip()
    return not rest or rest.startswith("#")


def _joined(raw: str, block: list[str]) -> str:
    return " ".join([raw, *(b.strip() for b in block if b.strip())])


def _double(raw: str, block: list[str], number: int) -> str:
    text = _joined(raw, block)
    out: list[str] = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == '"':
            if not _only_comment(text[i + 1 :]):
                raise FrontMatterError(f"line {number}: text after the closing quote")
            return "".join(out)
        if ch == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt not in _ESCAPES:
                raise FrontMatterError(f"line {number}: the escape '\\{nxt}' is not read")
            out.append(_ESCAPES[nxt])
            i += 2
            continue
        out.append(ch)
        i += 1
    raise FrontMatterError(f"line {number}: the double quote is not closed")


def _single(raw: str, block: list[str], number: int) -> str:
    text = _joined(raw, block)
    out: list[str] = []
    i = 1
    while i < len(text):
        if text[i] == "'":
            if text[i + 1 : i + 2] == "'":
                out.append("'")
                i += 2
                continue
            if not _only_comment(text[i + 1 :]):
                raise FrontMatterError(f"line {number}: text after the closing quote")
            return "".join(out)
        out.append(text[i])
        i += 1
    raise FrontMatterError(f"line {number}: the single quote is not closed")
