"""Child process for tests/test_store_crash.py: writes to a store until it is killed.

    python store_writer_child.py DB_PATH SESSION_ID loop      # append forever, "saved N"
    python store_writer_child.py DB_PATH SESSION_ID dangling  # tool calls, no results, "ready"

Each line is printed and flushed only after the append returned (its commit is done).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import trio

from navi_trio.store import open_store

PAD = "ünïcode ✓ " * 200  # a few KB per message, so a kill often lands mid-write


def numbered(n: int) -> dict[str, Any]:
    """The message the loop writes as number n (the parent rebuilds it to compare)."""
    return {"role": "user" if n % 2 else "assistant", "content": f"message {n}", "n": n,
            "pad": PAD}  # fmt: skip


DANGLING: list[dict[str, Any]] = [
    {"role": "user", "content": "list and count"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call-ls", "name": "terminal", "arguments": {"cmd": "ls"}},
            {"id": "call-wc", "name": "terminal", "arguments": {"cmd": "wc -l *"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call-ls", "name": "terminal", "content": "a b"},
]


async def loop(path: Path, sid: str) -> None:
    async with open_store(path) as store:
        await store.create_session(sid, profile_id="default")
        n = 0
        while True:
            msg = numbered(n)
            await store.append(sid, messages=[msg], context=[msg])
            print(f"saved {n}", flush=True)
            n += 1


async def dangling(path: Path, sid: str) -> None:
    async with open_store(path) as store:
        await store.create_session(sid, profile_id="default")
        await store.append(sid, messages=DANGLING[:2], context=DANGLING[:2])
        await store.append(sid, messages=DANGLING[2:], context=DANGLING[2:])
        print("ready", flush=True)
        await trio.sleep_forever()  # "running the wc tool" until SIGKILL


def main() -> None:
    path, sid, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    trio.run({"loop": loop, "dangling": dangling}[mode], path, sid)


if __name__ == "__main__":
    main()
