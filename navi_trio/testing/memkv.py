"""An in-memory async KV store with the store's kv interface, for unit tests and benches.

No threads, so it works under the autojump clock. Values go through JSON like in the
real store, and every call checkpoints, so concurrent read-modify-write sequences
really interleave. `fail_scopes` makes writes to those scopes raise.
"""

from __future__ import annotations

import json
from typing import Any

import trio


class MemoryKV:
    def __init__(self) -> None:
        self.data: dict[tuple[str, str], str] = {}
        self.fail_scopes: set[str] = set()

    def _check(self, op: str, scope: str) -> None:
        if scope in self.fail_scopes:
            raise OSError(f"{op}({scope!r}) failed on purpose")

    async def kv_get(self, scope: str, key: str) -> Any | None:
        await trio.lowlevel.checkpoint()
        raw = self.data.get((scope, key))
        return None if raw is None else json.loads(raw)

    async def kv_set(self, scope: str, key: str, value: Any, *, durable: bool = True) -> None:
        await trio.lowlevel.checkpoint()
        self._check("kv_set", scope)
        self.data[(scope, key)] = json.dumps(value)

    async def kv_delete(self, scope: str, key: str) -> None:
        await trio.lowlevel.checkpoint()
        self._check("kv_delete", scope)
        self.data.pop((scope, key), None)

    async def kv_list(self, scope: str, prefix: str = "") -> list[tuple[str, Any]]:
        await trio.lowlevel.checkpoint()
        return sorted(
            (key, json.loads(raw))
            for (s, key), raw in self.data.items()
            if s == scope and key.startswith(prefix)
        )

    def keys(self, scope: str) -> list[str]:
        return sorted(key for s, key in self.data if s == scope)
