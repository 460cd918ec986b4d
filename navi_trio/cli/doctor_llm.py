"""`navi doctor`'s look at an LLM endpoint: does it answer, and with what window.

Each check is bounded in time and never raises: a server that does not answer is a
result.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from navi_trio.llm.ping import LLM_PING_TIMEOUT
from navi_trio.settings import Settings


def _root_url(settings: Settings) -> str:
    base = settings.llm_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip()) or None
    return None


def _ollama_window(data: Any) -> dict[str, Any]:
    """From ``/api/show``: the model's trained window and the Modelfile's num_ctx."""
    out: dict[str, Any] = {}
    info = data.get("model_info") if isinstance(data, dict) else None
    if isinstance(info, dict):
        for key, value in info.items():
            if str(key).endswith(".context_length") and _as_int(value):
                out["n_ctx"] = _as_int(value)
    params = data.get("parameters") if isinstance(data, dict) else None
    if isinstance(params, str):
        for row in params.splitlines():
            name, _, value = row.strip().partition(" ")
            if name == "num_ctx" and _as_int(value):
                out["model_num_ctx"] = _as_int(value)
    return out


def _llama_window(props: Any, models: Any, model: str) -> int | None:
    """llama.cpp: ``/props`` has the window it runs with; ``/v1/models`` meta the trained one."""
    if isinstance(props, dict):
        settings = props.get("default_generation_settings")
        if isinstance(settings, dict) and _as_int(settings.get("n_ctx")):
            return _as_int(settings.get("n_ctx"))
        if _as_int(props.get("n_ctx")):
            return _as_int(props.get("n_ctx"))
    entries = models.get("data") if isinstance(models, dict) else None
    if isinstance(entries, list):
        entries = [e for e in entries if isinstance(e, dict)]
        entries.sort(key=lambda e: e.get("id") != model)  # the configured model first
        for entry in entries:
            meta = entry.get("meta")
            if isinstance(meta, dict):
                for key in ("n_ctx", "n_ctx_train"):
                    if _as_int(meta.get(key)):
                        return _as_int(meta.get(key))
    return None


async def server_context(settings: Settings) -> dict[str, Any]:
    """The server's context window, where its API gives it: ``{"n_ctx": int | None,
    "source": url}`` (+ ``model_num_ctx`` for Ollama), from Ollama's ``/api/show``,
    llama.cpp's ``/props``, else the ``meta`` of ``/v1/models``. Never raises.
    """
    root = _root_url(settings)
    headers = {"Authorization": f"Bearer {settings.llm_api_key}"} if settings.llm_api_key else {}
    model = settings.default_model
    result: dict[str, Any] = {"n_ctx": None, "source": None}
    ollama = settings.llm_backend.strip().lower() != "openai"

    async def get_json(client: httpx.AsyncClient, method: str, url: str, **kw: Any) -> Any:
        try:
            response = await client.request(method, url, headers=headers, **kw)
            return response.json() if response.status_code < 400 else None
        except (httpx.HTTPError, ValueError):
            return None

    with trio.move_on_after(2 * LLM_PING_TIMEOUT + 1):
        async with httpx.AsyncClient(timeout=LLM_PING_TIMEOUT) as client:
            if ollama:
                url = f"{root}/api/show"
                found = _ollama_window(await get_json(client, "POST", url, json={"model": model}))
                if found:
                    result.update(found, source=url)
            else:
                props = await get_json(client, "GET", f"{root}/props")
                models = None if props else await get_json(client, "GET", f"{root}/v1/models")
                n_ctx = _llama_window(props, models, model)
                if n_ctx:
                    where = "/props" if _llama_window(props, None, model) else "/v1/models"
                    result.update(n_ctx=n_ctx, source=f"{root}{where}")
    return result


def window_warning(settings: Settings, context: dict[str, Any]) -> str | None:
    n_ctx = context.get("n_ctx")
    if not isinstance(n_ctx, int) or n_ctx >= settings.num_ctx:
        return None
    return (
        f"the server's context window is {n_ctx} tokens ({context['source']}), below "
        f"OLLAMA_NUM_CTX={settings.num_ctx}: a prompt past {n_ctx} tokens will fail (llama.cpp "
        f"answers with an empty body). Set OLLAMA_NUM_CTX={n_ctx} or give the server a "
        "larger context"
    )
