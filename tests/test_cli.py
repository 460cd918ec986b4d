"""The ``navi`` command, run as a real subprocess: forked from the warm fork server
(`forked`, tests/navi_forks.py: a process of its own without a new interpreter's start)
where the test is about what the command does; ``python -m navi_trio`` itself (`navi`)
for `--help` and `--version`, the docs' `navi run` and the Ctrl-C test.

Rules: loopback only, port 0; the fake LLM in the test's loop (one test: its own
process, ``python -m navi_trio.testing.fake_llm --port 0``), killed at the end; every
test has an absolute 60 s deadline; the DB and data dir live under tmp_path. Nothing
sleeps: the Ctrl-C test waits for the partial answer on the CLI's stdout before
signalling.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import navi_forks
import pytest
import trio

from navi_trio.api.auth import ensure_local_token
from navi_trio.cli import _describe, main
from navi_trio.errors import ConfigError, LLMConnectionError
from navi_trio.events import StreamEnd, TextDelta, event_from_dict
from navi_trio.settings import REPO_ROOT
from navi_trio.store.sqlite import SQLiteStore
from navi_trio.testing import open_fake_llm
from navi_trio.testing.lifeline import watching

pytestmark = pytest.mark.slow  # its tests start processes

DEADLINE = 60
ANSWER = "Hello from the fake model"
PROFILES = ("coder", "general", "local", "researcher")


@attrs.frozen
class Done:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return self.err.strip().splitlines()


async def navi(*args: str, env: dict[str, str], cwd: Path, stdin: bytes = b"") -> Done:
    with trio.fail_after(DEADLINE):
        proc = await trio.run_process(
            [sys.executable, "-m", "navi_trio", *args],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
            cwd=cwd,
        )
    return Done(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


async def forked(*args: str, env: dict[str, str], cwd: Path, stdin: bytes = b"") -> Done:
    """`navi` as a child of the warm fork server (tests/navi_forks.py) instead of a new
    interpreter: for a test of what a command does, not of how Python starts it."""
    with trio.fail_after(DEADLINE):
        proc = await navi_forks.start(*args, env=env, cwd=cwd)
        code, out, err = await navi_forks.communicate(proc, stdin)
    return Done(code, out.decode(), err.decode())


async def _read_until(stream: trio.abc.ReceiveStream, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = await stream.receive_some()
        if not chunk:
            raise AssertionError(f"stream ended before {marker!r}; got {data!r}")
        data += chunk
    return data


@asynccontextmanager
async def fake_llm(
    tmp_path: Path, replies: Sequence[dict[str, Any]], *, process: bool = False
) -> AsyncIterator[str]:
    """The fake LLM server, cycling through `replies`; yields its base URL. In the test's
    own trio loop (`fake_llm_here`: no process to start, the test awaits the processes
    that ask it), or with `process` in its own, as `python -m navi_trio.testing.fake_llm`
    runs it."""
    if not process:
        async with fake_llm_here(replies) as url:
            yield url
        return
    script = tmp_path / "script.json"
    script.write_text(json.dumps(list(replies)), encoding="utf-8")
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "navi_trio.testing.fake_llm",
            "--port",
            "0",
            "--script",
            str(script),
            "--loop",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    async with watching(proc.pid):  # it stops the server if this process dies
        try:
            with trio.fail_after(DEADLINE):
                first = (await _read_until(proc.stdout, b"\n")).decode().splitlines()[0]
            assert first.startswith("listening on http://127.0.0.1:"), first
            yield first.split()[-1]
        finally:
            proc.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await proc.wait()
                await proc.stdout.aclose()


@asynccontextmanager
async def fake_llm_here(replies: Sequence[dict[str, Any]]) -> AsyncIterator[str]:
    """The fake LLM of `fake_llm` in the test's own trio loop, no process to start: for a
    test whose loop stays free while the processes it started ask the LLM."""
    async with open_fake_llm(replies, loop=True) as server:
        yield server.url


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def messages(db: Path, session_id: str) -> list[dict[str, Any]]:
    async with SQLiteStore.open(db) as store:
        return await store.load_messages(session_id)


def _session_of(done: Done) -> str:
    lines = [ln for ln in done.err_lines if ln.startswith("session: ")]
    assert len(lines) == 1, done.err
    return lines[0].removeprefix("session: ")


def _one_error_line(done: Done) -> str:
    errors = [ln for ln in done.err_lines if ln.startswith("navi: error: ")]
    assert len(errors) == 1, done.err
    assert "Traceback" not in done.err
    return errors[0]


# ------------------------------------------------------------------------- help


async def test_help_and_version(env: dict[str, str], tmp_path: Path) -> None:
    for flag, command in (("--help", navi), ("-h", forked)):  # one new interpreter is enough
        done = await command(flag, env=env, cwd=tmp_path)
        assert done.code == 0 and "doctor" in done.out and "run" in done.out
    done = await forked("run", "--help", env=env, cwd=tmp_path)
    assert done.code == 0 and "--events" in done.out and "--session" in done.out
    done = await navi("--version", env=env, cwd=tmp_path)
    assert done.code == 0 and done.out.strip() == "navi 0.1.0"


async def test_bad_arguments_exit_1_with_one_line(env: dict[str, str], tmp_path: Path) -> None:
    for args, words in (
        ((), "COMMAND"),
        (("fly",), "fly"),
        (("run",), "message"),
        (("run", "--backend", "carrier-pigeon", "hi"), "carrier-pigeon"),
        (("run", "--cwd", str(tmp_path / "nowhere"), "hi"), "not a directory"),
        (("run", "   "), "empty"),
    ):
        done = await forked(*args, env=env, cwd=tmp_path)
        assert done.code == 1, (args, done)
        assert done.err_lines == [_one_error_line(done)] and words in done.err, (args, done.err)


# ------------------------------------------------------------------------- doctor


async def test_doctor_with_the_llm_down_warns_and_exits_0(
    env: dict[str, str], tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    done = await forked("doctor", "--llm-url", url, env=env, cwd=tmp_path)
    assert done.code == 0, done
    assert str(REPO_ROOT / "config" / "config.json") in done.out
    for pid in PROFILES:
        assert f"- {pid}" in done.out
    assert str(tmp_path / "navi.db") in done.out and "no database yet" in done.out
    assert "DOWN" in done.out and f"warning: the LLM at {url}/api/tags" in done.out
    assert "num_ctx 8192" in done.out and "first chunk 90 s" in done.out
    assert not (tmp_path / "navi.db").exists()  # the doctor never writes

    async with SQLiteStore.open(tmp_path / "navi.db"):
        pass
    done = await forked("doctor", "--llm-url", url, "--json", env=env, cwd=tmp_path)
    report = json.loads(done.out)
    assert done.code == 0 and report["ok"] is True
    assert report["db"]["existed"] is True and report["db"]["tables"]["sessions"] == 0
    assert report["llm"]["ok"] is False and report["llm"]["error"]
    assert sorted(p["id"] for p in report["config"]["profiles"]) == list(PROFILES)
    assert report["settings"]["llm_api_key"] == "(not set)"


async def test_doctor_says_whether_navi_serve_traces_and_where_to(
    env: dict[str, str], tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    done = await forked("doctor", "--llm-url", url, env=env, cwd=tmp_path)
    assert "traces       off (OTEL_EXPORTER_OTLP_ENDPOINT not set)" in done.out, done.out
    traced = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/"}
    done = await forked("doctor", "--llm-url", url, env=traced, cwd=tmp_path)
    line = "traces       on: OTLP/HTTP to http://127.0.0.1:4318/v1/traces (no message content)"
    assert line in done.out, done.out
    done = await forked("doctor", "--llm-url", url, "--json", env=traced, cwd=tmp_path)
    report = json.loads(done.out)["tracing"]
    assert report == {
        "endpoint": "http://127.0.0.1:4318/v1/traces", "content": False, "sdk": True,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("profile", "key"),
    [({"max_iterations": "many"}, "max_iterations"), ({"colour": "red"}, "colour")],
    ids=["wrong-type", "unknown-key"],
)
async def test_doctor_with_a_broken_config_exits_1_naming_file_and_key(
    env: dict[str, str], tmp_path: Path, profile: dict[str, Any], key: str
) -> None:
    cfg = tmp_path / "broken.json"
    cfg.write_text(json.dumps({"default_profile": "p", "profiles": {"p": profile}}))
    url = f"http://127.0.0.1:{unused_port()}"
    done = await forked("doctor", "--config", str(cfg), "--llm-url", url, env=env, cwd=tmp_path)
    assert done.code == 1
    line = _one_error_line(done)
    assert str(cfg) in line and key in line
    assert "BROKEN" in done.out and str(tmp_path / "navi.db") in done.out  # the rest still ran


async def test_doctor_against_the_fake_llm_lists_its_models(
    env: dict[str, str], tmp_path: Path
) -> None:
    async with fake_llm(tmp_path, [{"text": "unused"}]) as url:
        done = await forked("doctor", "--llm-url", url, env=env, cwd=tmp_path)
        assert done.code == 0 and "OK: models fake-model" in done.out
        # The configured model is not on this server: said, not fatal.
        assert "qwen3:8b" in done.out and "not listed" in done.out
        done = await forked(
            "doctor",
            "--llm-url",
            url,
            "--backend",
            "openai",
            "--json",
            env={**env, "NAVI_MODEL": "fake-model"},
            cwd=tmp_path,
        )
    report = json.loads(done.out)
    assert done.code == 0 and report["llm"]["ok"] is True
    assert report["llm"]["url"] == f"{url}/v1/models" and report["llm"]["models"] == ["fake-model"]
    # As root (this suite's machine), the doctor says so: tests/test_tool_user.py.
    assert [w for w in report["warnings"] if not w.startswith("navi runs as root")] == []


# ------------------------------------------------------------------------- run


async def test_run_prints_the_answer_and_a_new_session_id(
    env: dict[str, str], tmp_path: Path
) -> None:
    # The fake LLM as its own process here, as the docs run it (the others: in the loop).
    async with fake_llm(tmp_path, [{"text": ANSWER}], process=True) as url:
        done = await navi("run", "--llm-url", url, "hi", env=env, cwd=tmp_path)
        piped = await navi("run", "--llm-url", url, "-", env=env, cwd=tmp_path, stdin=b"hello")
    assert done.code == 0, done
    assert done.out == ANSWER + "\n"
    session = _session_of(done)
    assert session.startswith("s-") and len(session) == 14
    saved = await messages(tmp_path / "navi.db", session)
    assert [(m["role"], m["content"]) for m in saved] == [("user", "hi"), ("assistant", ANSWER)]
    assert saved[0]["cwd"] == str(tmp_path)
    assert piped.code == 0 and piped.out == ANSWER + "\n" and _session_of(piped) != session


async def test_a_session_of_run_without_a_daemon_is_the_folders_local_admins(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Once a daemon of the folder made its local admin, what `navi run` makes in a
    process of its own is that admin's, with its title: a daemon lists it to the local
    token as its own (not as user "local", of no table). Before, it stays "local", and
    nothing is written to make an admin."""
    data = Path(env["NAVI_DATA_DIR"])
    async with fake_llm(tmp_path, [{"text": ANSWER}]) as url:
        before = await forked("run", "--llm-url", url, "before any daemon", env=env, cwd=tmp_path)
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            assert not (data / "local-token").exists()
            await ensure_local_token(store, data)  # as `navi serve` does at its start
        done = await forked("run", "--llm-url", url, "tidy the <b>notes</b>", env=env, cwd=tmp_path)
    assert before.code == 0 and done.code == 0, (before, done)
    token = (data / "local-token").read_text().strip()
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        first = await store.get_session(_session_of(before))
        row = await store.get_session(_session_of(done))
        admin = await store.get_user_by_token(token)
    assert first is not None and first.user_id == "local" and first.title == "before any daemon"
    assert row is not None and admin is not None and admin["role"] == "admin"
    assert row.title == "tidy the <b>notes</b>"
    assert row.user_id == admin["id"] != "local"


async def test_run_events_prints_wire_json_lines(env: dict[str, str], tmp_path: Path) -> None:
    async with fake_llm(tmp_path, [{"text": ANSWER}]) as url:
        done = await forked("run", "--events", "--llm-url", url, "hi", env=env, cwd=tmp_path)
    assert done.code == 0, done
    frames = [json.loads(line) for line in done.out.splitlines()]
    session = _session_of(done)
    seqs = [f["seq"] for f in frames]  # a merged delta carries its last seq
    assert seqs[0] >= 1 and seqs == sorted(set(seqs))
    assert all(f["session_id"] == session for f in frames)
    parsed = [event_from_dict(f) for f in frames]
    assert "".join(e.text for e in parsed if isinstance(e, TextDelta)) == ANSWER
    ends = [e for e in parsed if isinstance(e, StreamEnd)]
    assert len(ends) == 1 and ends[0].reason == "complete" and ends[0].text == ANSWER
    assert frames[-1]["type"] == "stream_end"


async def test_run_with_session_continues_it(env: dict[str, str], tmp_path: Path) -> None:
    async with fake_llm(tmp_path, [{"text": "first answer"}, {"text": "second answer"}]) as url:
        one = await forked(
            "run",
            "--session",
            "s-cli-1",
            "--profile",
            "coder",
            "--llm-url",
            url,
            "hi",
            env=env,
            cwd=tmp_path,
        )
        two = await forked(
            "run", "--session", "s-cli-1", "--llm-url", url, "thanks", env=env, cwd=tmp_path
        )
        async with SQLiteStore.open(tmp_path / "navi.db") as store:
            row = await store.get_session("s-cli-1")
        assert row is not None and row.profile_id == "coder"
        # --profile on an existing session switches it.
        three = await forked(
            "run",
            "--session",
            "s-cli-1",
            "--profile",
            "researcher",
            "--llm-url",
            url,
            "ok",
            env=env,
            cwd=tmp_path,
        )
    assert (one.code, two.code, three.code) == (0, 0, 0), (one, two, three)
    assert (one.out, two.out) == ("first answer\n", "second answer\n")
    assert _session_of(one) == _session_of(two) == "s-cli-1"
    saved = await messages(tmp_path / "navi.db", "s-cli-1")
    assert [(m["role"], m["content"]) for m in saved] == [
        ("user", "hi"),
        ("assistant", "first answer"),
        ("user", "thanks"),
        ("assistant", "second answer"),
        ("user", "ok"),
        ("assistant", "first answer"),
    ]
    async with SQLiteStore.open(tmp_path / "navi.db") as store:
        row = await store.get_session("s-cli-1")
    assert row is not None and row.profile_id == "researcher"


async def test_run_with_the_llm_down_exits_1_with_one_line(
    env: dict[str, str], tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    done = await forked("run", "--llm-url", url, "hi", env=env, cwd=tmp_path)
    assert done.code == 1 and done.out == ""
    assert url in _one_error_line(done)
    done = await forked("run", "--events", "--llm-url", url, "hi", env=env, cwd=tmp_path)
    assert done.code == 1 and url in _one_error_line(done)
    assert json.loads(done.out.splitlines()[-1])["reason"] == "error"


async def test_run_with_an_unknown_profile_names_the_profiles(
    env: dict[str, str], tmp_path: Path
) -> None:
    done = await forked("run", "--profile", "poet", "hi", env=env, cwd=tmp_path)
    assert done.code == 1
    line = _one_error_line(done)
    assert "poet" in line and all(p in line for p in PROFILES)


async def test_run_with_a_broken_config_or_env_exits_1(env: dict[str, str], tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text("{not json")
    done = await forked("run", "--config", str(cfg), "hi", env=env, cwd=tmp_path)
    assert done.code == 1 and str(cfg) in _one_error_line(done)
    done = await forked("run", "hi", env={**env, "OLLAMA_NUM_CTX": "big"}, cwd=tmp_path)
    assert done.code == 1 and "OLLAMA_NUM_CTX" in _one_error_line(done)
    done = await forked("run", "--session", "bad id!", "hi", env=env, cwd=tmp_path)
    assert done.code == 1 and "bad id!" in _one_error_line(done)
    # NAVI_DEBUG=1 adds the traceback.
    done = await forked(
        "run", "--config", str(cfg), "hi", env={**env, "NAVI_DEBUG": "1"}, cwd=tmp_path
    )
    assert done.code == 1 and "Traceback" in done.err and "ConfigError" in done.err


async def test_ctrl_c_stops_the_run_and_saves_the_partial_answer(
    env: dict[str, str], tmp_path: Path
) -> None:
    # The fake model sends two words, then holds the stream open: only a stop ends it.
    async with fake_llm(tmp_path, [{"text": "partial answer", "stall": True}]) as url:
        proc = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "navi_trio",
                "run",
                "--session",
                "s-stop",
                "--llm-url",
                url,
                "hi",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=tmp_path,
        )
        assert proc.stdout is not None and proc.stderr is not None
        try:
            with trio.fail_after(DEADLINE):
                out = await _read_until(proc.stdout, b"partial answer")
                proc.send_signal(signal.SIGINT)
                code = await proc.wait()
                while chunk := await proc.stdout.receive_some():
                    out += chunk
                err = b""
                while chunk := await proc.stderr.receive_some():
                    err += chunk
        finally:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
    assert code == 130, err
    assert out.decode() == "partial answer\n" and b"Traceback" not in err
    saved = await messages(tmp_path / "navi.db", "s-stop")
    assert saved[-1]["role"] == "assistant" and saved[-1]["content"] == "partial answer"
    assert saved[-1].get("stopped") is True and saved[-1].get("partial") is True


# ------------------------------------------------------------------------- in-process


def test_main_returns_codes_without_exiting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == "navi 0.1.0"
    assert main(["run"]) == 1
    assert capsys.readouterr().err.startswith("navi: error: ")


def test_errors_become_one_line_and_only_unexpected_ones_hint_at_debug() -> None:
    group = ExceptionGroup("g", [ExceptionGroup("h", [ConfigError("c.json: $.x: bad\n  y")])])
    message, expected = _describe(group)
    assert (message, expected) == ("c.json: $.x: bad y", True)
    message, expected = _describe(LLMConnectionError("cannot connect"))
    assert message == "cannot connect" and expected
    message, expected = _describe(ValueError("boom"))
    assert not expected and message.startswith("ValueError: boom") and "NAVI_DEBUG=1" in message
