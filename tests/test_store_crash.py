"""A writer killed with SIGKILL mid-save loses nothing it reported saved.

The child (tests/store_writer_child.py, run with sys.executable) prints ``saved N``
after each append returns. The parent kills it with SIGKILL and then opens the store
itself. Real processes and the real clock (no autojump); each test has an absolute
timeout.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trio

# pytest puts this folder (no __init__.py) on sys.path: the child's helpers import as is.
from store_writer_child import DANGLING, numbered

from navi_trio.store import open_store
from navi_trio.store.repair import PLACEHOLDER_CONTENT

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.slow
TIMEOUT = 20


async def run_child_until(db: Path, sid: str, mode: str, enough: int) -> list[str]:
    """Start the child, read until `enough` lines, SIGKILL it, return every full line.

    Lines the child wrote between our last read and the kill are drained too, so the
    last line returned is the last save the child reported.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(HERE / "store_writer_child.py"), str(db), sid, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # a traceback shows up in the lines we read
        env=env,
    )
    assert proc.stdout is not None
    buffer = b""
    try:
        while buffer.count(b"\n") < enough:
            chunk = await proc.stdout.receive_some()
            if not chunk:
                pytest.fail(f"child exited early:\n{buffer.decode(errors='replace')}")
            buffer += chunk
    finally:
        proc.kill()  # SIGKILL: no finally blocks, no close, no checkpoint in the child
        with trio.CancelScope(shield=True):
            await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    while chunk := await proc.stdout.receive_some():
        buffer += chunk
    complete = buffer[: buffer.rfind(b"\n") + 1]  # a kill mid-print leaves half a line
    return complete.decode().splitlines()


def integrity(db: Path) -> str:
    conn = sqlite3.connect(str(db))
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


async def test_sigkilled_writer_keeps_every_message_it_reported_saved(tmp_path: Path) -> None:
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        lines = await run_child_until(db, "crash-1", "loop", enough=50)
        assert all(line.startswith("saved ") for line in lines), lines
        last = int(lines[-1].split()[1])
        assert last >= 49
        assert await trio.to_thread.run_sync(integrity, db) == "ok"
        async with open_store(db) as store:
            messages = await store.load_messages("crash-1")
            context = await store.load_context("crash-1")
    # Everything reported saved is there, intact and in order; beyond it at most the
    # one append whose commit finished before the kill but whose line was not printed.
    for rows in (messages, context):
        assert last + 1 <= len(rows) <= last + 2
        assert rows == [numbered(n) for n in range(len(rows))]


async def test_writer_killed_between_tool_call_and_result_is_repaired_once(
    tmp_path: Path,
) -> None:
    db = tmp_path / "navi.db"
    with trio.fail_after(TIMEOUT):
        assert await run_child_until(db, "crash-2", "dangling", enough=1) == ["ready"]
        assert await trio.to_thread.run_sync(integrity, db) == "ok"
        async with open_store(db) as store:
            first = await store.load_session("crash-2")
        async with open_store(db) as store:  # a fresh open, as after a restart
            second = await store.load_session("crash-2")
            stats = await store.stats()
    placeholder = {
        "role": "tool",
        "tool_call_id": "call-wc",
        "name": "terminal",
        "content": PLACEHOLDER_CONTENT,
        "repaired": True,
    }
    assert first is not None and first.repaired == 2  # display history + context
    assert first.messages == first.context == [*DANGLING, placeholder]
    assert second is not None and second.repaired == 0
    assert (second.messages, second.context) == (first.messages, first.context)
    assert (stats["messages"], stats["context"]) == (4, 4)
