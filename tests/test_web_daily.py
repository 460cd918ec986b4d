"""The browser page as a daily tool, in headless Chromium against a real `navi serve` and
the fake LLM: the wait for the model's first word (the fake's gate holds the reply; the
page's clock is moved, never waited for), copy buttons, renaming and searching sessions,
the profile list and the default mode named, the page's own status icons, the plan card
that no longer covers tool output, an approval above its call's result, a refused
message taken out of the transcript, "remember on this browser", and the one-time
sign-in link of `navi web`. Rules and helpers: tests/web_browser.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import navi_forks
import pytest
from pg_server import closed_port
from web_browser import Site, browser, needs_browser, send, shared, shared_site, shot

__all__ = ["browser", "shared", "shared_site"]  # fixtures
pytestmark = [pytest.mark.slow, needs_browser]  # a browser, a daemon


@pytest.fixture
def site(shared_site: Site) -> Site:
    """The module's shared daemon, a new user of the test's own (tests/web_browser.py)."""
    return shared_site


EMOJI_STATUS = "⏳✔✗■☐▸✓✅❌"


def _turn_ends(page: Any) -> None:
    page.wait_for_selector("#stop:disabled")


def test_the_wait_for_the_first_word_shows_its_time_and_the_planning_phase(site: Site) -> None:
    site.loop.add_replies(
        {"text": "The first word came."},
        {"text": "Two small steps.\nREFLECT: no"},  # the planner's analysis
        {"text": "Complexity: simple\nSteps:\n1. Answer — SELF\n"},
        {"text": "Planned and answered."},
    )
    page = site.page(clock=True, signed_in=True)  # its timers moved, never waited for
    site.loop.hold()
    send(page, "hello?")
    waiting = page.locator(".lane.main .line.waiting")
    waiting.wait_for()
    assert re.fullmatch(r"waiting for the model… \d s", waiting.inner_text().strip())
    page.clock.run_for(7000)
    page.wait_for_selector(".line.waiting >> text=/waiting for the model… ([7-9]|1\\d) s/")
    assert "waiting for the model…" in page.locator("#status-activity").inner_text()
    shot(page, "waiting-for-the-model")
    site.loop.release()
    page.wait_for_selector(".lane.main .answer >> text=The first word came.")
    _turn_ends(page)
    assert waiting.count() == 0
    # A new session of a planning profile: the wait names the phase running.
    first = page.evaluate("location.hash")
    page.select_option("#profile", "planner")
    page.click("#new-session")
    page.wait_for_url(lambda url: "#s-" in url and not url.endswith(first))
    site.loop.hold()
    send(page, "plan something")
    page.wait_for_selector(".lane.main .line.waiting >> text=/planning: analysis… \\d+ s/")
    shot(page, "waiting-planning")
    site.loop.release()
    page.wait_for_selector(".lane.main .answer >> text=Planned and answered.")
    _turn_ends(page)
    assert page.locator(".line.waiting").count() == 0


def test_copy_a_message_and_a_code_block(site: Site) -> None:
    answer = "Run this:\n\n```sh\necho 'copied <b>as is</b>'\n```\n\nThen **look**."
    site.loop.add_replies({"text": answer})
    page = site.page(permissions=["clipboard-read", "clipboard-write"], signed_in=True)
    send(page, "how do I echo?")
    page.wait_for_selector(".lane.main .answer >> text=look")
    _turn_ends(page)
    clipboard = "navigator.clipboard.readText()"
    block = page.locator(".answer .code-block").first
    block.hover()
    block.locator("button.copy").click()
    page.wait_for_selector(".code-block button.copy.copied")
    assert page.evaluate(clipboard) == "echo 'copied <b>as is</b>'"
    shot(page, "copied-code")
    page.locator(".lane.main > .answer > .msg-tools button.copy").click()
    assert page.evaluate(clipboard) == answer  # the Markdown, as the model wrote it
    page.locator(".user .msg-tools button.copy").click()
    assert page.evaluate(clipboard) == "how do I echo?"
    # The buttons add no words to what the page shows of the messages.
    assert page.locator(".user").inner_text() == "how do I echo?"
    # And after a reload, the history's answer has them too.
    page.reload()
    page.wait_for_selector(".answer .code-block button.copy")
    page.locator(".answer > .msg-tools button.copy").click()
    assert page.evaluate(clipboard) == answer


def test_rename_a_session_and_search_the_list(site: Site) -> None:
    site.loop.add_replies({"text": "one"}, {"text": "two"})
    page = site.page(signed_in=True)
    send(page, "the first topic")
    page.wait_for_selector(".lane.main .answer >> text=one")
    _turn_ends(page)
    first = page.evaluate("location.hash.slice(1)")
    title = "<img src=x onerror=window.__pwned=1> budget notes"
    page.click("#rename")
    page.fill("#rename-input", title)
    shot(page, "renaming")
    page.press("#rename-input", "Enter")
    name = page.locator(f".session[data-sid='{first}'] .session-name")
    page.wait_for_selector(f".session[data-sid='{first}'] .session-name >> text=budget notes")
    assert name.inner_text() == title  # markup in a title is text
    page.wait_for_selector("#session-title >> text=budget notes")
    assert page.locator("#session-title").inner_text().startswith(title + " · ")
    made = ", ".join(f"{where} {what}" for where in ("#sidebar", "header")
                     for what in ("img", "script", "iframe", "[onerror]"))  # fmt: skip
    assert page.locator(made).count() == 0
    assert page.evaluate("window.__pwned") is None
    page.click("#new-session")
    page.wait_for_url(lambda url: "#s-" in url and not url.endswith("#" + first))
    send(page, "something else entirely")
    page.wait_for_selector(".lane.main .answer >> text=two")
    _turn_ends(page)
    second = page.evaluate("location.hash.slice(1)")
    page.wait_for_selector(f".session[data-sid='{second}'] .session-name >> text=something else")
    page.fill("#session-search", "BUDGET")
    page.locator(f".session[data-sid='{second}']").wait_for(state="hidden")
    assert page.locator(f".session[data-sid='{first}']").is_visible()
    shot(page, "session-search")
    page.fill("#session-search", second[-6:])  # by id, too
    page.locator(f".session[data-sid='{first}']").wait_for(state="hidden")
    assert page.locator(f".session[data-sid='{second}']").is_visible()
    page.fill("#session-search", "")
    page.locator(f".session[data-sid='{first}']").wait_for()
    # Escape leaves the title as it was (and does not stop anything).
    page.click("#rename")
    page.fill("#rename-input", "never saved")
    page.press("#rename-input", "Escape")
    page.locator("#rename-form").wait_for(state="hidden")
    assert "never saved" not in page.locator("#sidebar").inner_text()


def test_the_profile_is_a_list_and_the_default_mode_is_named(site: Site) -> None:
    page = site.page(signed_in=True)
    options = page.locator("#profile option")
    page.wait_for_selector("#profile option[value='planner']", state="attached")
    values = [o.get_attribute("value") for o in options.all()]
    assert values[0] == "" and sorted(values[1:]) == values[1:]
    assert {"general", "planner", "coder"} <= set(values)
    assert page.eval_on_selector("#profile", "e => e.tagName") == "SELECT"
    assert re.fullmatch(r"default \(\w+\)", options.first.inner_text())
    mode = page.locator("#mode option").first
    assert re.fullmatch(r"default \((read-only|workspace|full)\)", mode.inner_text())
    page.select_option("#profile", "planner")
    assert re.fullmatch(r"default \((read-only|workspace|full)\)", mode.inner_text())
    shot(page, "profile-list")


def test_icons_plan_and_approval_order(site: Site, tmp_path: Path) -> None:
    """The running tool's icon is the page's own SVG (no emoji font needed); the plan
    scrolls with its turn and covers no tool output; an approval's call result reads
    below the approval card."""
    marker = tmp_path / "approved-marker"
    lines = {"name": "terminal", "arguments": {"action": "run", "command": "seq 1 60"}}
    touch = {"name": "terminal", "arguments": {"action": "run", "command": f"touch {marker}"}}
    steps = "Complexity: simple\nSteps:\n1. Count — TOOL: terminal\n2. Touch — TOOL: terminal\n"
    site.loop.add_replies(
        {"text": "Two steps.\nREFLECT: no"},
        {"text": steps},
        {"tool_calls": [lines]},
        {"tool_calls": [touch]},
        {"text": "Done.\n\n" + "\n\n".join(f"w{i}" for i in range(400))},  # long: it scrolls
    )
    page = site.page(signed_in=True)
    page.select_option("#profile", "planner")
    page.select_option("#mode", "full")  # the local admin is asked before a terminal call
    send(page, "count, then touch")
    card = page.locator(".approval.waiting")
    card.wait_for()
    # The list names the new session by its first message while its run goes on.
    page.wait_for_selector(".session.current .session-name >> text=count, then touch")
    page.wait_for_selector("#status-plan >> text=plan 0/2: Count")  # in sight, however far
    running = page.locator(".tool.running .tool-status")
    running.wait_for()
    assert running.locator("svg.icon-running").count() == 1
    assert running.inner_text().strip() == ""
    shot(page, "tool-running-icon")
    card.locator("button[data-scope='session']").click()
    # A session grant is per program (docs/pages/tools.md): `touch` asks once more.
    page.wait_for_selector(".approval.waiting >> text=touch")
    page.locator(".approval.waiting button[data-scope='once']").click()
    page.wait_for_selector(".lane.main .answer >> text=w399")
    _turn_ends(page)
    assert marker.exists()
    # The approval card comes before its call's card, whose result is below it.
    order = page.evaluate(
        "(() => { const a = document.querySelector('.approval.approved');"
        " const t = [...document.querySelectorAll('.tool')].find("
        "   c => c.querySelector('.tool-args pre').textContent.includes('seq 1 60'));"
        " return !!(a.compareDocumentPosition(t) & Node.DOCUMENT_POSITION_FOLLOWING); })()"
    )
    assert order is True
    assert page.locator(".tool.ok .tool-status svg.icon-ok").count() == 2
    text = page.locator("#transcript").inner_text()
    assert not [ch for ch in EMOJI_STATUS if ch in text]
    # Scroll the first tool's output to the top of the transcript: it is what shows there.
    covered = page.evaluate(
        "(() => { const t = document.getElementById('transcript');"
        " const out = document.querySelector('.tool .tool-out');"
        " t.scrollTop += out.getBoundingClientRect().top - t.getBoundingClientRect().top;"
        " const r = out.getBoundingClientRect();"
        " if (Math.abs(r.top - t.getBoundingClientRect().top) > 2) return 'not at the top';"
        " const hit = document.elementFromPoint(r.left + 12, (r.top + r.bottom) / 2);"
        " return hit && hit.closest('.tool') ? '' : (hit ? hit.className : 'nothing'); })()"
    )
    assert covered == "", f"the tool output is covered by {covered!r}"
    shot(page, "plan-scrolled-with-output")


def test_a_refused_message_leaves_the_transcript_and_returns_to_the_box(site: Site) -> None:
    site.loop.add_replies({"text": "a fine answer"})
    page = site.page(signed_in=True)
    send(page, "a short one")
    page.wait_for_selector(".lane.main .answer >> text=a fine answer")
    _turn_ends(page)
    limit = int(site.daemon.env["NAVI_WS_FRAME_MAX_BYTES"])  # small on the shared daemon
    big = "x" * (limit + 100)  # over the daemon's frame limit: refused
    page.fill("#input", big)
    page.press("#input", "Enter")
    page.wait_for_selector("#errors .line.error")
    page.wait_for_selector(".user", state="attached")
    assert page.locator(".user").count() == 1  # only the message the daemon took
    assert page.locator(".user").inner_text() == "a short one"
    assert page.input_value("#input") == big  # back in the box, to shorten and resend
    assert page.locator(".line.waiting").count() == 0
    page.wait_for_selector("#stop:disabled")
    shot(page, "refused-message")
    page.reload()
    page.wait_for_selector(".lane.main .answer >> text=a fine answer")
    assert page.locator(".user").count() == 1


def test_remember_on_this_browser_only_when_chosen(site: Site) -> None:
    page = site.page(own=True)  # a context of its own: a browser profile's localStorage
    page.wait_for_selector("#login-token")
    assert not page.is_checked("#login-remember")  # off by default
    note = page.locator(".login-box").inner_text()
    assert "sessionStorage" in note and "localStorage" in note and "browser profile" in note
    shot(page, "login-remember")
    site.login(page)
    tab = page.context.new_page()
    tab.goto(site.daemon.url)
    tab.wait_for_selector("#login-token")  # a new tab asks again
    # Chosen: a new tab signs in by itself; Sign out forgets it.
    page = page.context.new_page()
    page.goto(site.daemon.url)
    page.fill("#login-token", site.token)
    page.check("#login-remember")
    page.click("#login-submit")
    page.wait_for_selector("#conn-state.up")
    tab = page.context.new_page()
    tab.goto(site.daemon.url)
    tab.wait_for_selector("#conn-state.up")
    tab.click("#logout")
    tab.wait_for_selector("#login-token")
    assert tab.evaluate("localStorage.getItem('navi.token')") is None
    again = page.context.new_page()
    again.goto(site.daemon.url)
    again.wait_for_selector("#login-token")


def _navi_web(site: Site, url: str) -> subprocess.CompletedProcess[str]:
    """`navi web --url URL`, forked from the tests' warm process (tests/navi_forks.py)."""
    return subprocess.run(
        navi_forks.attach_command("web", "--url", url),
        env=site.daemon.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_one_time_link_of_navi_web_signs_in_once(site: Site) -> None:
    """On the shared daemon: `navi web` signs in as its local admin, whoever else uses it."""
    done = _navi_web(site, f"ws://127.0.0.1:{site.daemon.port}/")
    assert done.returncode == 0, done.stderr
    link = done.stdout.strip()
    assert re.fullmatch(rf"http://127\.0\.0\.1:{site.daemon.port}/#signin=[\w-]+", link), link
    assert site.daemon.admin_token() not in link + done.stderr
    assert "once" in done.stderr
    page = site.page(link)
    page.wait_for_selector("#conn-state.up")
    assert "signin" not in page.url  # taken out of the address bar at once
    assert page.evaluate("sessionStorage.getItem('navi.token')") == site.daemon.admin_token()
    shot(page, "signed-in-by-link")
    # A link opened in a tab already signed in is no session id: it only leaves the address.
    page.evaluate("location.hash = '#signin=abc'")
    page.wait_for_url(lambda url: "signin" not in url)
    assert page.locator("#errors .line.error").count() == 0
    # The same link again: refused, with what to do.
    used = site.page(link)
    used.wait_for_selector("#login-error >> text=used or expired")
    assert "navi web" in used.locator("#login-error").inner_text()
    assert "signin" not in used.url
    shot(used, "link-used-twice")
    # No daemon there (nothing listens on the port): said plainly.
    with closed_port() as port:
        gone = _navi_web(site, f"ws://127.0.0.1:{port}/")
    assert gone.returncode == 1 and gone.stdout == ""
    assert "no navi daemon answers" in gone.stderr and "navi serve" in gone.stderr
