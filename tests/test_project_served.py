"""`navi run`, `navi chat`'s /context, the `context` frame and the page see the same
project files, through a real `navi serve` (and headless Chromium for the page).

The fixture repository (tests/fixtures/project/) is copied with a ``.git`` folder made
at its top, and the daemon's own folder (``$XDG_CONFIG_HOME/navi``) holds an AGENTS.md
and a skill. The fake LLM on 127.0.0.1 records what the model was sent. Every test has
an absolute time limit.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_tools import call, with_tools
from daemons import connect_as
from reliability import navi_serve
from served import config_file
from test_cli import forked
from test_client_real import forked_chat
from web_browser import Daemon, Loop, browser, needs_browser

from navi_trio.testing import open_harness
from navi_trio.testing.fake_llm import FakeLLMServer
from navi_trio.tools.sandbox import sandbox_available

__all__ = ["browser"]  # a fixture
pytestmark = pytest.mark.slow
DEADLINE = 120
FIXTURE = Path(__file__).parent / "fixtures" / "project"
OK, REASON = sandbox_available()
needs_sandbox = pytest.mark.skipif(not OK, reason=f"the sandbox is unavailable: {REASON}")


def make_repo(base: Path) -> tuple[Path, Path]:
    """The fixture repository under `base`, and the XDG config folder holding navi's own
    user folder."""
    repo = base / "repo"
    shutil.copytree(FIXTURE, repo)
    (repo / ".git").mkdir()
    xdg = base / "xdg"
    skill = xdg / "navi" / "skills" / "user-notes"
    skill.mkdir(parents=True)
    (xdg / "navi" / "AGENTS.md").write_text("USER-AGENTS: answer in English.\n")
    (skill / "SKILL.md").write_text(
        "---\nname: user-notes\ndescription: The user's own way to take notes.\n---\nBODY\n"
    )
    return repo, xdg


def headers(system: str) -> list[str]:
    """The instruction files a system message holds, in its order."""
    return re.findall(r"^## (/\S+)$", system, re.M)


async def test_navi_run_navi_chat_and_the_context_frame_see_the_same_files(
    env: dict[str, str], tmp_path: Path
) -> None:
    repo, xdg = make_repo(tmp_path)
    cwd = repo / "docs" / "api"
    config = config_file(tmp_path / "config", None)
    env = {**env, "XDG_CONFIG_HOME": str(xdg), "NAVI_CONFIG": str(config)}
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            llm = await nursery.start(FakeLLMServer([{"text": "ok"}], loop=True).serve)
            # Forked from the warm fork server (tests/navi_forks.py): the subject is what
            # the daemon and the commands see, not how Python starts them.
            log = tmp_path / "daemon.log"
            async with navi_serve(env, llm.url, log, forked=True) as daemon:
                url = daemon.url.rstrip("/")
                done = await forked("run", "--url", url, "hi", env=env, cwd=cwd)
                assert done.code == 0, done
                doctor = await forked("doctor", "--cwd", str(cwd), "--json", env=env, cwd=tmp_path)
                system = llm.chat_requests[-1]["body"]["messages"][0]["content"]
                token = (Path(env["NAVI_DATA_DIR"]) / "local-token").read_text().strip()
                async with connect_as(url, token) as client:
                    listing = await client.request({"type": "context", "cwd": str(cwd)})
                async with forked_chat(env, cwd, "--url", url) as c:
                    await c.line("/context")
                    for f in listing["files"]:
                        tail = "/".join(Path(f["path"]).parts[-2:])
                        await c.expect(re.escape(tail) + r"\s+\(" + str(f["size"]) + " bytes")
                    await c.expect(r"skills: 4")
                    await c.expect(r"wrong-name/SKILL\.md: skipped: the name 'another-name'")
                    assert await c.quit() == 0
            nursery.cancel_scope.cancel()
    paths = [f["path"] for f in listing["files"]]
    assert paths == [
        str(xdg / "navi" / "AGENTS.md"),
        str(repo / "AGENTS.md"),
        str(repo / "docs" / "CLAUDE.md"),
        str(cwd / "AGENTS.md"),
    ]
    assert headers(system) == paths  # what `navi run`'s run was given
    report = json.loads(doctor.out)["project"]
    assert [(f["path"], f["size"]) for f in report["files"]] == [
        (f["path"], f["size"]) for f in listing["files"]
    ]
    assert "DOCS-CLAUDE" in system and "- api-style: " in system


@pytest.fixture
def loop() -> Iterator[Loop]:
    started = Loop().start()
    try:
        yield started
    finally:
        started.stop()


@needs_browser
def test_the_pages_context_panel_shows_what_its_runs_get(
    tmp_path: Path, browser: Any, loop: Loop
) -> None:
    _, xdg = make_repo(tmp_path)
    daemon = Daemon(tmp_path, loop.llm.url)
    daemon.env["XDG_CONFIG_HOME"] = str(xdg)
    config = json.loads(daemon.config.read_text())
    config["profiles"]["general"]["tools"]["agent"].append("skill")
    daemon.config.write_text(json.dumps(config))
    loop.add_replies({"text": "ok"})
    try:
        daemon.start()
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        context.set_default_timeout(20_000)
        try:
            page = context.new_page()
            page.goto(daemon.url)
            page.fill("#login-token", daemon.admin_token())
            page.click("#login-submit")
            page.wait_for_selector("#conn-state.up")
            page.fill("#input", "hi")
            page.press("#input", "Enter")
            page.wait_for_selector(".lane.main .answer >> text=ok")
            page.click("#toggle-context")
            page.wait_for_selector("#context .context-files li")
            files = page.locator("#context .context-files li").all_inner_texts()
            skills = page.locator("#context .context-skills li").all_inner_texts()
        finally:
            context.close()
    finally:
        daemon.stop()
    user_file = xdg / "navi" / "AGENTS.md"
    size = user_file.stat().st_size
    assert files == [f"{user_file} ({size} bytes; user)"]  # the page's runs carry no cwd
    assert skills == ["user-notes: The user's own way to take notes."]
    system = loop.llm.chat_requests[-1]["body"]["messages"][0]["content"]
    assert headers(system) == [str(user_file)]  # what its run was given
    assert "- user-notes: " in system


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder outside /tmp (the sandbox's /tmp is private), open to others (a root
    daemon's commands run as nobody), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="navi-project-", dir="/var/tmp")).resolve()
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_sandbox
async def test_a_skills_script_runs_in_the_sandbox_by_the_path_its_body_gives(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, xdg = make_repo(outside)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    script = repo / ".claude" / "skills" / "pdf-forms" / "scripts" / "fill.py"
    replies = [
        {"tool_calls": [{"name": "skill", "arguments": {"name": "pdf-forms"}}]},
        call("terminal", action="run", command=f"python3 {script} form.pdf values.json"),
        {"text": "done"},
    ]
    profiles = {"general": with_tools(["skill", "terminal"], planning_first_message=False)}
    with trio.fail_after(DEADLINE):
        async with open_harness(tmp_path, replies=replies, profiles=profiles) as h:
            ann = await h.user("ann", "admin")
            frames = await h.turn(
                "s1", "fill the form", cwd=repo / "docs" / "api", user_id=ann, user_role="admin"
            )
    body, ran = [f for f in frames if f["type"] == "tool_result"]
    assert str(script.parent.parent) in body["output"]  # the body names the folder
    assert ran["ok"] and "would fill ['form.pdf', 'values.json']" in ran["output"], ran
