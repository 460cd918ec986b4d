"""`navi doctor` with the embedded model: a one-token generation in a child process.

Real parts: the model host process and the real SmolLM2-135M model. A crash is the
child's own test switch (``NAVI_MODEL_HOST_CRASH``, llm/model_host.py): ``SIGILL:extra``
dies at the first token computed with llama.cpp's extra buffer types, which is what the
AMX fault of issue 18 looks like. Skipped when the `local` extra is missing.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import trio
from real_models import THREADS

from navi_trio.cli.doctor import collect_doctor, print_doctor
from navi_trio.llm import host_state
from navi_trio.llm.local import default_model_file, llama_installed
from navi_trio.settings import Settings

if not llama_installed() or default_model_file() is None:
    pytest.skip("the `local` extra is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow

TIMEOUT = 240
DOWN = "ws://127.0.0.1:9"  # no daemon there


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(
        {}, db_path=tmp_path / "navi.db", data_dir=tmp_path / "data", num_ctx=2048,
        llm_backend="local", local_threads=THREADS,
    )  # fmt: skip


async def test_the_doctor_runs_one_token_in_a_child_and_says_ok(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        report = await collect_doctor(_settings(tmp_path), DOWN, environ={})
    check = report["local_check"]
    assert check["ok"] is True and check["extra_buffers"] is True
    assert "AVX" in check["system_info"] or "NEON" in check["system_info"]
    out = io.StringIO()
    print_doctor(report, out)
    assert "one token in a child process: OK in" in out.getvalue()
    assert not (tmp_path / "data").exists()  # the doctor only reads


async def test_the_doctor_names_the_signal_and_the_setting_that_fixes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NAVI_MODEL_HOST_CRASH", "SIGILL:extra")
    with trio.fail_after(TIMEOUT):
        report = await collect_doctor(_settings(tmp_path), DOWN, environ={})
    check = report["local_check"]
    assert check["ok"] is False and check["extra_buffers"] is True
    assert check["error"] == "the local model process died (SIGILL, illegal instruction)"
    assert "set NAVI_LOCAL_EXTRA_BUFFERS=0" in check["fix"]
    assert any("one-token generation" in w and "SIGILL" in w for w in report["warnings"])
    out = io.StringIO()
    print_doctor(report, out)
    text = out.getvalue()
    assert "(extra buffer types on): FAILED: the local model process died (SIGILL" in text
    assert "| model host: NAVI_MODEL_HOST_CRASH: SIGILL" in text  # its stderr
    assert "fix: without llama.cpp's extra buffer types" in text


async def test_the_doctor_shows_what_a_daemon_marked_broken(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    broken = {"message": "the local model is broken: … SIGILL …", "at": "2025-01-01 10:00:00"}
    (data / host_state.STATE_FILE).write_text(json.dumps({"broken": broken}))
    with trio.fail_after(TIMEOUT):
        report = await collect_doctor(_settings(tmp_path), DOWN, environ={})
    assert report["local_check"]["broken"] == broken
    out = io.StringIO()
    print_doctor(report, out)
    assert "a daemon marked it broken at 2025-01-01 10:00:00: the local model is broken" in (
        out.getvalue()
    )
