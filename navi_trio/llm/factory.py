"""Build the configured LLM backend from Settings, and choose one when none is configured.

`choose_backend`: with neither NAVI_LLM_BACKEND / OLLAMA_HOST nor an option naming the
LLM, Ollama is used when it answers at the default URL (a 0.5 s probe), else the
embedded local model when the `local` extra is installed, else a ConfigError says how to
get either.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import httpx
import trio

from navi_trio.errors import ConfigError
from navi_trio.llm.base import LLMBackend
from navi_trio.llm.client import LLMClient
from navi_trio.llm.ollama import OllamaBackend
from navi_trio.llm.openai import OpenAIBackend
from navi_trio.llm.shards import ShardedClient
from navi_trio.llm.transport import H11Transport, env_proxies
from navi_trio.settings import Settings

BACKENDS = ("ollama", "openai", "local")


def make_client(settings: Settings) -> httpx.AsyncClient:
    """The one HTTP client of a backend.

    Only connecting has an httpx timeout: reads wait as long as the stream guard allows
    (first_chunk_timeout / chunk_timeout), which is the layer that knows about prefill.
    No cookies, and a cheap chat POST (llm/client.py). It sends through our own HTTP/1.1
    transport (NAVI_LLM_TRANSPORT=h11, llm/transport.py: one pool, O(1) per request),
    or httpx's (``httpx``, spread over small pools: llm/shards.py), which is also the
    one used when the environment sets a proxy (ours speaks to none).
    """
    timeout = httpx.Timeout(None, connect=settings.llm_connect_timeout)
    if settings.llm_transport == "h11" and not env_proxies():
        return LLMClient(transport=H11Transport(), timeout=timeout)
    return ShardedClient(timeout=timeout)


def make_backend(settings: Settings, client: httpx.AsyncClient) -> LLMBackend:
    """The backend named by ``settings.llm_backend`` (NAVI_LLM_BACKEND), talking via `client`."""
    kind = settings.llm_backend.strip().lower()
    if kind == "ollama":
        return OllamaBackend(client, settings.llm_url, keep_alive=settings.keep_alive)
    if kind == "openai":
        return OpenAIBackend(
            client,
            settings.llm_url,
            api_key=settings.llm_api_key,
            tool_stream=settings.openai_tool_stream,
        )
    if kind == "local":
        # Only looks for the packages: llama.cpp itself runs in the model host process.
        from navi_trio.llm.local import LocalBackend, extra_buffers_setting

        return LocalBackend(
            settings.model_file,
            n_ctx=settings.num_ctx,
            threads=settings.local_threads,
            tool_rounds=settings.local_tool_rounds,
            data_dir=settings.data_dir,
            extra_buffers=extra_buffers_setting(settings.local_extra_buffers),
        )
    raise ConfigError(
        f"NAVI_LLM_BACKEND={settings.llm_backend!r} is not a known LLM backend "
        f"(expected one of: {', '.join(BACKENDS)})"
    )


# -- which backend when none is configured ------------------------------------------------

DEFAULT_LLM_URL = "http://127.0.0.1:11434"
PROBE_TIMEOUT = 0.5
LOCAL_NUM_CTX = 4096
LOCAL_PROFILE = "local"
LOCAL_MODEL_NAME = "SmolLM2-135M"
# Set in the environment, any of these means "the user chose an LLM": no probing then.
CONFIGURING_ENV = ("NAVI_LLM_BACKEND", "OLLAMA_HOST")


def backend_configured(environ: Mapping[str, str], *, given: bool) -> bool:
    """Whether the LLM was chosen: an option (`given`) or NAVI_LLM_BACKEND / OLLAMA_HOST."""
    return given or any(environ.get(name, "").strip() for name in CONFIGURING_ENV)


def local_settings(settings: Settings, environ: Mapping[str, str]) -> Settings:
    """`settings` for the embedded model: a small window unless OLLAMA_NUM_CTX says."""
    num_ctx = settings.num_ctx if "OLLAMA_NUM_CTX" in environ else LOCAL_NUM_CTX
    return attrs.evolve(settings, llm_backend="local", num_ctx=num_ctx)


async def ollama_answers(url: str, timeout: float = PROBE_TIMEOUT) -> bool:  # noqa: ASYNC109
    """Whether an Ollama server lists its models at `url` within `timeout` seconds."""
    with trio.move_on_after(timeout):
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                response = await client.get(f"{url.rstrip('/')}/api/tags")
        except httpx.HTTPError:
            return False
        return response.status_code < 400
    return False


@attrs.frozen
class BackendChoice:
    """The settings to run with, and the one line to tell the user (or None)."""

    settings: Settings
    note: str | None = None


def no_backend_message(url: str) -> str:
    return (
        f"no LLM to talk to: no Ollama answers at {url} and the embedded local model is not "
        "installed. Either install it (pip install 'navi-trio[local]', then `navi chat "
        "--local`) or start Ollama (`ollama serve`; OLLAMA_HOST for another address)"
    )


async def choose_backend(
    settings: Settings, environ: Mapping[str, str], *, configured: bool
) -> BackendChoice:
    """With nothing configured: Ollama if it answers, else the local model, else ConfigError.

    `settings.llm_url` is where Ollama is looked for (the default URL when nothing is
    configured). A configured backend is kept as it is, without probing.
    """
    if configured:
        if settings.llm_backend.strip().lower() == "local":
            return BackendChoice(local_settings(settings, environ))
        return BackendChoice(settings)
    if await ollama_answers(settings.llm_url):
        return BackendChoice(settings)
    from navi_trio.llm import local  # no llama_cpp import: only looks for the packages

    if local.local_available(settings.model_file):
        note = (
            f"no Ollama at {settings.llm_url}: using the embedded local model "
            f"({LOCAL_MODEL_NAME if settings.model_file is None else settings.model_file.name})"
        )
        return BackendChoice(local_settings(settings, environ), note)
    raise ConfigError(no_backend_message(settings.llm_url))
