"""Regexes compiled on their first use, not when their module is imported.

Compiling a pattern costs from a tenth of a millisecond to several (a case-blind one
with Unicode classes). A module whose patterns only read what a model answered need
not pay for them while `navi run` starts: `LazyPattern` compiles on the first call of
one of its methods, once, and keeps the compiled pattern.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any


class LazyPattern:
    """`re.compile(pattern, flags)` on first use; the methods of `re.Pattern` we use."""

    __slots__ = ("_compiled", "flags", "pattern")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern = pattern
        self.flags = flags
        self._compiled: re.Pattern[str] | None = None

    @property
    def compiled(self) -> re.Pattern[str]:
        if self._compiled is None:
            self._compiled = re.compile(self.pattern, self.flags)
        return self._compiled

    def search(self, text: str) -> re.Match[str] | None:
        return self.compiled.search(text)

    def match(self, text: str) -> re.Match[str] | None:
        return self.compiled.match(text)

    def fullmatch(self, text: str) -> re.Match[str] | None:
        return self.compiled.fullmatch(text)

    def split(self, text: str) -> list[str | Any]:
        return self.compiled.split(text)

    def sub(self, repl: str | Callable[[re.Match[str]], str], text: str) -> str:
        return self.compiled.sub(repl, text)
