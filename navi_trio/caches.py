"""The one rule of navi's small caches: emptied when full.

Each holds what it made on a miss (a model's JSON head, a request template, a frame's
parts, a file's bytes, a tool's schema) under a bound on its entries. At the bound it
is emptied whole, not trimmed by age: nothing to keep in order on a hit, and whatever
is still in use is made again once, at its next miss.
"""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(cache: dict[K, V], key: K, value: V, most: int) -> V:
    """Put `value` under `key`, first emptying `cache` if it holds `most` entries; `value`."""
    if len(cache) >= most:
        cache.clear()
    cache[key] = value
    return value
