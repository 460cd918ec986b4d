"""A writer killed with SIGKILL mid-save, on both stores: nothing half-stored, nothing it
reported saved is lost, and a queued message is in the queue or the history, never both.

The child (tests/store_contract_child.py) prints a line after each write returns; the
parent kills it with SIGKILL once it has read enough lines, then opens the store itself
(SQLite: the same file; PostgreSQL: the same database, the child's connections cut by
its death). The SQLite store's own version is tests/test_store_crash.py. Real processes
and the real clock; each test has an absolute timeout.
"""

from __future__ import annotations

import signal

import pytest
import trio
from pg_server import pg_url_with_schema as pg_url_with_schema
from store_backends import Backend
from store_contract_child import QUEUED, queued_message
from store_writer_child import DANGLING, numbered

from navi_trio.store.repair import PLACEHOLDER_CONTENT

pytestmark = pytest.mark.slow
TIMEOUT = 40


async def run_child_until(backend: Backend, sid: str, mode: str, enough: int) -> list[str]:
    """Start the child, read until `enough` lines, SIGKILL it, return every full line."""
    proc = await backend.run_child(sid, mode)
    assert proc.stdout is not None
    buffer = b""
    try:
        while buffer.count(b"\n") < enough:
            chunk = await proc.stdout.receive_some()
            if not chunk:
                pytest.fail(f"child exited early:\n{buffer.decode(errors='replace')}")
            buffer += chunk
    finally:
        proc.kill()  # SIGKILL: no finally blocks, no close, no commit of anything pending
        with trio.CancelScope(shield=True):
            await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    while chunk := await proc.stdout.receive_some():
        buffer += chunk
    complete = buffer[: buffer.rfind(b"\n") + 1]  # a kill mid-print leaves half a line
    return complete.decode().splitlines()


async def test_sigkilled_writer_keeps_every_message_it_reported_saved(backend: Backend) -> None:
    with trio.fail_after(TIMEOUT):
        lines = await run_child_until(backend, "crash-1", "loop", enough=60)
        assert all(line.startswith("saved ") for line in lines), lines
        last = int(lines[-1].split()[1])
        assert last >= 59
        async with backend.open() as store:
            messages = await store.load_messages("crash-1")
            context = await store.load_context("crash-1")
            stats = await store.stats()
    # Everything reported saved (durable or not) is there, intact and in order; beyond it
    # at most the one append whose commit finished before the kill but whose line did not.
    for rows in (messages, context):
        assert last + 1 <= len(rows) <= last + 2
        assert rows == [numbered(n) for n in range(len(rows))]
    assert stats["messages"] == len(messages) and stats["context"] == len(context)


async def test_writer_killed_between_tool_call_and_result_is_repaired_once(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        assert await run_child_until(backend, "crash-2", "dangling", enough=1) == ["ready"]
        async with backend.open() as store:
            first = await store.load_session("crash-2")
        async with backend.open() as store:  # a fresh open, as after a restart
            second = await store.load_session("crash-2")
            stats = await store.stats()
    placeholder = {"role": "tool", "tool_call_id": "call-wc", "name": "terminal",
                   "content": PLACEHOLDER_CONTENT, "repaired": True}  # fmt: skip
    assert first is not None and first.repaired == 2  # display history + context
    assert first.messages == first.context == [*DANGLING, placeholder]
    assert second is not None and second.repaired == 0
    assert (second.messages, second.context) == (first.messages, first.context)
    assert (stats["messages"], stats["context"]) == (4, 4)


async def test_a_writer_killed_while_dequeuing_leaves_each_message_in_one_place(
    backend: Backend,
) -> None:
    with trio.fail_after(TIMEOUT):
        lines = await run_child_until(backend, "crash-3", "dequeue", enough=40)
        assert lines[0] == "queued" and lines[-1].startswith("moved "), lines[-3:]
        moved = int(lines[-1].split()[1])
        async with backend.open() as store:
            history = [m["content"] for m in await store.load_messages("crash-3")]
            context = [m["content"] for m in await store.load_context("crash-3")]
            left = await store.adopt_queued("crash-3", pid=1, host="contract-child")
    # Every message reported moved is in the history; the rest are still queued, in
    # order; none is in both places, none in neither.
    assert moved + 1 <= len(history) <= moved + 2
    assert history == context == [f"queued {n}" for n in range(len(history))]
    assert [key for key, _ in left] == [f"k{n}" for n in range(len(history), QUEUED)]
    assert [row for _, row in left] == [queued_message(n) for n in range(len(history), QUEUED)]
