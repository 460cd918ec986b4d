"""What the `navi` command says when something is wrong: one line naming the problem and
the next step, never an internal code or a traceback.

Rules as in tests/test_cli.py: real `navi` processes (forked from the warm fork server,
tests/navi_forks.py) where the output of the command is the point, the fake LLM on
127.0.0.1 (port 0), the DB and the data folder under tmp_path, an absolute deadline on
every test, nothing sleeps.
"""

from __future__ import annotations

import io
from pathlib import Path

import navi_forks
import pytest
import trio
from daemons import no_plan_config
from test_cli import ANSWER, PROFILES, _one_error_line, fake_llm, forked

from navi_trio.cli.doctor import collect_doctor, print_doctor
from navi_trio.errors import ConfigError
from navi_trio.llm import local
from navi_trio.settings import Settings

pytestmark = pytest.mark.slow  # its tests start processes

DEADLINE = 60
DOWN = "ws://127.0.0.1:9"  # no daemon there


async def test_the_doctor_says_a_model_file_is_missing_as_navi_run_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "llama_installed", lambda: True)  # the extra is there
    missing = tmp_path / "nope.gguf"
    settings = Settings.from_env(
        {}, db_path=tmp_path / "navi.db", data_dir=tmp_path / "data", llm_backend="local",
        model_file=missing,
    )  # fmt: skip
    with trio.fail_after(DEADLINE):
        report = await collect_doctor(settings, DOWN, environ={})
    with pytest.raises(ConfigError) as said:  # what `navi run --local` says
        local.resolve_model_file(missing)
    assert report["llm"]["error"] == str(said.value)
    assert f"model file '{missing}'" in str(said.value) and "not found" in str(said.value)
    out = io.StringIO()
    print_doctor(report, out)
    assert f"llama-cpp-python installed, but model file '{missing}'" in out.getvalue()
    assert "pip install" not in out.getvalue()  # the extra is installed: not the fix


async def test_a_run_ended_by_its_budget_says_which_budget(
    env: dict[str, str], tmp_path: Path
) -> None:
    config = no_plan_config(tmp_path, budgets={"turn": {"tool_calls": 1}})
    (tmp_path / "a.txt").write_text("hi\n")
    read = {"name": "filesystem", "arguments": {"action": "read", "path": "a.txt"}}
    async with fake_llm(tmp_path, [{"tool_calls": [read]}]) as url:  # again and again
        done = await forked(
            "run", "--llm-url", url, "--backend", "ollama", "--config", str(config),
            "read a.txt", env=env, cwd=tmp_path,
        )  # fmt: skip
    assert done.code == 1
    assert _one_error_line(done) == (
        "navi: error: the turn budget of 1 tool calls is spent (1 used)"
    )


async def test_the_daemons_refusals_are_its_words_and_what_to_do(
    env: dict[str, str], tmp_path: Path
) -> None:
    data = Path(env["NAVI_DATA_DIR"])
    async with (
        fake_llm(tmp_path, [{"text": ANSWER}]) as llm,
        navi_forks.serving(env, llm) as daemon,
    ):
        url = daemon.url

        async def said(*args: str) -> str:
            done = await forked(*args, "--url", url, env=env, cwd=tmp_path)
            assert done.code == 1 and done.out == "", done
            line = _one_error_line(done)
            assert done.err_lines == [line], done.err  # no `session: s-…` of a refused run
            return line

        # Empty lists say so.
        for args, text in ((("tasks",), "no tasks"), (("schedule", "list"), "no schedules"),
                           (("sessions",), "no sessions")):  # fmt: skip
            done = await forked(*args, "--url", url, env=env, cwd=tmp_path)
            assert (done.code, done.out, done.err) == (0, text + "\n", ""), done
        # The daemon's words, without its wire code.
        assert await said("schedule", "add", "--new", "--every", "10", "hi") == (
            "navi: error: every '10': add a unit: 10m (or s, h, d)"
        )
        assert await said("run", "--profile", "nosuch", "hi") == (
            f"navi: error: unknown profile 'nosuch' (known: {', '.join(PROFILES)})"
        )
        # A wrong token: where the local admin's is.
        assert await said("sessions", "--token", "wrong") == (
            "navi: error: the daemon refused the token (unknown token: ask an admin for one "
            "(`navi users add NAME`)); on a machine of your own the local admin's token is in "
            f"{data / 'local-token'}: leave out --token and NAVI_TOKEN to use it"
        )
