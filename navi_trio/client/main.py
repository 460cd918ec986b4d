"""`chat`: the body of ``navi chat`` (cli.py parses the options and calls it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

import trio
from rich.console import Console

from navi_trio.client.app import ChatApp, ChatOptions
from navi_trio.client.connection import ChatError
from navi_trio.client.daemon import ensure_daemon, find_token
from navi_trio.client.reader import LineReader, PromptReader, Reader
from navi_trio.client.render import Renderer

DEFAULT_URL = "ws://127.0.0.1:8765"


async def run_chat(
    options: ChatOptions,
    renderer: Renderer,
    reader: Reader,
    *,
    data_dir: Path,
    token: str | None,
    autostart: bool,
) -> None:
    """Start a daemon if needed and none answers, find the token, chat until quit."""
    if autostart:
        started = await ensure_daemon(options.url, data_dir)
        if started:
            renderer.notice(started)
    # Read after a daemon was started: its first start writes the local-token file.
    options.token = find_token(token, os.environ, data_dir)
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
) -> int:
    """Run the chat in this terminal; the exit code (1 with one line on `err` on failure)."""
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
                    options, renderer, reader, data_dir=data_dir, token=token, autostart=autostart
                )
            )
    except* ChatError as group:
        print(f"navi: error: {group.exceptions[0]}", file=err, flush=True)
        code = 1
    return code
