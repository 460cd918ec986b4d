"""The page's slash commands kept as files, in headless Chromium against a real
`navi serve` whose user has commands of their own (~/.config/navi/commands): /help
lists them (and says which file a built-in name left out), ``/review words`` sends the
command's prompt with the words in it, and the page's twin of the expansion rule gives
what navi_trio/command_text.py gives on the same cases. Rules and helpers:
tests/web_browser.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from project_repo import FIXTURE
from test_project_commands import EXPANSIONS
from web_browser import (
    Chromium,
    Shared,
    Site,
    browser,
    needs_browser,
    on_shared,
    send,
    shared_site,
    sharing,
)

__all__ = ["browser", "shared_site"]  # fixtures
pytestmark = [pytest.mark.slow, needs_browser]  # a browser, a daemon


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """The module's daemon (tests/web_browser.py), its user holding the fixture's
    commands."""
    home = tmp_path_factory.mktemp("config-home")
    folder = home / "navi" / "commands"
    folder.parent.mkdir(parents=True)
    shutil.copytree(FIXTURE / ".claude" / "commands", folder)
    shutil.copy(FIXTURE / ".navi" / "commands" / "help.md", folder / "help.md")
    yield from sharing(
        tmp_path_factory, lambda daemon: daemon.env.update(XDG_CONFIG_HOME=str(home))
    )


@pytest.fixture
def site(shared_site: Site) -> Site:
    """The module's shared daemon, a new user of the test's own."""
    return shared_site


def test_the_page_lists_the_users_commands_and_sends_one_with_its_words(site: Site) -> None:
    site.loop.add_replies({"text": "reviewed it"})
    page = site.page(signed_in=True)
    send(page, "/help")
    page.wait_for_selector(".line.notice >> text=/review FILE — Review the changes in a file")
    page.wait_for_selector(".line.notice >> text=/help is a built-in command")
    assert page.locator(".user").count() == 0  # /help sent nothing
    send(page, "/review src/app.py")
    page.wait_for_selector(".lane.main .answer >> text=reviewed it")
    assert page.locator(".user").all_inner_texts() == [
        "Review the code in src/app.py and list the problems you find."
    ]


@pytest.fixture
def plain_site(web_shared: Shared, browser: Chromium) -> Iterator[Site]:
    """The worker's plain daemon (tests/web_worker.py): a test that needs only the page's
    scripts needs no daemon with commands, nor its start on a worker that has none."""
    yield from on_shared(web_shared, browser)


def test_the_pages_expansion_is_navi_chats(plain_site: Site) -> None:
    page = plain_site.page()
    page.wait_for_selector("#login-token")
    got = page.evaluate(
        "async (cases) => { const m = await import('/slash.js');"
        " return cases.map(([body, args]) => m.expandCommand(body, args)); }",
        [[body, arguments] for body, arguments, _ in EXPANSIONS],
    )
    assert got == [expanded for _, _, expanded in EXPANSIONS]
