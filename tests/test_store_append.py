"""An append serialises a message that goes to both lists once; both rows are right.

Real SQLite file under tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from navi_trio.store import _schema
from navi_trio.store.sqlite import SQLiteStore


async def test_a_message_in_both_lists_is_serialised_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dumped: list[str] = []
    real_dump = _schema._dump

    def counting_dump(value: Any, what: str) -> str:
        dumped.append(what)
        return real_dump(value, what)

    monkeypatch.setattr(_schema, "_dump", counting_dump)
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        await store.create_session("s1", profile_id="p")
        shared = {"role": "assistant", "content": "hi", "tool_calls": [{"name": "echo"}]}
        note = {"role": "system", "content": "a note", "keep": True}  # context only
        shown = {"role": "assistant", "content": "shown only"}  # display only
        await store.append("s1", messages=[shared, shown], context=[note, shared])
        assert dumped == ["messages[0]", "messages[1]", "context[0]"]
        assert await store.load_messages("s1") == [shared, shown]
        assert await store.load_context("s1") == [note, shared]
