"""`navi run` as a real process among others: one database shared by several processes,
stop signals, background jobs, and odd input.

Rules as in tests/test_cli.py: real `navi` processes, forked from the warm fork server
(tests/navi_forks.py) but for the owner killed mid-run and the SIGHUP test (which reads
what Python says at its exit): ``python -m navi_trio``. The fake LLM on 127.0.0.1 (port
0) in the test's own trio loop, the DB under tmp_path, an absolute deadline on every
test, no sleeps: the tests wait for markers on the CLI's output, read PIDs from FIFOs
the tool's shell writes, and observe deaths through pidfds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import navi_forks
import pytest
import trio
from kvfake import PidWatch, is_gone
from test_cli import (
    ANSWER,
    DEADLINE,
    _one_error_line,
    _read_until,
    fake_llm_here,
    forked,
    messages,
)
from test_no_orphans import spawner
from unsandboxed import FULL_ARGS, unsandboxed_config

from navi_trio.cli import load_settings, main
from navi_trio.core.jobs import NOTES_SCOPE
from navi_trio.core.turn import Agent
from navi_trio.errors import ConfigError
from navi_trio.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow  # its tests start processes


async def start_navi(*args: str, env: dict[str, str], cwd: Path) -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "navi_trio", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
    )  # fmt: skip


async def finish(proc: trio.Process | navi_forks.Forked) -> tuple[int, str, str]:
    """Wait for the exit; everything left on stdout and stderr."""
    assert proc.stdout is not None and proc.stderr is not None
    code = await proc.wait()
    out = err = b""
    while chunk := await proc.stdout.receive_some():
        out += chunk
    while chunk := await proc.stderr.receive_some():
        err += chunk
    return code, out.decode(), err.decode()


PIDS_SEC = DEADLINE * 3 / 4  # the last quarter of the test's limit is for the stop itself


async def tool_pids(proc: trio.Process | navi_forks.Forked, fifo: Path, count: int) -> list[int]:
    """The pids the tool's spawner writes to `fifo`. A navi that exits first fails the
    test at once with what it printed: its tool never opens the FIFO then, and the read
    would wait to the test's limit saying nothing of why (seen once in CI). A tool that
    has not written them all within PIDS_SEC fails it with the pids so far and what navi
    printed (navi killed): a bare timeout would not say where the run stood."""
    pids: list[int] = []

    def read() -> None:
        with open(fifo, encoding="ascii") as f:
            while len(pids) < count:
                pids.append(int(f.readline()))

    async with trio.open_nursery() as nursery:

        async def wait_read() -> None:
            await trio.to_thread.run_sync(read, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait_read)
        with trio.move_on_after(PIDS_SEC):
            code, out, err = await finish(proc)
            raise AssertionError(f"navi exited ({code}) before its tool wrote its pids: {out}{err}")
        proc.kill()
        code, out, err = await finish(proc)
        raise AssertionError(
            f"{len(pids)} of the tool's {count} pids within {PIDS_SEC:g} s "
            f"(navi killed, {code}): {out}{err}"
        )
    return pids


async def reap(proc: trio.Process | navi_forks.Forked) -> None:
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
    async with fake_llm_here([{"text": ANSWER}]) as url:

        async def one(sid: str) -> None:
            results[sid] = await forked("run", "--session", sid, "--llm-url", url, "hi",
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
    replies: list[dict[str, Any]] = [{"text": "partial answer", "stall": True}, {"text": ANSWER}]
    async with fake_llm_here(replies) as url:
        first = await navi_forks.start("run", "--session", "s-busy", "--llm-url", url, "hi",
                                       env=env, cwd=tmp_path)  # fmt: skip
        assert first.stdout is not None
        try:
            with trio.fail_after(DEADLINE):
                await _read_until(first.stdout, b"partial answer")  # it holds the session
                second = await forked("run", "--session", "s-busy", "--llm-url", url, "me too",
                                      env=env, cwd=tmp_path)  # fmt: skip
                first.send_signal(signal.SIGINT)
                code, _, err = await finish(first)
                third = await forked("run", "--session", "s-busy", "--llm-url", url, "now",
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
    replies: list[dict[str, Any]] = [{"text": "partial answer", "stall": True}, {"text": ANSWER}]
    async with fake_llm_here(replies) as url:
        first = await start_navi("run", "--session", "s-crash", "--llm-url", url, "hi",
                                 env=env, cwd=tmp_path)  # fmt: skip
        assert first.stdout is not None
        try:
            with trio.fail_after(DEADLINE):
                await _read_until(first.stdout, b"partial answer")
                first.kill()  # SIGKILL: no clean-up, the lease row stays behind
                await first.wait()
                again = await forked("run", "--session", "s-crash", "--llm-url", url, "again",
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
    env = {**env, "NAVI_CONFIG": str(unsandboxed_config(tmp_path))}  # host pids: no sandbox
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    call = {"action": "run", "command": spawner(fifo)}
    replies: list[dict[str, Any]] = [
        {"text": "Running it.", "tool_calls": [{"name": "terminal", "arguments": call}]},
        {"text": "never asked"},
    ]
    async with fake_llm_here(replies) as url:
        proc = await navi_forks.start("run", "--session", "s-sig", "--llm-url", url,
                                      *FULL_ARGS, "go", env=env, cwd=tmp_path)  # fmt: skip
        try:
            with trio.fail_after(DEADLINE):
                pids = await tool_pids(proc, fifo, 4)  # the shell, its children, a grandchild
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


async def test_sighup_after_the_terminal_is_gone_still_stops_cleanly(
    env: dict[str, str], tmp_path: Path
) -> None:
    # A hang-up usually means the terminal went away: writing the rest of the answer
    # fails. The run must still stop cleanly, save the partial answer and exit 129.
    async with fake_llm_here([{"text": "partial answer", "stall": True}]) as url:
        proc = await start_navi("run", "--session", "s-hup", "--llm-url", url, "hi",
                                env=env, cwd=tmp_path)  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        try:
            with trio.fail_after(DEADLINE):
                await _read_until(proc.stdout, b"partial answer")
                await proc.stdout.aclose()  # nobody reads the output any more
                proc.send_signal(signal.SIGHUP)
                code = await proc.wait()
                err = b""
                while chunk := await proc.stderr.receive_some():
                    err += chunk
        finally:
            await reap(proc)
    assert code == 129, err.decode()
    assert b"Traceback" not in err and b"Exception ignored" not in err, err.decode()
    saved = await messages(tmp_path / "navi.db", "s-hup")
    assert saved[-1]["content"] == "partial answer" and saved[-1].get("stopped") is True


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
    async with fake_llm_here(replies) as url:
        proc = await navi_forks.start("run", "--session", "s-bg", "--llm-url", url, "go",
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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_a_stop_signal_while_waiting_cancels_the_background_tasks(
    env: dict[str, str], tmp_path: Path, signum: int
) -> None:
    env = {**env, "NAVI_CONFIG": str(unsandboxed_config(tmp_path))}  # host pids: no sandbox
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    replies = [background_call(spawner(fifo)), {"text": "Started it."}]
    async with fake_llm_here(replies) as url:
        proc = await navi_forks.start("run", "--session", "s-bgc", "--llm-url", url,
                                      *FULL_ARGS, "go", env=env, cwd=tmp_path)  # fmt: skip
        assert proc.stderr is not None
        try:
            with trio.fail_after(DEADLINE):
                pids = await tool_pids(proc, fifo, 4)
                watch = PidWatch(pids)
                try:
                    await _read_until(proc.stderr, b"Ctrl-C to cancel them")
                    proc.send_signal(signum)
                    code, _, err = await finish(proc)
                    await watch.wait_exited()
                finally:
                    watch.close()
        finally:
            await reap(proc)
    assert code == 128 + signum, err
    assert all(is_gone(p) for p in pids), pids
    (note,) = await notes(tmp_path / "navi.db", "s-bgc")
    assert note["status"] == "cancelled"


# ------------------------------------------------------------------ odd input, doctor


async def test_an_empty_or_overlong_session_id_is_refused_in_one_short_line(
    env: dict[str, str], tmp_path: Path
) -> None:
    done = await forked("run", "--session", "", "hi", env=env, cwd=tmp_path)
    assert done.code == 1 and "--session: the session id is empty" in _one_error_line(done)
    long_id = "x" * 5000 + "!"
    done = await forked("run", "--session", long_id, "hi", env=env, cwd=tmp_path)
    line = _one_error_line(done)
    assert done.code == 1 and "invalid session id 'xxxx" in line and "5001 characters" in line
    assert len(line) < 300, len(line)
    assert not (tmp_path / "navi.db").exists()  # refused before anything was created


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("127.0.0.1:11434", "http://127.0.0.1:11434"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("0.0.0.0:8080", "http://127.0.0.1:8080"),
        ("localhost", "http://localhost:11434"),
        ("[::]:9000", "http://[::1]:9000"),
        ("http://0.0.0.0:11434", "http://127.0.0.1:11434"),
        ("https://llm.example/v1", "https://llm.example/v1"),
    ],
)
def test_ollama_host_accepts_what_ollama_accepts(given: str, url: str) -> None:
    args = argparse.Namespace()
    assert load_settings(args, {"OLLAMA_HOST": given}).llm_url == url
    assert load_settings(argparse.Namespace(llm_url=given), {}).llm_url == url


@pytest.mark.parametrize("given", ["ftp://host", "host:99999", "host:port", "http://"])
def test_an_unusable_llm_url_is_refused_naming_it(given: str) -> None:
    with pytest.raises(ConfigError, match="OLLAMA_HOST") as refused:
        load_settings(argparse.Namespace(), {"OLLAMA_HOST": given})
    assert repr(given) in str(refused.value)


async def test_a_bare_ollama_host_reaches_the_server(env: dict[str, str], tmp_path: Path) -> None:
    async with fake_llm_here([{"text": ANSWER}]) as url:
        bare = url.removeprefix("http://")
        done = await forked("run", "hi", env={**env, "OLLAMA_HOST": bare}, cwd=tmp_path)
    assert done.code == 0 and done.out == ANSWER + "\n", done


def files(folder: Path) -> dict[str, tuple[int, int]]:
    """name -> (mtime ns, size) of every file in `folder`."""
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()}


async def test_doctor_reads_an_existing_database_without_writing_it(
    env: dict[str, str], tmp_path: Path
) -> None:
    db = tmp_path / "navi.db"
    down = "http://127.0.0.1:9"
    done = await forked("doctor", "--llm-url", down, "--json", env=env, cwd=tmp_path)
    report = json.loads(done.out)
    assert done.code == 0 and report["db"] == {"path": str(db), "existed": False, "ok": True,
                                               "tables": None}  # fmt: skip
    assert files(tmp_path) == {}
    async with SQLiteStore.open(db) as store:
        await store.create_session("s-1", profile_id="general")
    before = files(tmp_path)
    done = await forked("doctor", "--llm-url", down, env=env, cwd=tmp_path)
    assert done.code == 0 and "sessions=1" in done.out, done
    assert files(tmp_path) == before
    # While a writer has it open: the database and its log stay as they were (the -shm
    # is shared memory every reader marks; that is how WAL reads work).
    async with SQLiteStore.open(db) as store:
        await store.create_session("s-2", profile_id="general")
        before = files(tmp_path)
        done = await forked("doctor", "--llm-url", down, env=env, cwd=tmp_path)
        assert done.code == 0 and "sessions=2" in done.out, done
        after = files(tmp_path)
        assert {n: after[n] for n in ("navi.db", "navi.db-wal")} == {
            n: before[n] for n in ("navi.db", "navi.db-wal")
        }
    (tmp_path / "other.db").write_bytes(b"")  # an empty file is no navi database
    done = await forked("doctor", "--db", str(tmp_path / "other.db"), "--llm-url", down,
                        env=env, cwd=tmp_path)  # fmt: skip
    assert done.code == 1 and "not a navi database" in _one_error_line(done)


def test_an_internal_error_is_one_line_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def broken(*args: Any, **kwargs: Any) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(Agent, "_run_turn", broken)
    for name in ("NAVI_DEBUG", "OLLAMA_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NAVI_DB", str(tmp_path / "navi.db"))
    monkeypatch.setenv("NAVI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--llm-url", "http://127.0.0.1:9", "hi"]) == 1
    lines = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("session: ")]
    assert len(lines) == 1, lines
    assert "internal error: ValueError: boom" in lines[0] and "NAVI_DEBUG=1" in lines[0]
