"""`navi run` through a real `navi serve` subprocess (issue 8, "One path for every client").

The same `navi run` gives the same output with and without a daemon; with one, the run
is the daemon's (its session list and history show it), `background: true` jobs outlive
the `navi run` process and their note reaches the next turn after the client has gone,
and Ctrl-C stops the daemon's run. Failures are one line.

Rules: see tests/test_api_daemon.py (loopback, port 0, real processes, absolute
deadlines, no sleeps: the tests wait for output or frames); the daemon and the `navi`
commands are forked from the warm fork server (tests/navi_forks.py).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import navi_forks
import pytest
import trio
from test_api_daemon import SLOW, client
from test_cli import _read_until, fake_llm, forked, messages, unused_port
from test_cli_ops import background_call, finish, reap

from navi_trio.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow
DEADLINE = 90
ANSWER = "Hello from the fake model"


def _session(err: str) -> str:
    (line,) = [ln for ln in err.splitlines() if ln.startswith("session: ")]
    return line.removeprefix("session: ")


def _normal(out: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in json.loads(ln).items() if k != "session_id"}
            for ln in out.splitlines()]  # fmt: skip


def _joined(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frames without seqs, consecutive text deltas as one: how many deltas a reply
    comes in depends on how far the reader is behind (they merge while they wait)."""
    out: list[dict[str, Any]] = []
    for f in ({k: v for k, v in f.items() if k != "seq"} for f in frames):
        if out and f["type"] == out[-1]["type"] == "text_delta":
            out[-1] = {**f, "text": out[-1]["text"] + f["text"]}
        else:
            out.append(f)
    return out


async def test_the_same_run_gives_the_same_output_with_and_without_a_daemon(
    env: dict[str, str], tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE):
        async with fake_llm(tmp_path, [{"text": ANSWER}]) as llm:
            env = {**env, "OLLAMA_HOST": llm}
            # No daemon ever ran here (no local token): in this process.
            alone = await forked("run", "hi", env=env, cwd=tmp_path)
            alone_ev = await forked("run", "--events", "hi", env=env, cwd=tmp_path)
            # In this process too, the run is a session actor's (its log says so).
            traced = await forked("run", "hi", env={**env, "NAVI_DEBUG": "1"}, cwd=tmp_path)
            async with navi_forks.serving(env, llm) as proc:
                url = proc.url
                daemon = await forked("run", "--url", url, "hi", env=env, cwd=tmp_path)
                daemon_ev = await forked(
                    "run", "--url", url, "--events", "hi", env=env, cwd=tmp_path
                )
                listed = await forked("sessions", "--url", url, "--json", env=env, cwd=tmp_path)
                sid = _session(daemon.err)
                history = await forked("sessions", "history", sid, "--url", url, "--json",
                                       env=env, cwd=tmp_path)  # fmt: skip
                busy = [s for s in json.loads(listed.out)["sessions"] if s["busy"]]
            daemon_log = (await proc.stderr.receive_some(1 << 20)).decode()
    for done in (alone, alone_ev, daemon, daemon_ev):
        assert done.code == 0, done
        assert done.err_lines == [f"session: {_session(done.err)}"], done.err
    assert alone.out == daemon.out == traced.out == ANSWER + "\n"
    actor_log = f"navi_trio.core.session.session_actor: session {_session(traced.err)}: run started"
    assert actor_log in traced.err
    assert _joined(_normal(alone_ev.out)) == _joined(_normal(daemon_ev.out))
    seqs = [f["seq"] for f in _normal(daemon_ev.out)]  # a merged delta: its last seq
    assert seqs[0] >= 1 and seqs == sorted(set(seqs))
    # The daemon ran it: its session list and history show it (and not the embedded ones:
    # those are in the same DB, but the daemon lists them too, owned by "local").
    ids = {s["session_id"] for s in json.loads(listed.out)["sessions"]}
    assert {sid, _session(daemon_ev.err)} <= ids and not busy
    roles = [(m["role"], m["content"]) for m in json.loads(history.out)["messages"]]
    assert roles == [("user", "hi"), ("assistant", ANSWER)]
    assert f"session {sid}: run started" in daemon_log
    assert f"session {sid}: run ended: complete" in daemon_log


async def test_a_background_job_outlives_navi_run_and_its_note_reaches_the_next_turn(
    env: dict[str, str], tmp_path: Path
) -> None:
    go = tmp_path / "go"
    os.mkfifo(go)
    replies = [background_call(f"read x < {go}; echo bg-result-$x"), {"text": "Started it."},
               {"text": "Noted."}]  # fmt: skip
    data = Path(env["NAVI_DATA_DIR"])
    with trio.fail_after(DEADLINE):
        async with fake_llm(tmp_path, replies) as llm, navi_forks.serving(env, llm) as proc:
            first = await forked("run", "--url", proc.url, "--session", "s-bg", "hi",
                                 env=env, cwd=tmp_path)  # fmt: skip
            # navi run is gone; the job still waits on the fifo, in the daemon.
            assert first.code == 0 and first.out == "Started it.\n", first
            assert "waiting for" not in first.err
            async with client(proc.url, data) as c:
                await c.request({"type": "subscribe", "session_id": "s-bg", "last_seq": None})
                tasks = await c.request({"type": "tasks", "action": "list", "session_id": "s-bg"})
                assert [t["status"] for t in tasks["tasks"]] == ["running"]

                def release() -> None:
                    with open(go, "w", encoding="ascii") as f:
                        f.write("42\n")

                await trio.to_thread.run_sync(release)
                await c.until_type("task_update", session_id="s-bg", status="completed")
            second = await forked("run", "--url", proc.url, "--session", "s-bg", "thanks",
                                  env=env, cwd=tmp_path)  # fmt: skip
            assert second.code == 0 and second.out == "Noted.\n", second
            async with SQLiteStore.open(Path(env["NAVI_DB"])) as store:
                context = await store.load_context("s-bg")
    notes = [m["content"] for m in context if m.get("task_notes")]
    assert len(notes) == 1 and "bg-result-42" in notes[0], context


async def test_ctrl_c_stops_the_daemons_run(env: dict[str, str], tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with fake_llm(tmp_path, [SLOW]) as llm, navi_forks.serving(env, llm) as daemon:
            proc = await navi_forks.start("run", "--url", daemon.url, "--session", "s-stop",
                                          "hi", env=env, cwd=tmp_path)  # fmt: skip
            assert proc.stdout is not None
            try:
                out = await _read_until(proc.stdout, b"word3 ")
                proc.send_signal(signal.SIGINT)
                code, rest, err = await finish(proc)
            finally:
                await reap(proc)
    assert code == 130, err
    assert "Ctrl-C: stopping the run" in err and "Traceback" not in err
    text = (out.decode() + rest).strip()
    saved = await messages(Path(env["NAVI_DB"]), "s-stop")
    assert saved[-1]["role"] == "assistant" and saved[-1].get("stopped") is True
    assert saved[-1]["content"].strip() == text and text.startswith("word0 word1")


async def test_sessions_history_says_why_a_turn_failed(env: dict[str, str], tmp_path: Path) -> None:
    failing = {"text": "half an answer", "error_line": "the model fell over"}
    with trio.fail_after(DEADLINE):
        async with fake_llm(tmp_path, [failing]) as llm:
            env = {**env, "OLLAMA_HOST": llm}
            async with navi_forks.serving(env, llm) as proc:
                run = await forked("run", "--url", proc.url, "hi", env=env, cwd=tmp_path)
                sid = _session(run.err)
                history = await forked("sessions", "history", sid, "--url", proc.url,
                                       env=env, cwd=tmp_path)  # fmt: skip
    assert history.code == 0, history
    user, answer, why = history.out.splitlines()
    assert (user, answer) == ("user: hi", "assistant: half an answer")
    assert why.startswith("  ✗ error: ") and "the model fell over" in why


async def test_daemon_failures_are_one_line(env: dict[str, str], tmp_path: Path) -> None:
    closed = f"ws://127.0.0.1:{unused_port()}/"
    with trio.fail_after(DEADLINE):
        none = await forked("run", "--url", closed, "--token", "t", "hi", env=env, cwd=tmp_path)
        both = await forked("run", "--url", closed, "--db", "x.db", "hi", env=env, cwd=tmp_path)
        no_token = await forked("run", "--url", closed, "hi", env=env, cwd=tmp_path)
        async with fake_llm(tmp_path, [{"text": "x"}]) as llm, navi_forks.serving(env, llm) as proc:
            bad = await forked("run", "--url", proc.url, "--token", "wrong", "hi",
                               env=env, cwd=tmp_path)  # fmt: skip
            profile = await forked("run", "--url", proc.url, "--profile", "nope", "hi",
                                   env=env, cwd=tmp_path)  # fmt: skip
    for done, words in (
        (none, f"no daemon answers at {closed}"),
        (both, "--url runs the turn in the daemon"),
        (no_token, "no token: pass --token, set NAVI_TOKEN"),
        (bad, "unknown token"),
        (profile, "unknown profile 'nope'"),
    ):
        assert done.code == 1, done
        errors = [ln for ln in done.err_lines if ln.startswith("navi: error: ")]
        assert len(errors) == 1 and words in errors[0], done.err
        assert "Traceback" not in done.err and done.out == ""
