"""Which LLM backend runs when none is configured, and the `--local` options.

Ollama answering is the fake LLM server on 127.0.0.1; Ollama not answering is a closed
port, or a listener that never replies (bounded by the probe's timeout on a MockClock);
the `local` extra missing or present is `local_available` monkeypatched, so these run
with or without llama-cpp-python installed.
"""

from __future__ import annotations

import argparse
import io
import socket
from functools import partial
from pathlib import Path

import attrs
import pytest
import trio

from navi_trio import cli
from navi_trio.cli.doctor import collect_doctor, print_doctor
from navi_trio.errors import ConfigError
from navi_trio.llm import factory, local
from navi_trio.llm.factory import (
    LOCAL_NUM_CTX,
    PROBE_TIMEOUT,
    backend_configured,
    choose_backend,
    ollama_answers,
)
from navi_trio.settings import Settings
from navi_trio.testing.fake_llm import open_fake_llm


def _closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there any more


@pytest.fixture
def extra(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """`[True]`: the local extra counts as installed; set it to `[False]` for missing."""
    state = [True]
    monkeypatch.setattr(local, "local_available", lambda model_file=None: state[0])
    return state


async def test_ollama_is_used_when_it_answers(
    extra: list[bool], mock_clock: trio.testing.MockClock
) -> None:
    # A clock that stands still: the fake server answers over a real socket, and the
    # probe's 0.5 s bound cannot run out on a loaded machine (it did once, at load 14).
    async with open_fake_llm() as server:
        settings = Settings(llm_url=server.url)
        choice = await choose_backend(settings, {}, configured=False)
    assert choice.settings.llm_backend == "ollama"
    assert choice.settings.num_ctx == settings.num_ctx
    assert choice.note is None


async def test_no_ollama_and_the_extra_installed_uses_the_local_model(extra: list[bool]) -> None:
    url = _closed_url()
    choice = await choose_backend(Settings(llm_url=url), {}, configured=False)
    assert choice.settings.llm_backend == "local"
    assert choice.settings.num_ctx == LOCAL_NUM_CTX
    assert choice.note == (f"no Ollama at {url}: using the embedded local model (SmolLM2-135M)")
    # OLLAMA_NUM_CTX in the environment keeps its window.
    kept = await choose_backend(
        Settings(llm_url=url, num_ctx=16384), {"OLLAMA_NUM_CTX": "16384"}, configured=False
    )
    assert kept.settings.num_ctx == 16384


async def test_neither_says_how_to_get_either_in_one_line(extra: list[bool]) -> None:
    extra[0] = False
    url = _closed_url()
    with pytest.raises(ConfigError) as caught:
        await choose_backend(Settings(llm_url=url), {}, configured=False)
    text = str(caught.value)
    assert "\n" not in text
    assert f"no Ollama answers at {url}" in text
    assert "pip install 'navi-trio[local]'" in text
    assert "ollama serve" in text


async def test_a_configured_backend_is_kept_without_probing(extra: list[bool]) -> None:
    extra[0] = False
    settings = Settings(llm_url=_closed_url(), llm_backend="openai")
    choice = await choose_backend(settings, {"NAVI_LLM_BACKEND": "openai"}, configured=True)
    assert choice.settings == settings and choice.note is None
    assert backend_configured({"OLLAMA_HOST": "h:1"}, given=False)
    assert backend_configured({"NAVI_LLM_BACKEND": "ollama"}, given=False)
    assert backend_configured({}, given=True)
    assert not backend_configured({"OLLAMA_HOST": " "}, given=False)


async def test_the_probe_of_a_server_that_never_answers_is_bounded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        start = trio.current_time()
        assert not await ollama_answers(f"http://127.0.0.1:{port}")
        assert trio.current_time() - start == pytest.approx(PROBE_TIMEOUT, abs=0.01)
        nursery.cancel_scope.cancel()


# -- the command line -----------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["run", *argv, "hi"])


def test_local_sets_the_backend_and_model_file_and_refuses_another_llm(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    settings = cli.load_settings(_args("--local", "--model-file", str(gguf)), {})
    assert settings.llm_backend == "local"
    assert settings.model_file == gguf
    for other in (["--backend", "ollama"], ["--llm-url", "http://h:1"]):
        with pytest.raises(cli.UsageError, match="--local runs the embedded model"):
            cli.load_settings(_args("--local", *other), {})


def test_local_means_a_small_window_and_the_local_profile(extra: list[bool]) -> None:
    err = io.StringIO()
    settings = cli.llm_settings(_args("--local"), err, {})
    assert (settings.llm_backend, settings.num_ctx) == ("local", LOCAL_NUM_CTX)
    assert err.getvalue() == ""  # chosen by the user: nothing to say
    source = cli.config_source(settings)
    assert source.current.default_profile == "local"
    assert source.reload()  # a reload keeps it
    assert source.current.default_profile == "local"
    window = cli.llm_settings(_args("--local"), err, {"OLLAMA_NUM_CTX": "2048"})
    assert window.num_ctx == 2048
    plain = cli.config_source(Settings(llm_backend="ollama"))
    assert plain.current.default_profile == "general"


def _no_llm_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ollama: bool) -> None:
    for name in ("NAVI_LLM_BACKEND", "OLLAMA_HOST", "OLLAMA_NUM_CTX", "NAVI_MODEL_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NAVI_DB", str(tmp_path / "navi.db"))
    monkeypatch.setenv("NAVI_DATA_DIR", str(tmp_path / "data"))

    async def probe(url: str, timeout: float = PROBE_TIMEOUT) -> bool:  # noqa: ASYNC109
        assert url == "http://127.0.0.1:11434"  # the default URL
        return ollama

    monkeypatch.setattr(factory, "ollama_answers", probe)


def test_nothing_configured_and_no_ollama_says_the_local_model_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, extra: list[bool]
) -> None:
    _no_llm_env(monkeypatch, tmp_path, ollama=False)
    err = io.StringIO()
    settings = cli.llm_settings(_args(), err)
    assert settings.llm_backend == "local"
    assert err.getvalue() == (
        "navi: no Ollama at http://127.0.0.1:11434: using the embedded local model (SmolLM2-135M)\n"
    )
    monkeypatch.setattr(local, "resolve_model_file", lambda path: tmp_path / "m.gguf")
    chat = cli.build_parser().parse_args(["chat"])
    assert cli.serve_args_for_chat(chat, io.StringIO()) == ["--local"]


def test_nothing_configured_and_ollama_answering_starts_an_ollama_daemon(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, extra: list[bool]
) -> None:
    _no_llm_env(monkeypatch, tmp_path, ollama=True)
    err = io.StringIO()
    chat = cli.build_parser().parse_args(["chat"])
    assert cli.serve_args_for_chat(chat, err) == ["--backend", "ollama"]
    assert err.getvalue() == ""


def test_nothing_at_all_is_one_error_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    extra: list[bool],
    capsys: pytest.CaptureFixture[str],
) -> None:
    extra[0] = False
    _no_llm_env(monkeypatch, tmp_path, ollama=False)
    assert cli.main(["run", "hello"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("navi: error: no LLM to talk to: no Ollama answers at ")
    assert "pip install 'navi-trio[local]'" in lines[0]
    assert not (tmp_path / "navi.db").exists()  # nothing was started


# -- navi doctor ----------------------------------------------------------------------------


@pytest.mark.slow
async def test_doctor_reports_the_local_model_and_the_backend_it_would_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[bool]
) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"\0" * 2_500_000)
    monkeypatch.setattr(local, "llama_installed", lambda: True)
    settings = Settings(
        llm_url=_closed_url(),
        model_file=gguf,
        db_path=tmp_path / "navi.db",
        data_dir=tmp_path / "data",
    )
    report = await collect_doctor(settings, _closed_url().replace("http", "ws"),
                                  configured=False, environ={})  # fmt: skip
    assert report["local"] == {
        "llama_cpp": True,
        "file": str(gguf),
        "size_bytes": 2_500_000,
        "ok": True,
    }
    assert report["backend"]["name"] == "local"
    assert "no Ollama at" in report["backend"]["why"] and "tiny.gguf" in report["backend"]["why"]
    assert report["llm"] == {"backend": "local", "url": str(gguf), "ok": True, "models": ["tiny"]}
    assert report["settings"]["num_ctx"] == LOCAL_NUM_CTX
    out = io.StringIO()
    print_doctor(report, out)
    assert f"local model  installed: {gguf} (2.5 MB)" in out.getvalue()
    assert "backend      local: no Ollama at" in out.getvalue()

    # Neither Ollama nor the extra: the doctor says so (a warning: it still reports).
    extra[0] = False
    monkeypatch.setattr(local, "llama_installed", lambda: False)
    report = await collect_doctor(attrs.evolve(settings, model_file=None),
                                  configured=False, environ={})  # fmt: skip
    assert report["backend"]["name"] is None
    assert report["local"]["llama_cpp"] is False and report["local"]["ok"] is False
    assert any("pip install 'navi-trio[local]'" in w for w in report["warnings"])
    out = io.StringIO()
    print_doctor(report, out)
    assert "local model  not installed (pip install 'navi-trio[local]')" in out.getvalue()

    # Configured: kept, and said so.
    async with open_fake_llm() as server:
        report = await collect_doctor(attrs.evolve(settings, llm_url=server.url))
    assert report["backend"]["name"] == "ollama" and "configured" in report["backend"]["why"]
    assert report["llm"]["ok"] is True
