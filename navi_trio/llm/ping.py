"""Does the LLM endpoint answer: its model list, asked once, bounded in time.

`navi doctor` shows it, and a daemon's `/readyz` (api/health.py) asks it. It never
raises: a server that does not answer is a result naming why.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from navi_trio.settings import Settings

LLM_PING_TIMEOUT = 3.0


def _models_url(settings: Settings) -> str:
    base = settings.llm_url.rstrip("/")
    if settings.llm_backend.strip().lower() == "openai":
        return f"{base}/models" if base.endswith("/v1") else f"{base}/v1/models"
    return f"{base}/api/tags"


async def ping_llm(settings: Settings) -> dict[str, Any]:
    """GET the endpoint's model list: ``{"url", "ok", "models"|"error"}``."""
    timeout = LLM_PING_TIMEOUT
    url = _models_url(settings)
    headers = {"Authorization": f"Bearer {settings.llm_api_key}"} if settings.llm_api_key else {}
    result: dict[str, Any] = {"url": url, "ok": False}
    # The httpx timeout bounds each phase; the cancel scope bounds the whole exchange.
    with trio.move_on_after(timeout + 1):
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                response = await client.get(url, headers=headers)
            if response.status_code >= 400:
                result["error"] = f"HTTP {response.status_code}: {response.text.strip()[:200]}"
                return result
            data = response.json()
            if settings.llm_backend.strip().lower() == "openai":
                models = [m.get("id", "?") for m in data.get("data", [])]
            else:
                models = [m.get("name", "?") for m in data.get("models", [])]
        except httpx.HTTPError as exc:
            result["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return result
        except (ValueError, AttributeError, TypeError):
            result["error"] = "the answer is not the JSON model list this backend sends"
            return result
        result.update(ok=True, models=[str(m) for m in models])
        return result
    result["error"] = f"no answer within {timeout:g} s"
    return result
