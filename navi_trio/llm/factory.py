"""Build the configured LLM backend from Settings."""

from __future__ import annotations

import httpx

from navi_trio.errors import ConfigError
from navi_trio.llm.base import LLMBackend
from navi_trio.llm.ollama import OllamaBackend
from navi_trio.llm.openai import OpenAIBackend
from navi_trio.settings import Settings

BACKENDS = ("ollama", "openai", "local")


def make_client(settings: Settings) -> httpx.AsyncClient:
    """The one HTTP client of a backend.

    Only connecting has an httpx timeout: reads wait as long as the stream guard allows
    (first_chunk_timeout / chunk_timeout), which is the layer that knows about prefill.
    """
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=settings.llm_connect_timeout))


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
        from navi_trio.llm.local import LocalBackend  # the optional extra: imported on use

        return LocalBackend(
            settings.model_file,
            n_ctx=settings.num_ctx,
            threads=settings.local_threads,
            tool_rounds=settings.local_tool_rounds,
        )
    raise ConfigError(
        f"NAVI_LLM_BACKEND={settings.llm_backend!r} is not a known LLM backend "
        f"(expected one of: {', '.join(BACKENDS)})"
    )
