"""The embedded model's health check, as `navi doctor` runs it.

`local_model_info` says what is installed (llama-cpp-python, which GGUF, how big)
without importing llama_cpp. `check_local_model` generates one token in a model host
process of its own (llm/host.py: never in the caller's process), with llama.cpp's extra
buffer types as a daemon would start it; when that dies with them on, it tries once
more without them, so the report can name the setting that fixes it. It only reads:
nothing it finds is remembered in the data folder (``data_dir`` is not given to the host).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from navi_trio.errors import ConfigError, LLMError
from navi_trio.llm import host_state, local
from navi_trio.llm.base import ChatRequest
from navi_trio.llm.host import SEE_DOCTOR
from navi_trio.settings import Settings

LOCAL_CHECK_TIMEOUT = 120.0  # one token, model load included, on a loaded machine


def local_model_info(model_file: Path | None) -> dict[str, Any]:
    """The embedded model: is llama-cpp-python installed, which GGUF, how big; when it
    cannot run, ``error`` says why as `navi run --local` does (the extra, or the file)."""
    path = model_file or local.default_model_file()
    info: dict[str, Any] = {
        "llama_cpp": local.llama_installed(),
        "file": str(path) if path else None,
        "size_bytes": path.stat().st_size if path and path.is_file() else None,
    }
    try:
        local.resolve_model_file(model_file)  # what `navi run --local` would say
    except ConfigError as exc:
        info["error"] = str(exc)
    info["ok"] = bool(info["llama_cpp"] and info["size_bytes"])
    return info


async def one_token(settings: Settings, extra_buffers: bool) -> dict[str, Any]:
    """One generated token in a model host process of its own: ``{"ok", "seconds",
    "system_info"}`` or ``{"ok": False, "error", "stderr"}``."""
    request = ChatRequest([{"role": "user", "content": "Hi"}], "local", options={"max_tokens": 1})
    started = trio.current_time()
    async with local.open_local_backend(
        settings.model_file,
        n_ctx=settings.num_ctx,
        threads=settings.local_threads,
        extra_buffers=extra_buffers,
    ) as backend:
        try:
            with trio.fail_after(LOCAL_CHECK_TIMEOUT):
                async with backend.stream_chat(request) as chunks:
                    async for _ in chunks:
                        pass
        except (LLMError, trio.TooSlowError) as exc:
            death = backend.host.last_death or {}
            error = str(exc).removesuffix(f" — {SEE_DOCTOR}") or (
                f"no token within {LOCAL_CHECK_TIMEOUT:g} s"
            )
            return {"ok": False, "error": error, "stderr": death.get("stderr", [])}
        info = backend.host.status()
    return {
        "ok": True,
        "seconds": round(trio.current_time() - started, 2),
        "system_info": info.get("system_info", ""),
    }


async def check_local_model(settings: Settings) -> dict[str, Any]:
    """`one_token` with the extra buffer types a daemon would use (the setting, else what
    was remembered for this CPU, else on); failing with them on, once more without."""
    try:
        setting = local.extra_buffers_setting(settings.local_extra_buffers)
    except ConfigError as exc:
        return {"ok": False, "error": str(exc), "stderr": [], "extra_buffers": None}
    state = await trio.to_thread.run_sync(host_state.read_state, settings.data_dir)
    key = await trio.to_thread.run_sync(host_state.state_key)
    remembered = host_state.remembered_extra_buffers(state, key)
    extra = setting if setting is not None else remembered is not False
    result = {**await one_token(settings, extra), "extra_buffers": extra, "key": key}
    result["broken"] = state.get("broken")  # what a daemon marked (llm/host.py)
    if result["ok"] or not extra:
        if not result["ok"]:
            result["fix"] = rebuild_hint(result["error"])
        return result
    without = await one_token(settings, False)
    if without["ok"]:
        result["fix"] = (
            f"without llama.cpp's extra buffer types (weight repacking, AMX on recent Xeons) "
            f"it answers: set {local.EXTRA_BUFFERS_ENV}=0"
            + ("" if setting is None else f" (it is {settings.local_extra_buffers!r} now)")
        )
    else:
        result["fix"] = rebuild_hint(without["error"])
    return result


def rebuild_hint(error: str) -> str:
    """What to do about a check that failed either way."""
    if "SIGILL" in error:
        return (
            "this llama-cpp-python uses instructions this CPU lacks: rebuild it portably "
            "(docs/pages/getting-started.md, Install: scripts/install_llama_cpp.sh)"
        )
    return "see the last lines of its stderr above, and the daemon log"
