"""`chat`: the body of ``navi chat``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import trio
from rich.console import Console

from navi_trio.client.app import ChatApp, ChatOptions
from navi_trio.client.daemon import (
    daemon_backend,
    ensure_daemon,
    find_token,
    host_port,
    token_hint,
)
from navi_trio.client.reader import LineReader, PromptReader, Reader
from navi_trio.client.render import Renderer
from navi_trio.errors import NaviError, RemoteError
from navi_trio.text import terminal_safe

DEFAULT_URL = "ws://127.0.0.1:8765"


async def run_chat(
    options: ChatOptions,
    renderer: Renderer,
    reader: Reader,
    *,
    data_dir: Path,
    token: str | None,
    autostart: bool,
    serve_args: Sequence[str] = (),
    want_backend: tuple[str, str] | None = None,
) -> None:
    """Start a daemon (with `serve_args`) if none answers, find the token, chat until quit.
    `want_backend`: the backend asked for here and the setting that asked; when a running
    daemon has another backend, one line says that the setting does not apply to it.
    """
    started = None
    if autostart:
        started = await ensure_daemon(options.url, data_dir, serve_args=serve_args)
        if started:
            renderer.notice(started)
    # Read after a daemon was started: its first start writes the local-token file.
    options.token = find_token(token, os.environ, data_dir)
    options.token_hint = token_hint(data_dir, bool(token or os.environ.get("NAVI_TOKEN")))
    if want_backend and not started:
        backend = await daemon_backend(options.url, options.token)
        wanted, setting = want_backend
        if backend and backend != wanted:
            _, port = host_port(options.url)
            renderer.warning(
                f"{setting} does not apply to the daemon already running at {options.url}: it "
                f"runs the {backend} backend. To chat with {wanted}, stop it (`navi stop --port "
                f"{port}`) and start the chat again, or use another --url"
            )
    await ChatApp(options, renderer, reader).run()


def chat(
    *,
    url: str,
    data_dir: Path,
    session_id: str | None = None,
    profile: str | None = None,
    token: str | None = None,
    autostart: bool = True,
    err: TextIO | None = None,
    serve_args: Sequence[str] = (),
    want_backend: tuple[str, str] | None = None,
) -> int:
    """Run the chat in this terminal; the exit code: 1 with one line on `err` when it
    cannot go on, and 1 for a piped chat (stdin not a terminal) that showed an error
    (an answer that failed, a refused message): a script sees that it did not work."""
    err = err or sys.stderr
    renderer = Renderer(Console(highlight=False))  # file=None: follows patch_stdout
    interactive = sys.stdin.isatty()
    reader: Reader = PromptReader(renderer.status.toolbar) if interactive else LineReader()
    options = ChatOptions(
        url=url,
        token="",
        session_id=session_id,
        profile=profile,
        finish_runs_on_eof=not interactive,
    )
    code = 0
    try:
        with reader.output():
            trio.run(
                lambda: run_chat(
                    options,
                    renderer,
                    reader,
                    data_dir=data_dir,
                    token=token,
                    autostart=autostart,
                    serve_args=serve_args,
                    want_backend=want_backend,
                )
            )
    except* NaviError as group:
        exc = group.exceptions[0]
        # A refusal in the daemon's words: its wire code is no news to the person here.
        text = exc.detail if isinstance(exc, RemoteError) else str(exc)
        print(terminal_safe(f"navi: error: {text}"), file=err, flush=True)
        code = 1
    if not interactive and renderer.errors:
        code = 1
    return code
