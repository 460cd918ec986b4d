"""`navi run`'s daemon client in-process (cli/run.py run_remote against a real ApiServer on
127.0.0.1, port 0) and its choice between the daemon and an embedded runtime.

A message for a session that is running is queued by the daemon; navi run shows only
its own run, not the one ahead of it. The local daemon is looked for only when a token
is at hand; `--db` & co. mean "in this process", and with `--url` they are refused.

Rules: see tests/test_api_server.py (real WebSocket connections, the gate tool holds a
run open so the test decides when it ends; no clocks).
"""

from __future__ import annotations

import argparse
import io
import os
import signal
from pathlib import Path

import pytest
import trio
from agent_tools import GateTool, call, toolset, with_tools
from api_ws import open_daemon
from test_cli import unused_port

from navi_trio.api import endpoint
from navi_trio.api.daemon_client import daemon_answers
from navi_trio.cli import UsageError
from navi_trio.cli.run import daemon_target, run_remote
from navi_trio.cli.runner import RunRequest
from navi_trio.errors import RemoteError
from navi_trio.settings import Settings

TIMEOUT = 30


async def test_a_queued_message_shows_only_its_own_run(tmp_path: Path) -> None:
    gate = GateTool()
    replies = [call("gate"), {"text": "first done"}, {"text": "second done"}]
    out, err = io.StringIO(), io.StringIO()
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate),
            profiles={"general": with_tools(["gate"])},
        ) as d, d.connect("alice") as alice:  # fmt: skip
            await alice.request({"type": "message", "session_id": "alice.s-q", "content": "hi"})
            await gate.entered.wait()
            # A user's cwd: inside the roots of their role; by default their own session folder.
            own = d.harness.runtime.settings.session_dir("alice.s-q")
            own.mkdir(parents=True, exist_ok=True)
            req = RunRequest("alice.s-q", "thanks", own, None, False)
            async with trio.open_nursery() as nursery:

                async def navi_run() -> None:
                    outcome = await run_remote(d.url, d.tokens["alice"], req, out, err)
                    assert outcome.end is not None and outcome.end.reason == "complete"

                nursery.start_soon(navi_run)
                await alice.until_type("message_queued", session_id="alice.s-q", text="thanks")
                gate.gate.set()
    assert out.getvalue() == "second done\n"
    lines = err.getvalue().splitlines()
    assert lines == ["session: alice.s-q", "navi: the session is busy: message queued (#1)"]


def _args(**given: object) -> argparse.Namespace:
    names = ("url", "token", "db", "config", "llm_url", "backend")
    return argparse.Namespace(**{n: given.get(n) for n in names})


def test_the_daemon_or_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NAVI_TOKEN", raising=False)
    settings = Settings.from_env({}, data_dir=tmp_path, db_path=tmp_path / "navi.db")
    closed = f"ws://127.0.0.1:{unused_port()}/"
    monkeypatch.setattr(endpoint, "DEFAULT_URL", closed)
    probed: list[str] = []

    async def probe(url: str, timeout: float) -> bool:  # noqa: ASYNC109
        probed.append(url)
        return await daemon_answers(url, timeout)

    monkeypatch.setattr(endpoint, "daemon_answers", probe)
    # No token anywhere: no local daemon ever ran here, so nothing is even probed.
    assert daemon_target(_args(), settings) is None and probed == []
    # A token, nothing answering at the local URL: this process.
    assert daemon_target(_args(token="t"), settings) is None and probed == [closed]
    # --db (or --config, --llm-url, --backend) means this process: no probe.
    assert daemon_target(_args(token="t", db=Path("x.db")), settings) is None
    assert probed == [closed]
    # --url asks for that daemon, with the token from --token, NAVI_TOKEN or the file.
    assert daemon_target(_args(url="ws://h:1/", token="t"), settings) == ("ws://h:1/", "t")
    monkeypatch.setenv("NAVI_TOKEN", "env-token")
    assert daemon_target(_args(url="ws://h:1/"), settings) == ("ws://h:1/", "env-token")
    with pytest.raises(UsageError, match="drop --db, --llm-url or --url"):
        daemon_target(_args(url="ws://h:1/", db=Path("x"), llm_url="http://x"), settings)


async def test_ctrl_c_while_queued_leaves_the_run_ahead_alone(tmp_path: Path) -> None:
    gate = GateTool()
    replies = [call("gate"), {"text": "first done"}, {"text": "second done"}]
    out, err = io.StringIO(), io.StringIO()
    with trio.fail_after(TIMEOUT):
        async with open_daemon(
            tmp_path, replies=replies, tools=toolset(gate),
            profiles={"general": with_tools(["gate"])},
        ) as d, d.connect("alice") as alice:  # fmt: skip
            await alice.request({"type": "message", "session_id": "alice.s-q", "content": "hi"})
            await gate.entered.wait()
            # A user's cwd: inside the roots of their role; by default their own session folder.
            own = d.harness.runtime.settings.session_dir("alice.s-q")
            own.mkdir(parents=True, exist_ok=True)
            req = RunRequest("alice.s-q", "thanks", own, None, False)
            async with trio.open_nursery() as nursery:

                async def navi_run() -> None:
                    outcome = await run_remote(d.url, d.tokens["alice"], req, out, err)
                    assert outcome.signal == signal.SIGINT and outcome.end is None

                nursery.start_soon(navi_run)
                await alice.until_type("message_queued", session_id="alice.s-q", text="thanks")
                os.kill(os.getpid(), signal.SIGINT)
            # navi run has quit; the run ahead was not stopped, and ours still runs.
            gate.gate.set()
            first = await alice.until_end("alice.s-q")
            second = await alice.until_end("alice.s-q")
    assert (first["reason"], first["text"]) == ("complete", "first done")
    assert second["text"] == "second done" and out.getvalue() == ""
    assert "navi: the message stays queued in the daemon" in err.getvalue()


async def test_a_users_navi_run_sends_the_shells_folder_only_when_asked(tmp_path: Path) -> None:
    # An ordinary user's cwd must lie in their workspace_roots; the shell's folder is
    # anywhere. Without --cwd it is not sent (the run works); with --cwd it is, and the
    # daemon refuses it. An admin's shell folder goes along.
    replies = [{"text": "user done"}, {"text": "admin done"}]
    shell = tmp_path / "shell"
    shell.mkdir()
    with trio.fail_after(TIMEOUT):
        async with open_daemon(tmp_path, replies=replies) as d:
            out, err = io.StringIO(), io.StringIO()
            req = RunRequest("alice.r", "hi", shell, None, False, cwd_given=False)
            outcome = await run_remote(d.url, d.tokens["alice"], req, out, err)
            assert outcome.end is not None and outcome.end.reason == "complete"
            assert out.getvalue() == "user done\n"
            history = await d.harness.runtime.store.load_messages("alice.r")
            assert "cwd" not in history[0]

            asked = RunRequest("alice.r", "again", shell, None, False, cwd_given=True)
            with pytest.raises(BaseExceptionGroup) as group:
                await run_remote(d.url, d.tokens["alice"], asked, io.StringIO(), io.StringIO())
            refused, _ = group.value.split(RemoteError)
            assert refused is not None
            (leaf,) = _leaves(refused)
            assert isinstance(leaf, RemoteError) and leaf.code == "forbidden"
            assert "workspace_roots" in str(leaf)

            req = RunRequest("root.r", "hi", shell, None, False, cwd_given=False)
            out = io.StringIO()
            outcome = await run_remote(d.url, d.tokens["root"], req, out, io.StringIO())
            assert out.getvalue() == "admin done\n"
            history = await d.harness.runtime.store.load_messages("root.r")
            assert history[0]["cwd"] == str(shell.resolve())


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    return [
        leaf
        for e in group.exceptions
        for leaf in (_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    ]
