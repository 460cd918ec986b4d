"""The examples of the README and the docs run as written, so the docs cannot rot.

The blocks are read from the page that holds them (each follows an ``<!-- example: NAME
-->`` marker: the fake server's on README.md, the harness on docs/pages/development.md).
The ``navi`` command and the harness script run as real subprocesses with an absolute
deadline; the fake LLM server listens on 127.0.0.1, port 0 (the README's fixed
port is the one thing replaced); the DB lives under tmp_path. Nothing sleeps.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import trio
from doc_examples import README, doc_example, run_python, section

from navi_trio.llm.script import load_script
from navi_trio.testing.fake_llm import FakeLLMServer

pytestmark = pytest.mark.slow  # its tests start processes

DEADLINE = 60


def block(name: str, lang: str) -> str:
    """The fenced block right after the ``<!-- example: NAME ... -->`` marker."""
    return doc_example(name, lang)


def commands(heading: str) -> list[list[str]]:
    """The ``sh`` commands of a README section, split as the shell would."""
    blocks = re.findall(r"```sh\n(.*?)```", section(README, heading), re.S)
    return [shlex.split(line) for b in blocks for line in b.splitlines() if line.strip()]


async def navi_run(url: str, message: str, tmp_path: Path) -> CompletedProcess[bytes]:
    args = ("-m", "navi_trio", "run", "--llm-url", url, message)
    return await run_python(tmp_path, *args, deadline=DEADLINE)


async def test_the_fake_server_example_prints_its_answer_as_written(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(block("fake-server", "json"), encoding="utf-8")
    server_cmd, run_cmd = commands("## Try it without a model")
    assert server_cmd[:3] == ["python", "-m", "navi_trio.testing.fake_llm"]
    assert server_cmd[server_cmd.index("--script") + 1] == script.name
    assert "--loop" not in server_cmd  # every reply must be used exactly once
    assert run_cmd[:2] == ["navi", "run"] and run_cmd[2] == "--llm-url"
    message = run_cmd[-1]
    answer = json.loads(script.read_text(encoding="utf-8"))[-1]["text"]
    assert f"It prints `{answer}`" in README.read_text(encoding="utf-8")

    async with trio.open_nursery() as nursery:
        fake = FakeLLMServer(load_script(script))  # what the fake_llm command serves
        await nursery.start(fake.serve)
        done = await navi_run(fake.url, message, tmp_path)
        nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == answer + "\n"
    assert len(fake.chat_requests) == len(load_script(script))  # planning took the first
    assert (tmp_path / "xdg" / "navi" / "navi.db").is_file()  # XDG_DATA_HOME, as documented


async def test_a_greeting_uses_one_reply_as_the_readme_says(tmp_path: Path) -> None:
    answer = json.loads(block("fake-server", "json"))[-1]["text"]
    async with trio.open_nursery() as nursery:
        fake = FakeLLMServer([{"text": answer}])
        await nursery.start(fake.serve)
        done = await navi_run(fake.url, "hi", tmp_path)
        nursery.cancel_scope.cancel()
    assert done.returncode == 0 and done.stdout.decode() == answer + "\n", done.stderr.decode()


async def test_the_harness_example_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "harness_demo.py"
    script.write_text(block("harness", "python"), encoding="utf-8")
    done = await run_python(tmp_path, str(script), deadline=DEADLINE)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == "Hello!\n"
