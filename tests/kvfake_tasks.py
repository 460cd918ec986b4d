"""An in-memory async KV store for the background-task tests (no threads, so it works
with the autojump clock). Values go through JSON like in the real store, and every
call checkpoints, so concurrent writers really interleave."""

from __future__ import annotations

import json
from typing import Any

import trio


class MemoryKV:
    def __init__(self) -> None:
        self.data: dict[tuple[str, str], str] = {}
        self.fail_scopes: set[str] = set()  # kv_set/kv_delete in these scopes raise

    async def kv_get(self, scope: str, key: str) -> Any | None:
        await trio.lowlevel.checkpoint()
        raw = self.data.get((scope, key))
        return None if raw is None else json.loads(raw)

    async def kv_set(self, scope: str, key: str, value: Any) -> None:
        await trio.lowlevel.checkpoint()
        if scope in self.fail_scopes:
            raise OSError(f"kv_set({scope!r}) failed on purpose")
        self.data[(scope, key)] = json.dumps(value)

    async def kv_delete(self, scope: str, key: str) -> None:
        await trio.lowlevel.checkpoint()
        if scope in self.fail_scopes:
            raise OSError(f"kv_delete({scope!r}) failed on purpose")
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
