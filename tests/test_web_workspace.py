"""The browser client's working folder, rewind / undo / fork and changed files, in
headless Chromium against a real `navi serve` (its config giving the admin one
workspace root) and the fake LLM server: a folder picked in the picker is where the
tools run; a rewind with files shows the daemon's preview, puts the files and the chat
back and the message into the input box, and the branch list undoes it; a fork opens in
a new tab; the changed-files panel shows a filesystem edit and a terminal ``sed -i`` as
diffs, and an edit's tool card its diff. Folder names, file names and diff content
with markup in them are shown as text. Screenshots of each state (NAVI_TEST_SHOTS=1) go to
tests/artifacts/. Rules and helpers: tests/web_browser.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_web_resilience import XSS
from tool_user import open_to_tools
from web_browser import (
    Daemon,
    Shared,
    Site,
    browser,
    needs_browser,
    send,
    shared_site,
    sharing,
    shot,
)

__all__ = ["browser", "shared_site"]  # fixtures
pytestmark = [pytest.mark.slow, needs_browser]  # a browser, a daemon

MARKUP = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The admin's one workspace root, for the module's daemon, open to its tool user."""
    root = (tmp_path_factory.mktemp("work") / "projects").resolve()
    root.mkdir()
    open_to_tools(root)
    return root


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, root: Path) -> Iterator[Shared]:
    """The module's daemon (tests/web_browser.py), its config giving the admin role
    (every test's user) the one workspace root."""

    def with_root(daemon: Daemon) -> None:
        cfg = json.loads(daemon.config.read_text())
        cfg["workspace_roots"] = {"admin": [str(root)]}
        daemon.config.write_text(json.dumps(cfg))

    yield from sharing(tmp_path_factory, with_root)


@pytest.fixture
def work(root: Path, tmp_path: Path) -> Path:
    """The workspace root as new for each test (the same folder: the daemon pinned it):
    an ``app`` folder and a folder named with markup, nothing else (made as the test's
    own files are, under `tmp_path`'s umask)."""
    for entry in root.iterdir():
        shutil.rmtree(entry)
    (root / "app").mkdir()
    (root / MARKUP).mkdir()
    return root


@pytest.fixture
def site(shared_site: Site) -> Site:
    """The module's shared daemon, a new user of the test's own."""
    return shared_site


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def lines(locator: Any) -> list[str]:
    """The texts of a diff's line elements, each without its line end."""
    return [t.rstrip("\n") for t in locator.all_inner_texts()]


def pick_folder(page: Any, work: Path, name: str) -> None:
    page.click("#folder-button")
    page.click(f".side-panel .starts .folder-entry[data-path='{work}']")
    page.wait_for_selector(f'.folder-path >> text="{work}"')
    page.locator(".folder-entry", has_text=name).click()
    page.wait_for_selector(f'.folder-path >> text="{work / name}"')


def test_a_folder_picked_is_where_the_tools_run(site: Site, work: Path) -> None:
    site.loop.add_replies(
        {"tool_calls": [tool("terminal", action="run", command="pwd")]},
        {"tool_calls": [tool("filesystem", action="write", path="made.txt", content="here\n")]},
        {"text": "done"},
    )
    page = site.page(signed_in=True)
    assert page.locator("#session-folder").inner_text() == "in a new session folder"
    page.click("#folder-button")
    page.wait_for_selector(".side-panel .starts .folder-entry")
    assert page.locator(".starts .folder-entry").all_inner_texts() == [str(work)]
    page.click(f".starts .folder-entry[data-path='{work}']")
    page.wait_for_selector(f'.folder-path >> text="{work}"')
    names = page.locator(".children .folder-entry").all_inner_texts()
    assert names == [f"{MARKUP}/", "app/"], names  # markup shown as text, not an image
    assert page.locator(".side-panel img").count() == 0
    shot(page, "folder-picker")
    page.locator(".folder-entry", has_text="app").click()
    page.wait_for_selector(f'.folder-path >> text="{work / "app"}"')
    page.click(".folder-use")
    page.wait_for_selector(".side-panel", state="detached")
    assert page.locator("#session-folder").inner_text() == f"in {work / 'app'}"
    send(page, "where are you?")
    page.wait_for_selector(".lane.main .answer >> text=done")
    card = page.locator(".tool.ok", has_text="terminal").first
    assert card.locator(".tool-out").inner_text().splitlines()[0] == str(work / "app")
    assert (work / "app" / "made.txt").read_text() == "here\n"
    shot(page, "folder-used")
    # Offered again as a last used folder, and kept by the session after a reload.
    page.reload()
    page.wait_for_selector(".lane.main .answer >> text=done")
    assert page.locator("#session-folder").inner_text() == f"in {work / 'app'}"
    page.click("#folder-button")
    page.wait_for_selector(f".recent .folder-entry[data-path='{work / 'app'}']")
    assert site.dialogs == []


SCRIPT = "<script>alert(1)</script>"
NOTES = "one\ntwo\nthree\n"
TURN_1: list[dict[str, Any]] = [
    {"tool_calls": [tool("filesystem", action="write", path="notes.txt", content=NOTES)]},
    {"text": "wrote the notes"},
]
TURN_2: list[dict[str, Any]] = [
    {"tool_calls": [tool("filesystem", action="edit", path="notes.txt", old="two", new="TWO")]},
    {"tool_calls": [tool("terminal", action="run", command="sed -i s/three/3/ notes.txt")]},
    {"tool_calls": [tool("filesystem", action="write", path="<b>x<b>.txt", content=SCRIPT + "\n")]},
    {"text": "edited the notes"},
]


def test_changes_rewind_undo_and_fork(site: Site, work: Path) -> None:
    site.loop.add_replies(*TURN_1, *TURN_2, {"text": "the fork goes on"})
    notes = work / "app" / "notes.txt"
    page = site.page(signed_in=True)
    pick_folder(page, work, "app")
    page.click(".folder-use")
    send(page, "write the notes")
    page.wait_for_selector(".lane.main .answer >> text=wrote the notes")
    send(page, "edit the notes")
    page.wait_for_selector(".lane.main .answer >> text=edited the notes")
    page.wait_for_selector("#stop:disabled")
    assert notes.read_text() == "one\nTWO\n3\n"
    # The edit's card shows its diff.
    edit = page.locator(".tool", has_text="edit of notes.txt").first
    assert lines(edit.locator(".diff-del")) == ["-two"]
    assert lines(edit.locator(".diff-add")) == ["+TWO"]
    shot(page, "edit-card-diff")
    # The changed files since the second message: the edit and the sed -i in one diff.
    second = page.locator(".user", has_text="edit the notes")
    page.locator(".user-tools").nth(1).locator(".changes-open").click()
    page.wait_for_selector(".changed-file[data-path='notes.txt']")
    diff = page.locator(".changed-file[data-path='notes.txt']")
    assert lines(diff.locator(".diff-del")) == ["-two", "-three"]
    assert lines(diff.locator(".diff-add")) == ["+TWO", "+3"]
    made = page.locator(".changed-file[data-path='<b>x<b>.txt']")
    assert made.locator(".changed-path").inner_text() == "<b>x<b>.txt"
    assert lines(made.locator(".diff-add")) == ["+" + SCRIPT]
    assert page.locator(".side-panel b, .side-panel script").count() == 0
    shot(page, "changes-panel")
    # Folded and unfolded per file.
    made.locator("summary").click()
    assert made.get_attribute("open") is None
    page.click(".panel-close")
    # Rewind the second message, chat and files: the preview first.
    second.wait_for()
    page.locator(".user-tools").nth(1).locator(".rewind-open").click()
    page.click(".rewind-preview-button")
    page.wait_for_selector(".preview-root")
    assert page.locator(".preview-root:not(.empty)").count() == 1  # the session folder: no change
    counts = page.locator(".preview-counts").inner_text()
    assert counts.startswith("1 restored · 0 created · 1 deleted"), counts
    changes = page.locator(".preview-changes .change-path").all_inner_texts()
    assert sorted(changes) == ["<b>x<b>.txt", "notes.txt"], changes
    assert "removed from the chat" in page.locator(".preview-chat").inner_text()
    assert notes.read_text() == "one\nTWO\n3\n"  # nothing done yet
    shot(page, "rewind-preview")
    page.click(".rewind-apply")
    page.wait_for_selector(".side-panel", state="detached")
    page.wait_for_function("() => document.querySelectorAll('.user').length === 1")
    assert page.locator("#input").input_value() == "edit the notes"
    assert notes.read_text() == "one\ntwo\nthree\n"
    assert not (work / "app" / "<b>x<b>.txt").exists()
    shot(page, "rewound")
    # Undo it through the branch list.
    page.fill("#input", "")
    page.click("#branches-open")
    page.click(".branch .branch-undo")
    page.wait_for_selector(".preview-root:not(.empty)")
    shot(page, "undo-preview")
    page.click(".rewind-apply")
    page.wait_for_selector(".side-panel", state="detached")
    page.wait_for_function("() => document.querySelectorAll('.user').length === 2")
    assert notes.read_text() == "one\nTWO\n3\n"
    assert (work / "app" / "<b>x<b>.txt").read_text() == SCRIPT + "\n"
    # Fork before the second message, with files: a new tab on the new session.
    page.locator(".user-tools").nth(1).locator(".fork-open").click()
    with page.context.expect_page() as opened:
        page.click(".fork-go")
    tab = opened.value
    tab.wait_for_url(lambda url: "#s-" in url)
    tab.wait_for_selector("#conn-state.up")
    tab.wait_for_selector(".user >> text=write the notes")
    assert tab.locator(".user").all_inner_texts() == ["write the notes"]
    sid = tab.evaluate("location.hash.slice(1)")
    assert sid != page.evaluate("location.hash.slice(1)")
    shot(tab, "fork-tab")
    assert site.dialogs == []


SVG = "<svg onload=\"window.__pwned='svg'\">"


def test_markup_in_folder_names_file_names_and_diffs_is_shown_as_text(
    site: Site, work: Path
) -> None:
    """The page's XSS payloads (tests/test_web_resilience.py) as folder names, a file's
    name, a diff's content and an edit's text, with the CSP off (bypass_csp) so that
    only the renderer stands between them and the DOM: nothing runs, nothing is made."""
    for name in (XSS[0], SVG):
        (work / "app" / name).mkdir(parents=True)
    payload = "\n".join(XSS) + "\n"
    site.loop.add_replies(
        {"tool_calls": [tool("filesystem", action="write", path="page.html", content="x\n")]},
        {"text": "first"},
        {
            "tool_calls": [
                tool("filesystem", action="write", path=XSS[0] + ".txt", content=payload),
                tool("filesystem", action="edit", path="page.html", old="x", new=XSS[1]),
            ]
        },
        {"text": "second"},
    )
    page = site.page(bypass_csp=True, signed_in=True, script="window.__pwned = undefined;")
    pick_folder(page, work, "app")
    names = page.locator(".children .folder-entry").all_inner_texts()
    assert sorted(names) == sorted([f"{XSS[0]}/", f"{SVG}/"]), names
    # The page's own icons are SVG (web/icons.js) holding a path and nothing else.
    made = "img, script, svg:not(.icon), iframe, a[href^='javascript'], [onerror], [onload]"
    assert page.locator(".side-panel").locator(made).count() == 0
    page.locator(".folder-entry", has_text="svg").click()  # browsed into, by its name
    page.wait_for_selector(f'.folder-path >> text="{work / "app" / SVG}"')
    page.click(".folder-up")
    page.wait_for_selector(f'.folder-path >> text="{work / "app"}"')
    page.click(".folder-use")
    send(page, "first")
    page.wait_for_selector(".lane.main .answer >> text=first")
    send(page, "second")
    page.wait_for_selector(".lane.main .answer >> text=second")
    page.wait_for_selector("#stop:disabled")
    edit = page.locator(".tool-diff").first
    assert lines(edit.locator(".diff-add")) == ["+" + XSS[1]]
    page.locator(".user-tools").nth(1).locator(".changes-open").click()
    shown = page.locator(".changed-file", has=page.locator(".changed-path", has_text="onerror"))
    shown.wait_for()
    assert shown.locator(".changed-path").inner_text() == XSS[0] + ".txt"
    assert lines(shown.locator(".diff-add")) == ["+" + x for x in XSS]
    assert page.locator(".side-panel").locator(made).count() == 0
    shot(page, "xss-changes")
    page.click(".panel-close")
    page.locator(".user-tools").nth(1).locator(".rewind-open").click()
    page.click(".rewind-preview-button")
    page.wait_for_selector(".preview-root:not(.empty)")
    paths = page.locator(".preview-changes .change-path").all_inner_texts()
    assert XSS[0] + ".txt" in paths, paths
    assert page.locator(".side-panel").locator(made).count() == 0
    assert page.locator("#transcript").locator(made).count() == 0
    assert page.locator("#transcript svg.icon *:not(path)").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert site.dialogs == []
