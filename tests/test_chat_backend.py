"""`navi chat --local` and a daemon that already runs: the welcome names its backend,
and the chat says in one line when it is not the one asked for.

A real daemon (runtime + ApiServer with the fake LLM, Ollama dialect) on 127.0.0.1,
port 0; the chat's input is a reader that ends at once. Absolute deadline per test.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import trio
from api_ws import open_daemon
from test_client_app import QueueReader, Screen

from navi_trio.cli.chat import wanted_backend
from navi_trio.client.app import ChatOptions
from navi_trio.client.daemon import daemon_backend, serve_command
from navi_trio.client.main import run_chat
from navi_trio.client.render import Renderer

DEADLINE = 30


async def _chat(url: str, token: str, tmp_path: Path, want: tuple[str, str] | None) -> str:
    reader, screen = QueueReader(), Screen()
    reader.abort()  # end of input: the chat quits after connecting
    options = ChatOptions(url=url, token="", finish_runs_on_eof=True, backoff=0)
    await run_chat(
        options,
        Renderer(screen.console),
        reader,
        data_dir=tmp_path / "data",
        token=token,
        autostart=True,
        want_backend=want,
    )
    return screen.text


async def test_chat_local_says_when_the_running_daemon_uses_another_backend(
    tmp_path: Path,
) -> None:
    with trio.fail_after(DEADLINE):
        async with open_daemon(tmp_path) as daemon:
            token = daemon.tokens["alice"]
            url = daemon.url.rstrip("/")
            port = url.rsplit(":", 1)[1]
            assert await daemon_backend(url, token) == "ollama"
            text = await _chat(url, token, tmp_path, want=("local", "--local"))
            assert (
                f"--local does not apply to the daemon already running at {url}: it runs the "
                f"ollama backend. To chat with local, stop it (`navi stop --port {port}`)"
            ) in " ".join(text.split())
            assert "connected to navi_trio" in text
            # Asked for what it runs (or for nothing): no such line.
            for want in (("ollama", "OLLAMA_HOST=x"), None):
                text = await _chat(url, token, tmp_path, want=want)
                assert "does not apply" not in text


async def test_ollama_host_is_said_not_to_apply_to_a_daemon_of_another_backend(
    tmp_path: Path,
) -> None:
    # What a `--local` daemon is to OLLAMA_HOST: one running with another backend.
    with trio.fail_after(DEADLINE):
        async with open_daemon(tmp_path, dialect="openai") as daemon:
            url = daemon.url.rstrip("/")
            args = argparse.Namespace(local=False, model_file=None)
            want = wanted_backend(args, {"OLLAMA_HOST": "http://127.0.0.1:11500"})
            assert want == ("ollama", "OLLAMA_HOST=http://127.0.0.1:11500")
            text = " ".join((await _chat(url, daemon.tokens["alice"], tmp_path, want)).split())
            assert (
                f"OLLAMA_HOST=http://127.0.0.1:11500 does not apply to the daemon already running "
                f"at {url}: it runs the openai backend"
            ) in text
    assert wanted_backend(argparse.Namespace(local=False, model_file=None), {}) is None


def test_a_daemon_started_by_chat_gets_the_backend_options() -> None:
    argv = serve_command(8765, ["--local", "--model-file", "/m.gguf"])
    assert argv[-6:] == ["serve", "--port", "8765", "--local", "--model-file", "/m.gguf"]
