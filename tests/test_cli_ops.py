"""`navi run` as a real process among others: one database shared by several processes,
stop signals, background jobs, and odd input.

Rules as in tests/test_cli.py: real ``python -m navi_trio`` subprocesses, the fake LLM
in its own process on 127.0.0.1 (port 0), the DB under tmp_path, an absolute deadline
on every test, no sleeps: the tests wait for markers on the CLI's output, read PIDs
from FIFOs the tool's shell writes, and observe deaths through pidfds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from kvfake import PidWatch, is_gone
from test_cli import (
    ANSWER,
    DEADLINE,
    _one_error_line,
    _read_until,
    env,
    fake_llm,
    messages,
    navi,
)
from test_no_orphans import read_pids, spawner

from navi_trio.core.task_notes import NOTES_SCOPE
from navi_trio.store.sqlite import SQLiteStore

__all__ = ["env"]  # the fixture, imported for pytest


async def start_navi(*args: str, env: dict[str, str], cwd: Path) -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "navi_trio", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
    )  # fmt: skip


async def finish(proc: trio.Process) -> tuple[int, str, str]:
    """Wait for the exit; everything left on stdout and stderr."""
    assert proc.stdout is not None and proc.stderr is not None
    code = await proc.wait()
    out = err = b""
    while chunk := await proc.stdout.receive_some():
        out += chunk
    while chunk := await proc.stderr.receive_some():
        err += chunk
    return code, out.decode(), err.decode()


async def reap(proc: trio.Process) -> None:
    proc.kill()
    with trio.CancelScope(shield=True):
        await proc.wait()


def roles(saved: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in saved]


async def notes(db: Path, session_id: str) -> list[dict[str, Any]]:
    async with SQLiteStore.open(db) as store:
        return [value for _, value in await store.kv_list(NOTES_SCOPE, f"{session_id}:")]


# ------------------------------------------------------------------ one DB, many processes


async def test_runs_of_different_sessions_in_parallel_processes_all_succeed(
    env: dict[str, str], tmp_path: Path
) -> None:
    count = 6
    results: dict[str, Any] = {}
    async with fake_llm(tmp_path, [{"text": ANSWER}]) as url:

        async def one(sid: str) -> None:
            results[sid] = await navi("run", "--session", sid, "--llm-url", url, "hi",
                                      env=env, cwd=tmp_path)  # fmt: skip

        with trio.fail_after(DEADLINE * 2):
            async with trio.open_nursery() as nursery:
                for i in range(count):
                    nursery.start_soon(one, f"s-par-{i}")
    failed = {sid: done.err for sid, done in results.items() if done.code != 0}
    assert not failed, failed
    for sid in results:
        assert roles(await messages(tmp_path / "navi.db", sid)) == [
            ("user", "hi"), ("assistant", ANSWER)
        ]  # fmt: skip


async def test_a_second_process_on_a_running_session_is_told_it_is_busy(
    env: dict[str, str], tmp_path: Path
) -> None:
    replies = [{"text": "partial answer", "stall": True}, {"text": ANSWER}]
    async with fake_llm(tmp_path, replies) as url:
        first = await start_navi("run", "--session", "s-busy", "--llm-url", url, "hi",
                                 env=env, cwd=tmp_path)  # fmt: skip
        assert first.stdout is not None
        try:
            with trio.fail_after(DEADLINE):
                await _read_until(first.stdout, b"partial answer")  # it holds the session
                second = await navi("run", "--session", "s-busy", "--llm-url", url, "me too",
                                    env=env, cwd=tmp_path)  # fmt: skip
                first.send_signal(signal.SIGINT)
                code, _, err = await finish(first)
                third = await navi("run", "--session", "s-busy", "--llm-url", url, "now",
                                   env=env, cwd=tmp_path)  # fmt: skip
        finally:
            await reap(first)
    assert second.code == 1 and second.out == ""
    line = _one_error_line(second)
    assert "'s-busy' is busy" in line and f"pid {first.pid}" in line, line
    assert code == 130, err
    assert third.code == 0 and third.out == ANSWER + "\n", third  # released at exit
    saved = await messages(tmp_path / "navi.db", "s-busy")
    assert roles(saved) == [
        ("user", "hi"), ("assistant", "partial answer"), ("user", "now"), ("assistant", ANSWER)
    ]  # fmt: skip
    assert saved[1].get("stopped") is True


async def test_a_crashed_owner_does_not_block_its_session(
    env: dict[str, str], tmp_path: Path
) -> None:
    replies = [{"text": "partial answer", "stall": True}, {"text": ANSWER}]
    async with fake_llm(tmp_path, replies) as url:
        first = await start_navi("run", "--session", "s-crash", "--llm-url", url, "hi",
                                 env=env, cwd=tmp_path)  # fmt: skip
        assert first.stdout is not None
        try:
            with trio.fail_after(DEADLINE):
                await _read_until(first.stdout, b"partial answer")
                first.kill()  # SIGKILL: no clean-up, the lease row stays behind
                await first.wait()
                again = await navi("run", "--session", "s-crash", "--llm-url", url, "again",
                                   env=env, cwd=tmp_path)  # fmt: skip
        finally:
            await reap(first)
    assert again.code == 0 and again.out == ANSWER + "\n", again
    saved = await messages(tmp_path / "navi.db", "s-crash")
    assert roles(saved) == [("user", "hi"), ("user", "again"), ("assistant", ANSWER)]


# ------------------------------------------------------------------------- signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
async def test_a_stop_signal_kills_the_tools_processes_and_saves_the_stopped_turn(
    env: dict[str, str], tmp_path: Path, signum: int
) -> None:
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    call = {"action": "run", "command": spawner(fifo)}
    replies = [{"text": "Running it.", "tool_calls": [{"name": "terminal", "arguments": call}]},
               {"text": "never asked"}]  # fmt: skip
    async with fake_llm(tmp_path, replies) as url:
        proc = await start_navi("run", "--session", "s-sig", "--llm-url", url, "go",
                                env=env, cwd=tmp_path)  # fmt: skip
        try:
            with trio.fail_after(DEADLINE):
                pids = await read_pids(fifo, 4)  # the shell, its children, a grandchild
                watch = PidWatch(pids)
                try:
                    proc.send_signal(signum)
                    code, out, err = await finish(proc)
                    await watch.wait_exited()
                finally:
                    watch.close()
        finally:
            await reap(proc)
    assert code == 128 + signum, err
    assert "Traceback" not in err and signal.Signals(signum).name in err
    assert all(is_gone(p) for p in pids), pids
    saved = await messages(tmp_path / "navi.db", "s-sig")
    assert [m["role"] for m in saved] == ["user", "assistant", "tool"]
    assert saved[1]["tool_calls"][0]["name"] == "terminal"
    assert "stopped" in saved[2]["content"].lower()


# ------------------------------------------------------------------ background jobs


def background_call(command: str) -> dict[str, Any]:
    args = {"action": "run", "command": command, "background": True}
    return {"tool_calls": [{"name": "terminal", "arguments": args}]}


async def test_run_waits_for_its_background_task_and_keeps_its_note(
    env: dict[str, str], tmp_path: Path
) -> None:
    go = tmp_path / "go"
    os.mkfifo(go)
    replies = [background_call(f"read x < {go}; echo bg-result-$x"), {"text": "Started it."}]
    async with fake_llm(tmp_path, replies) as url:
        proc = await start_navi("run", "--session", "s-bg", "--llm-url", url, "go",
                                env=env, cwd=tmp_path)  # fmt: skip
        assert proc.stderr is not None
        try:
            with trio.fail_after(DEADLINE):
                err = await _read_until(proc.stderr, b"Ctrl-C to cancel them")
                assert proc.returncode is None  # still there: the job has not finished

                def release() -> None:
                    with open(go, "w", encoding="ascii") as f:
                        f.write("42\n")

                await trio.to_thread.run_sync(release)
                code, out, rest = await finish(proc)
        finally:
            await reap(proc)
    assert "waiting for 1 background task(s)" in err.decode()
    assert code == 0, err.decode() + rest
    assert out == "Started it.\n"
    (note,) = await notes(tmp_path / "navi.db", "s-bg")
    assert note["status"] == "completed" and "bg-result-42" in note["summary"]


async def test_ctrl_c_while_waiting_cancels_the_background_tasks(
    env: dict[str, str], tmp_path: Path
) -> None:
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    replies = [background_call(spawner(fifo)), {"text": "Started it."}]
    async with fake_llm(tmp_path, replies) as url:
        proc = await start_navi("run", "--session", "s-bgc", "--llm-url", url, "go",
                                env=env, cwd=tmp_path)  # fmt: skip
        assert proc.stderr is not None
        try:
            with trio.fail_after(DEADLINE):
                pids = await read_pids(fifo, 4)
                watch = PidWatch(pids)
                try:
                    await _read_until(proc.stderr, b"Ctrl-C to cancel them")
                    proc.send_signal(signal.SIGINT)
                    code, _, err = await finish(proc)
                    await watch.wait_exited()
                finally:
                    watch.close()
        finally:
            await reap(proc)
    assert code == 130, err
    assert all(is_gone(p) for p in pids), pids
    (note,) = await notes(tmp_path / "navi.db", "s-bgc")
    assert note["status"] == "cancelled"
