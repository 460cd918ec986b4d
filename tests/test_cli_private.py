"""One path for every command: with no daemon answering, a `navi` command serves itself
privately and speaks the same WebSocket protocol to that server.

- the private server (cli/serve.py `serve_privately`) knows one user, the person at the
  shell as the local admin, by a token made for the process: no user of the store gets
  in, not even an admin;
- every verb (`navi run`, `sessions`, `tasks`, `schedule`, `rewind`, `fork`, `compact`,
  `mcp serve`) with no daemon connects to it (its log says so with NAVI_DEBUG=1);
- `navi sessions` and `navi tasks` work on the local database with no daemon, and
  `navi schedule add` is refused there (a schedule runs as a user of a daemon);
- `navi compact` goes to the daemon when one answers, and is told a session is busy
  when another process runs it.

Rules: real `navi` processes where the command is the point (forked from the warm fork
server, tests/navi_forks.py; `navi mcp serve`: ``python -m navi_trio``), real WebSocket
connections on 127.0.0.1 (port 0), the fake LLM on 127.0.0.1, the DB under tmp_path, an
absolute deadline on every test, no sleeps (the busy test waits for the partial answer
on the first process's stdout).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import navi_forks
import pytest
import trio
from test_cli import ANSWER, _one_error_line, _read_until, fake_llm, forked
from test_cli_ops import finish, reap
from test_mcp_serve import mcp_serve

from navi_trio import wire
from navi_trio.api.daemon_client import open_daemon
from navi_trio.cli.common import config_source
from navi_trio.cli.serve import serve_privately
from navi_trio.errors import RemoteError
from navi_trio.settings import Settings
from navi_trio.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow
DEADLINE = 90


async def test_a_private_server_knows_only_its_own_token_and_acts_as_the_local_admin(
    tmp_path: Path,
) -> None:
    db = tmp_path / "navi.db"
    async with SQLiteStore.open(db) as store:
        await store.create_user("root", "root-token", role="admin")
    settings = Settings.from_env({}, db_path=db, data_dir=tmp_path / "data")
    with trio.fail_after(DEADLINE):
        async with serve_privately(settings, config_source(settings)) as private:
            assert private.url.startswith("ws://127.0.0.1:") and private.token.startswith("navi_")
            async with open_daemon(private.url, private.token) as daemon:
                assert daemon.welcome["user"] == {"name": "local", "role": "admin"}
            for token in ("root-token", private.token + "x", ""):
                with pytest.raises(RemoteError) as refused:
                    async with open_daemon(private.url, token):
                        pass
                assert refused.value.code == "unauthorized", token
    assert "root-token" not in repr(private)


def _files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


async def test_a_private_servers_token_is_kept_in_its_memory_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Nothing another account (or a tool of this one) could read holds it: no file of the
    # data folder or the database (nor its hash, as a user's token would be kept), no
    # environment variable a child would inherit, no log line.
    caplog.set_level(logging.DEBUG)
    settings = Settings.from_env({}, db_path=tmp_path / "navi.db", data_dir=tmp_path / "data")
    with trio.fail_after(DEADLINE):
        async with serve_privately(settings, config_source(settings)) as private:
            async with open_daemon(private.url, private.token) as daemon:
                await daemon.request(wire.sessions_list())
            written = await trio.to_thread.run_sync(_files, tmp_path)
    secret = private.token.encode()
    hashed = hashlib.sha256(secret)
    assert tmp_path / "navi.db" in written
    for path, data in written.items():
        assert secret not in data, path
        assert hashed.hexdigest().encode() not in data and hashed.digest() not in data, path
    assert not any(private.token in value for value in os.environ.values())
    assert "user local (admin) connected" in caplog.text and private.token not in caplog.text
    assert private.token not in repr(private)


# Each verb with no daemon, then what it printed: its connection to the private server is
# in its debug log (the server's own line), beside the verb's usual answer.
VERBS: list[tuple[tuple[str, ...], int, str]] = [
    (("sessions",), 0, "s-verb"),
    (("tasks",), 0, "no tasks"),
    (("approvals",), 0, "no approvals granted"),
    (("schedule", "list"), 0, "no schedules"),
    (("rewind", "--session", "s-verb", "--list"), 0, "hi"),
    (("fork", "--session", "s-verb", "--new", "s-fork"), 0, "forked s-verb into s-fork"),
    (("compact", "--session", "s-verb"), 1, "nothing to compact"),
]


async def test_every_verb_without_a_daemon_connects_to_its_private_server(
    env: dict[str, str], tmp_path: Path
) -> None:
    debug = {**env, "NAVI_DEBUG": "1"}
    with trio.fail_after(DEADLINE):
        async with fake_llm(tmp_path, [{"text": ANSWER}]) as url:
            ran = await forked("run", "--session", "s-verb", "--llm-url", url, "hi",
                               env=debug, cwd=tmp_path)  # fmt: skip
            done = []
            for verb, code, said in VERBS:
                llm = ("--llm-url", url) if verb[0] == "compact" else ()  # never Ollama's
                done.append((verb, code, said, await forked(*verb, *llm, env=debug, cwd=tmp_path)))
    assert ran.code == 0 and ran.out == ANSWER + "\n", ran
    for verb, code, said, got in [(("run",), 0, ANSWER, ran), *done]:
        assert got.code == code, (verb, got)
        assert said in got.out + got.err, (verb, got)
        assert "user local (admin) connected" in got.err, (verb, got.err)
        assert "navi_trio.api.connection: connection 127.0.0.1:" in got.err, (verb, got.err)
    assert "session s-verb: message from local runs" in ran.err
    assert not (Path(env["NAVI_DATA_DIR"]) / "local-token").exists()  # nothing on disk


async def test_sessions_and_tasks_without_a_daemon_read_the_local_database(
    env: dict[str, str], tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE):
        async with fake_llm(tmp_path, [{"text": ANSWER}]) as url:
            ran = await forked("run", "--session", "s-here", "--llm-url", url, "hello there",
                               env=env, cwd=tmp_path)  # fmt: skip
        listed = await forked("sessions", "--json", env=env, cwd=tmp_path)
        history = await forked("sessions", "history", "s-here", env=env, cwd=tmp_path)
        tasks = await forked("tasks", env=env, cwd=tmp_path)
        gone = await forked("sessions", "delete", "s-here", env=env, cwd=tmp_path)
    assert ran.code == 0, ran
    assert listed.code == 0, listed
    (row,) = json.loads(listed.out)["sessions"]
    assert (row["session_id"], row["user"], row["title"]) == ("s-here", "local", "hello there")
    assert history.code == 0 and history.out == f"user: hello there\nassistant: {ANSWER}\n"
    assert (tasks.code, tasks.out) == (0, "no tasks\n"), tasks
    assert (gone.code, gone.out) == (0, "session s-here deleted\n"), gone
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        assert await store.get_session("s-here") is None


async def test_schedule_add_without_a_daemon_is_refused_in_one_line(
    env: dict[str, str], tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE):
        added = await forked("schedule", "add", "--new", "--every", "10m", "hi",
                             env=env, cwd=tmp_path)  # fmt: skip
        listed = await forked("schedule", "list", env=env, cwd=tmp_path)
    assert added.code == 1 and added.out == ""
    line = _one_error_line(added)
    assert "a schedule runs in a daemon, as one of its users" in line and "navi serve" in line
    assert (listed.code, listed.out) == (0, "no schedules\n"), listed


async def test_compact_goes_to_the_daemon_that_answers(env: dict[str, str], tmp_path: Path) -> None:
    env = {**env, "OLLAMA_NUM_CTX": "1024"}
    huge = "START " + "word " * 1500 + "END"
    with trio.fail_after(DEADLINE):
        async with (
            fake_llm(tmp_path, [{"text": ANSWER}]) as llm,
            navi_forks.serving(env, llm) as daemon,
        ):
            url = ("--url", daemon.url)
            stuck = await forked("run", *url, "--session", "s-big", huge, env=env, cwd=tmp_path)
            done = await forked("compact", *url, "--session", "s-big", env=env, cwd=tmp_path)
            again = await forked("run", *url, "--session", "s-big", "go on", env=env, cwd=tmp_path)
            log = (await daemon.stderr.receive_some(1 << 20)).decode()
    assert stuck.code == 1 and "navi compact --session s-big" in stuck.out, stuck
    assert done.code == 0, done
    assert "compacted: 0 older messages summarised" in done.out and " -> ~" in done.out
    assert again.code == 0 and again.out.strip() == ANSWER, again
    assert "user local-admin (admin) connected" in log  # the daemon's own user, not ours


async def test_compact_of_a_session_another_process_runs_is_refused_and_the_daemon_goes_on(
    env: dict[str, str], tmp_path: Path
) -> None:
    replies: list[dict[str, Any]] = [{"text": "partial answer", "stall": True}]
    async with fake_llm(tmp_path, replies) as llm, navi_forks.serving(env, llm) as daemon:
        first = await navi_forks.start("run", "--session", "s-held", "--llm-url", llm, "hi",
                                       env=env, cwd=tmp_path)  # fmt: skip
        assert first.stdout is not None
        try:
            with trio.fail_after(DEADLINE):
                await _read_until(first.stdout, b"partial answer")  # it holds the session
                url = ("--url", daemon.url)
                compact = await forked("compact", *url, "--session", "s-held",
                                       env=env, cwd=tmp_path)  # fmt: skip
                listed = await forked("sessions", *url, env=env, cwd=tmp_path)
                first.send_signal(signal.SIGINT)
                code, _, err = await finish(first)
        finally:
            await reap(first)
    assert compact.code == 1 and compact.out == "", compact
    line = _one_error_line(compact)
    assert "compacting failed" in line and "'s-held' is busy" in line, line
    assert f"pid {first.pid}" in line, line
    assert listed.code == 0 and "s-held" in listed.out, listed  # the daemon is still there
    assert code == 130, err


async def test_mcp_serve_without_a_daemon_asks_and_lists_through_its_private_server(
    env: dict[str, str], tmp_path: Path
) -> None:
    debug = {**env, "NAVI_DEBUG": "1"}
    async with fake_llm(tmp_path, [{"text": ANSWER}]) as llm:
        with trio.fail_after(DEADLINE):
            async with mcp_serve({**debug, "OLLAMA_HOST": llm}, tmp_path) as client:
                asked = await client.call_tool("ask", {"message": "hi"})
                listed = await client.call_tool("sessions", {})
    assert not asked.is_error and asked.structured_content["answer"] == ANSWER
    sid = asked.structured_content["session_id"]
    assert [row["session_id"] for row in listed.structured_content["sessions"]] == [sid]
    log = (tmp_path / "err.log").read_text(encoding="utf-8")
    assert "navi_trio.api.connection: connection 127.0.0.1:" in log
    assert log.count("user local (admin) connected") >= 2, log  # the ask, the list
    assert f"session {sid}: message from local runs" in log
