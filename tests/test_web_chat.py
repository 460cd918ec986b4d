"""The browser client in headless Chromium against a real `navi serve` and the fake LLM
server: login, a streamed Markdown answer, the plan ticking, tool cards, a sub-agent's
lane, a background task, approvals, Stop (button and Esc) with a queued message, and a
phone-sized screen. Rules and helpers: tests/web_browser.py.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from web_browser import Site, answer_text, browser, needs_browser, send, shared, shared_site, shot

from navi_trio.llm.script import split_words

__all__ = ["browser", "shared", "shared_site"]  # fixtures
pytestmark = [pytest.mark.slow, needs_browser]  # a browser, a daemon


@pytest.fixture
def site(shared_site: Site) -> Site:
    """The module's shared daemon, a new user of the test's own (tests/web_browser.py)."""
    return shared_site


PLAN = """Complexity: simple
Milestones:
- the folder is known
Steps:
1. Run echo in the terminal — TOOL: terminal
2. Ask a helper for a report — AGENT: general
"""


def _todo(i: int) -> dict[str, Any]:
    args = {"action": "update", "index": i, "status": "done", "validation": "seen"}
    return {"name": "todo", "arguments": args}


def _words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(1, n + 1))


def _through(text: str, word: str) -> int:
    """How many chunks the fake LLM streams of `text` up to and with `word`."""
    return [w.strip() for w in split_words(text)].index(word) + 1


def test_login_then_a_streamed_markdown_answer_and_its_session(site: Site) -> None:
    answer = "Here is **bold** and `code`.\n\n"
    answer += "```python\ndef f(x):\n    return 'hi'  # note\n```\n\n- one\n- two\n\n" + _words(40)
    site.loop.add_replies({"text": answer})
    # The answer stops after w5 until the page was seen mid-stream.
    release = site.loop.call(site.loop.llm.hold_after, _through(answer, "w5"))
    page = site.page()
    page.wait_for_selector("#login-token")
    shot(page, "login")
    site.login(page)
    assert page.evaluate("sessionStorage.getItem('navi.token')") == site.token
    assert site.token not in page.url
    # Before any session exists, the profile box offers the daemon's profiles (welcome).
    page.wait_for_selector("#conn-state.up")
    page.wait_for_selector("#profile option[value='general']", state="attached")
    send(page, "show me some markdown")
    page.wait_for_selector(".lane.main .answer >> text=w5")
    streaming = answer_text(page)
    shot(page, "streaming")
    assert "w40" not in streaming  # seen mid-stream: the answer grows in place
    site.loop.call(release.set)
    page.wait_for_selector(".lane.main .answer >> text=w40")
    md = page.locator(".lane.main .answer").last
    assert md.locator("strong").inner_text() == "bold"
    assert md.locator("p code").first.inner_text() == "code"
    assert md.locator("pre.code .tok-kw").first.inner_text() == "def"
    assert md.locator("pre.code .tok-com").inner_text() == "# note"
    assert md.locator("ul li").all_inner_texts() == ["one", "two"]
    page.wait_for_selector("#stop:disabled")
    page.wait_for_selector("#status-context:has-text('tokens')")
    sid = page.evaluate("location.hash.slice(1)")
    assert sid.startswith("s-")
    page.wait_for_selector(f".session[data-sid='{sid}'].current")
    assert "just now" in page.locator(f".session[data-sid='{sid}'] .session-meta").inner_text()
    # The first message titles the session, in the list and above the transcript.
    name = page.locator(f".session[data-sid='{sid}'] .session-name")
    assert name.inner_text() == "show me some markdown"
    assert page.locator("#session-title").inner_text().startswith("show me some markdown · ")
    shot(page, "answered")
    # Compact: one exchange is too short to summarise, and the page says so in one line.
    page.click("#compact")
    page.wait_for_selector(".line.error >> text=[nothing_to_compact]")
    assert "already short" in page.locator(".line.error").last.inner_text()
    # A reload keeps the login (sessionStorage) and resumes the session from its history.
    page.reload()
    page.wait_for_selector("#conn-state.up")
    page.wait_for_selector(".lane.main .answer >> text=w40")
    assert page.locator(".user").all_inner_texts() == ["show me some markdown"]
    assert page.locator(".answer").count() == 1
    # New session, then delete the first one (two clicks: the second confirms).
    page.click("#new-session")
    # (wait_for_function would evaluate a string: the page's CSP refuses that, rightly)
    page.wait_for_url(lambda url: "#s-" in url and not url.endswith("#" + sid))
    page.click(f".session[data-sid='{sid}'] .session-delete")
    page.click(f".session[data-sid='{sid}'] .session-delete.confirm")
    page.wait_for_selector(f".session[data-sid='{sid}']", state="detached")
    assert site.dialogs == []


def test_plan_ticks_tool_card_sub_agent_lane_and_a_background_task(site: Site) -> None:
    echo = {"name": "terminal", "arguments": {"action": "run", "command": "echo hi-from-echo"}}
    background = {
        "name": "terminal",
        "arguments": {"action": "run", "command": "sleep 1; echo bg-finished", "background": True},
    }
    spawn = {"name": "spawn_agent", "arguments": {"task": "report on the folder"}}
    last = "Both steps are done. " + _words(60)
    site.loop.add_replies(
        {"text": "Two small steps.\nREFLECT: no"},
        {"text": PLAN},
        {"tool_calls": [echo, _todo(1)]},  # held: the plan shows 0/2 meanwhile
        {"tool_calls": [spawn, background]},  # held: 1/2 meanwhile
        {"text": "The sub-agent says the folder is *tidy*."},  # the sub-agent
        {"tool_calls": [_todo(2)]},
        {"text": last},  # held after w10: the page is seen mid-run
    )

    def hold(reply: int, chunks: int = 0) -> trio.Event:
        release: trio.Event = site.loop.call(partial(site.loop.llm.hold_after, chunks, reply=reply))
        return release

    first = hold(2)
    page = site.page(signed_in=True)
    page.select_option("#profile", "planner")
    send(page, "echo something, then ask a helper")
    plan = page.locator(".plan")
    page.wait_for_selector(".plan-head >> text=0/2")
    second = hold(3)  # (the first stays held until it is set)
    site.loop.call(first.set)
    page.wait_for_selector(".plan-head >> text=1/2")
    assert plan.locator(".step").first.get_attribute("data-status") == "done"
    assert plan.locator(".step").nth(1).get_attribute("data-status") == "pending"
    shot(page, "plan-one-done")
    third = hold(6, _through(last, "w10"))
    site.loop.call(second.set)
    card = page.locator(".tool.ok", has_text="terminal").first
    card.wait_for()
    assert "hi-from-echo" in card.locator(".tool-out").inner_text()
    assert "echo hi-from-echo" in card.locator(".tool-args summary").inner_text()
    assert card.locator(".tool-dur").inner_text().endswith("s")
    lane = page.locator(".lane.sub")
    lane.wait_for()
    page.wait_for_selector(".lane.sub .answer >> text=tidy")
    assert "report on the folder" in lane.locator(".sub-head").inner_text()
    page.wait_for_selector(".lane.sub .sub-end >> text=done")
    # The background task: running, then completed in the panel; Check shows its result.
    task = page.locator(".task").first
    task.wait_for()
    page.wait_for_selector(".plan-head >> text=2/2")
    page.wait_for_selector(".lane.main .answer >> text=w10")
    shot(page, "main-mid-run")  # docs/pages/img/web-client.png: plan, cards, lane, answer
    page.wait_for_selector(".task.completed")
    shot(page, "background-task-done")
    page.click(".task.completed .task-check")
    page.wait_for_selector(".task.completed .task-result >> text=bg-finished")
    site.loop.call(third.set)
    page.wait_for_selector(".lane.main .answer >> text=w60")
    assert plan.count() == 1  # one checklist, ticked in place
    assert [s.get_attribute("data-status") for s in plan.locator(".step").all()] == ["done"] * 2
    assert page.locator(".lane.sub").count() == 1


def test_a_session_grant_is_listed_on_the_page_and_revoked(site: Site, tmp_path: Path) -> None:
    def touch(name: str) -> dict[str, Any]:
        path = tmp_path / name
        return {"name": "terminal", "arguments": {"action": "run", "command": f"touch {path}"}}

    site.loop.add_replies(
        {"tool_calls": [touch("one")]}, {"tool_calls": [touch("two")]}, {"text": "Both."}
    )
    page = site.page(signed_in=True)
    page.select_option("#mode", "full")
    send(page, "touch twice")
    page.locator(".approval.waiting button[data-scope='session']").click()
    page.wait_for_selector(".lane.main .answer >> text=Both.")
    assert page.locator(".approval").count() == 1  # the second call was granted
    # This session's grant: the local token is an admin's, who sees everyone's (another
    # test's on this worker's daemon too).
    sid = page.evaluate("location.hash.slice(1)")
    grant = page.locator("#grant-list .grant", has_text=f"session {sid} ")
    grant.wait_for()
    assert "`touch` with any arguments" in grant.locator(".grant-what").inner_text()
    assert page.locator("#grant-empty").is_hidden()
    page.reload()  # listed again once the reopened session's tasks are in
    grant.wait_for()
    grant.locator("button.grant-revoke").click()
    grant.wait_for(state="detached")


def test_approve_once_runs_the_call_and_deny_refuses_the_next(site: Site, tmp_path: Path) -> None:
    first, second = tmp_path / "approved-marker", tmp_path / "denied-marker"

    def touch(path: Path) -> dict[str, Any]:
        return {"name": "terminal", "arguments": {"action": "run", "command": f"touch {path}"}}

    site.loop.add_replies(
        {"tool_calls": [touch(first)]}, {"tool_calls": [touch(second)]}, {"text": "One of two."}
    )
    page = site.page(signed_in=True)
    page.select_option("#mode", "full")  # the local token is admin: terminal asks in full
    send(page, "create the markers")
    card = page.locator(".approval.waiting")
    card.wait_for()
    assert "touch" in card.locator(".approval-head").inner_text()
    assert "rule:" in card.locator(".approval-rule").inner_text()
    assert card.locator(".approval-part").inner_text().startswith(f"? ask: touch {first}")
    grant = card.locator(".approval-grant").inner_text()
    assert grant.startswith("For this session allows: `touch` with any arguments")
    page.wait_for_selector(".approval.waiting .approval-left >> text=/\\d+:\\d\\d left/")
    assert card.locator("button").all_inner_texts() == [
        "Approve once", "For this session", "Always", "Deny"
    ]  # fmt: skip
    shot(page, "approval")
    card.locator("button[data-scope='once']").click()
    page.wait_for_selector(".approval.approved >> text=approved (once, by owner)")
    page.wait_for_selector(".approval.waiting")
    page.locator(".approval.waiting button.deny").click()
    page.wait_for_selector(".approval.denied >> text=denied (by owner)")
    page.wait_for_selector(".lane.main .answer >> text=One of two.")
    assert first.exists() and not second.exists()
    assert page.locator(".tool.ok").count() == 1 and page.locator(".tool.failed").count() == 1
    shot(page, "approvals-answered")


def test_a_tab_opened_while_a_call_waits_shows_its_card_once(site: Site, tmp_path: Path) -> None:
    """The call is in the history (saved before it runs) with no result yet: the live
    result finishes that card, rather than drawing a second one for the same call."""
    marker = tmp_path / "marker"
    touch = {"name": "terminal", "arguments": {"action": "run", "command": f"touch {marker}"}}
    site.loop.add_replies({"tool_calls": [touch]}, {"text": "Made it."})
    page = site.page(signed_in=True)
    page.select_option("#mode", "full")  # the local token is admin: terminal asks in full
    send(page, "make the marker")
    page.locator(".approval.waiting").wait_for()
    sid = page.evaluate("location.hash.slice(1)")
    other = site.page(f"{site.daemon.url}#{sid}", signed_in=True)
    other.locator(".approval.waiting").wait_for()
    assert other.locator(".tool").count() == 1  # from the history, still running
    other.wait_for_selector("#stop:enabled")  # the run started before it: Stop works
    other.locator(".approval.waiting button[data-scope='once']").click()
    for tab in (page, other):
        tab.wait_for_selector(".lane.main .answer >> text=Made it.")
        assert tab.locator(".tool").count() == 1
        assert tab.locator(".tool.ok").count() == 1
    assert marker.exists()


def test_stop_by_button_then_by_esc_and_the_queue_shown(site: Site) -> None:
    endless = {"text": "more words", "endless": True, "delay_chunk": 0.02}
    site.loop.add_replies(endless, endless)
    page = site.page(signed_in=True)
    send(page, "tell me a long story")
    page.wait_for_selector(".lane.main .answer >> text=more")
    send(page, "and then another")
    page.wait_for_selector("#status-queue >> text=1 message waiting")
    page.wait_for_selector(".line.queued >> text=queued #1")
    shot(page, "queued")
    page.click("#stop")
    page.wait_for_selector(".line.stopped")
    # The queued message runs now; Esc stops it.
    page.wait_for_selector(".turn:nth-child(3) .answer >> text=more")
    assert page.locator("#status-queue").inner_text() == ""
    page.keyboard.press("Escape")
    page.wait_for_selector(".turn:nth-child(3) .line.stopped")
    page.wait_for_selector("#stop:disabled")
    assert page.locator(".line.stopped").count() == 2
    assert page.locator(".user").all_inner_texts() == ["tell me a long story", "and then another"]
    shot(page, "stopped")


def test_a_phone_sized_screen_is_usable(site: Site) -> None:
    wide = "A narrow answer. " + "x" * 300 + "\n\n```python\nx = '" + "long " * 60 + "'\n```\n\n"
    wide += "| a | b |\n| --- | --- |\n| " + "cell " * 30 + " | 2 |"
    site.loop.add_replies({"text": wide})
    page = site.page(phone=True, signed_in=True)
    send(page, "hi from the phone")
    page.wait_for_selector(".lane.main .answer >> text=narrow")
    page.wait_for_selector("#stop:disabled")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width}px wide on a 390px screen"
    # Nothing wider than the screen in the transcript either: long words wrap, code
    # blocks and tables scroll inside their own box.
    inner = page.evaluate("[...document.querySelectorAll('#transcript, .answer')].map("
                          "e => e.scrollWidth - e.clientWidth)")  # fmt: skip
    assert max(inner) <= 1, inner
    assert page.locator("#sidebar").is_hidden() and page.locator("#send").is_visible()
    box = page.locator("#input").bounding_box()
    assert box is not None and box["y"] + box["height"] <= 844
    shot(page, "phone")
    page.click("#toggle-sessions")
    page.wait_for_selector("#sidebar .session")
    shot(page, "phone-sessions")
    sid = page.evaluate("location.hash.slice(1)")
    page.click(f"#sidebar .session[data-sid='{sid}'] .session-open")
    page.locator("#sidebar").wait_for(state="hidden")
    page.wait_for_selector(".lane.main .answer >> text=narrow")
