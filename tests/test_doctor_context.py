"""`navi doctor` shows the server's context window and warns when OLLAMA_NUM_CTX is larger.

Against the fake server (real HTTP on 127.0.0.1, port 0), which answers Ollama's
``POST /api/show``, llama.cpp's ``GET /props`` and ``/v1/models`` with a configurable
``n_ctx``. Every test has an absolute timeout.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import trio

from navi_trio.cli.doctor import collect_doctor, print_doctor
from navi_trio.cli.doctor_llm import _llama_window, server_context
from navi_trio.settings import Settings
from navi_trio.testing.fake_llm import open_fake_llm

TIMEOUT = 20


def settings_for(url: str, backend: str, tmp_path: Path, **kw: Any) -> Settings:
    return Settings.from_env(
        {},
        llm_url=url,
        llm_backend=backend,
        db_path=tmp_path / "navi.db",
        data_dir=tmp_path / "data",
        default_model="fake-model",
        **kw,
    )


@pytest.mark.parametrize("backend", ["ollama", "openai"])
async def test_doctor_shows_the_window_and_warns_when_num_ctx_is_larger(
    tmp_path: Path, backend: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm(n_ctx=2048) as server:
            report = await collect_doctor(settings_for(server.url, backend, tmp_path))
    context = report["llm"]["context"]
    assert context["n_ctx"] == 2048
    path = "/api/show" if backend == "ollama" else "/props"
    assert context["source"] == server.url + path
    (warning,) = [w for w in report["warnings"] if "context window" in w]
    assert "2048" in warning and "OLLAMA_NUM_CTX=8192" in warning
    out = io.StringIO()
    print_doctor(report, out)
    assert "context window 2048 tokens" in out.getvalue()
    assert "warning: the server's context window is 2048 tokens" in out.getvalue()


@pytest.mark.parametrize("backend", ["ollama", "openai"])
async def test_no_warning_when_the_window_is_large_enough(tmp_path: Path, backend: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm(n_ctx=32768) as server:
            report = await collect_doctor(
                settings_for(
                    server.url + ("/v1" if backend == "openai" else ""),
                    backend,
                    tmp_path,
                    num_ctx=8192,
                )
            )
    assert report["llm"]["context"]["n_ctx"] == 32768
    assert not [w for w in report["warnings"] if "context window" in w]


async def test_a_server_that_does_not_say_is_no_error(tmp_path: Path) -> None:
    # llama-cpp-python 0.3 has no /props and no meta in /v1/models; Ollama-only
    # endpoints are 404 on an OpenAI-only server.
    with trio.fail_after(TIMEOUT):
        async with open_fake_llm(dialects=("ollama",)) as server:
            settings = settings_for(server.url, "openai", tmp_path)
            assert await server_context(settings) == {"n_ctx": None, "source": None}


def test_llama_window_reads_props_first_then_the_model_meta() -> None:
    props = {"default_generation_settings": {"n_ctx": 4096}}
    models = {
        "data": [
            {"id": "other", "meta": {"n_ctx_train": 1}},
            {"id": "m", "meta": {"n_ctx_train": 131072}},
        ]
    }
    assert _llama_window(props, models, "m") == 4096
    assert _llama_window(None, models, "m") == 131072
    assert _llama_window({"n_ctx": "x"}, {"data": [{"id": "m"}]}, "m") is None
