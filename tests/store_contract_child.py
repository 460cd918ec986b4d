"""Child process for tests/test_store_contract_crash.py: writes to a store until it is killed.

    python store_contract_child.py TARGET SESSION_ID loop      # append forever, "saved N"
    python store_contract_child.py TARGET SESSION_ID dangling  # tool calls, no results, "ready"
    python store_contract_child.py TARGET SESSION_ID dequeue   # queued -> history, "moved N"

TARGET is what NAVI_DB would hold: a file (SQLite) or a postgresql:// URL; the store is
opened the way the daemon opens it (`store.factory.open_store`). Each line is printed
and flushed only after the write returned (its commit is done). The loop's odd messages
are saved with ``durable=False``: committed without waiting for the flush, which must
survive a killed process all the same. The messages are those of
tests/store_writer_child.py (the SQLite store's own crash test).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import trio
from store_writer_child import DANGLING, numbered

from navi_trio.settings import Settings
from navi_trio.store.factory import open_store

QUEUED = 400  # messages the dequeue mode queues before it starts moving them
HOST = "contract-child"


def queued_message(n: int) -> dict[str, Any]:
    return {"text": f"queued {n}", "user_id": "local", "user_role": "user"}


async def loop(target: str, sid: str) -> None:
    async with open_store(Settings.from_env({"NAVI_DB": target})) as store:
        await store.create_session(sid, profile_id="default")
        n = 0
        while True:
            msg = numbered(n)
            await store.append(sid, messages=[msg], context=[msg], durable=n % 2 == 0)
            print(f"saved {n}", flush=True)
            n += 1


async def dangling(target: str, sid: str) -> None:
    async with open_store(Settings.from_env({"NAVI_DB": target})) as store:
        await store.create_session(sid, profile_id="default")
        await store.append(sid, messages=DANGLING[:2], context=DANGLING[:2])
        await store.append(sid, messages=DANGLING[2:], context=DANGLING[2:])
        print("ready", flush=True)
        await trio.sleep_forever()  # "running the wc tool" until SIGKILL


async def dequeue(target: str, sid: str) -> None:
    async with open_store(Settings.from_env({"NAVI_DB": target})) as store:
        await store.create_session(sid, profile_id="default")
        for n in range(QUEUED):
            await store.enqueue(sid, f"k{n}", queued_message(n), pid=os.getpid(), host=HOST)
        print("queued", flush=True)
        for n in range(QUEUED):
            user = {"role": "user", "content": f"queued {n}", "pad": "✓" * 2000}
            await store.append(sid, messages=[user], context=[user], dequeue=f"k{n}")
            print(f"moved {n}", flush=True)
        await trio.sleep_forever()


def main() -> None:
    target, sid, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    trio.run({"loop": loop, "dangling": dangling, "dequeue": dequeue}[mode], target, sid)


if __name__ == "__main__":
    main()
