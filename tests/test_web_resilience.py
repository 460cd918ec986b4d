"""The browser client when things go wrong: the socket cut mid-stream, the daemon
restarted (resync), an unreachable daemon, model and tool text trying to be HTML,
another user's session, a wrong or rotated token, a history too long for one frame
(it comes in pages), links of the model to other sites. Rules and helpers:
tests/web_browser.py (the page reaches the daemon through a cuttable proxy where a
test cuts the connection).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import trio
from web_browser import (
    Daemon,
    Site,
    answer_text,
    browser,
    needs_browser,
    own_site,
    send,
    shared,
    shared_site,
    shot,
)

from navi_trio import wire
from navi_trio.api.daemon_client import open_daemon
from navi_trio.store.sqlite import SQLiteStore

__all__ = ["browser", "own_site", "shared", "shared_site"]  # fixtures
pytestmark = [pytest.mark.slow, needs_browser]  # a browser, a daemon


@pytest.fixture
def site(shared_site: Site) -> Site:
    """The module's shared daemon, a new user of the test's own (tests/web_browser.py)."""
    return shared_site


def _words(n: int, prefix: str = "w") -> list[str]:
    return [f"{prefix}{i}" for i in range(1, n + 1)]


def test_a_cut_socket_reconnects_and_every_frame_shows_once(site: Site) -> None:
    words = _words(80)
    echo = {"name": "terminal", "arguments": {"action": "run", "command": "echo card-once"}}
    site.loop.add_replies({"tool_calls": [echo]}, {"text": " ".join(words)})
    # The answer stops after w10 (the tool call's reply is shorter) until the page is back.
    release = site.loop.call(site.loop.llm.hold_after, 10)
    proxy = site.loop.proxy(site.daemon.port)
    page = site.page(f"http://127.0.0.1:{proxy.port}/", signed_in=True)
    send(page, "count to eighty")
    page.wait_for_selector(".lane.main .answer >> text=w10")
    assert site.loop.call(proxy.cut) >= 1  # the page's WebSocket (and any kept-alive GET)
    page.wait_for_selector("#conn-state.down")
    shot(page, "reconnecting")
    page.wait_for_selector("#conn-state.up")
    page.wait_for_selector("#errors .line.notice >> text=reconnected")
    site.loop.call(release.set)
    page.wait_for_selector("#stop:disabled")
    assert answer_text(page).split() == words  # no gap, no duplicate
    assert page.locator(".tool").count() == 1
    assert page.locator(".user").count() == 1
    assert page.locator("#banner").is_hidden()
    shot(page, "reconnected")


def test_a_second_tab_opened_mid_answer_ends_with_the_whole_answer(site: Site) -> None:
    """The words streamed before a tab opened the session are in no history yet (the
    answer is saved at its end) and before the seq it subscribed from: the run's end,
    which carries the whole answer, shows it whole, once."""
    words = _words(40)
    site.loop.add_replies({"text": " ".join(words)})
    release = site.loop.call(site.loop.llm.hold_after, 10)  # until the second tab is open
    first = site.page(signed_in=True)
    send(first, "count to forty")
    first.wait_for_selector(".lane.main .answer >> text=w10")
    sid = first.evaluate("location.hash.slice(1)")
    second = site.page(f"{site.daemon.url}#{sid}", signed_in=True)
    second.wait_for_selector(".user >> text=count to forty")
    site.loop.call(release.set)
    for page in (first, second):
        page.wait_for_selector(".lane.main .answer >> text=w40")
    second.wait_for_selector(".lane.main .answer >> text=/^w1 w2/")
    for page in (first, second):
        assert answer_text(page).split() == words
        assert page.locator(".lane.main > .answer").count() == 1
        assert page.locator(".user").all_inner_texts() == ["count to forty"]


def test_a_turn_that_failed_still_says_why_after_a_reload(site: Site) -> None:
    """The history keeps a failed turn's error with its partial answer: the page shows it
    from there as it showed it live (the answer, then why it ended), not as a stop."""
    site.loop.add_replies({"text": "half an answer", "error_line": "the model fell over"})
    page = site.page(signed_in=True)
    send(page, "hello there")
    page.wait_for_selector(".line.error >> text=the model fell over")
    page.wait_for_selector("#stop:disabled")
    page.reload()
    page.wait_for_selector("#conn-state.up")
    page.wait_for_selector(".lane.main .answer >> text=half an answer")
    page.wait_for_selector(".line.error >> text=the model fell over")
    assert page.locator(".line.error").count() == 1
    assert page.locator(".line.stopped").count() == 0


@pytest.mark.slow
def test_a_task_that_ends_while_the_page_is_away_shows_ended_after_the_reconnect(
    site: Site,
) -> None:
    """background-tasks spec: a task_update is "out-of-band: not part of the run's replay
    buffer; on reconnect the client re-syncs via tasks list instead". The task ends while
    the page is cut off (its update goes to nobody): back, the page shows it ended."""
    site.loop.add_replies({"text": "hello"})
    proxy = site.loop.proxy(site.daemon.port)
    page = site.page(f"http://127.0.0.1:{proxy.port}/", signed_in=True)
    send(page, "hi")
    page.wait_for_selector(".lane.main .answer >> text=hello")
    sid = page.evaluate("decodeURIComponent(location.hash.slice(1))")
    # The task waits on a FIFO in the session's folder until the test writes to it.
    folder = site.daemon.data / "sessions" / sid
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / "gate")
    waits = {"action": "run", "command": "cat gate; echo bg-finished", "background": True}
    site.loop.add_replies(
        {"tool_calls": [{"name": "terminal", "arguments": waits}]},
        {"text": "It runs in the background."},
    )
    send(page, "run it in the background")
    page.wait_for_selector(".task.running")
    page.wait_for_selector(".lane.main .answer >> text=runs in the background")
    site.loop.call(setattr, proxy, "refusing", True)  # no way back until the task ended
    assert site.loop.call(proxy.cut) >= 1
    page.wait_for_selector("#conn-state.down")
    ended = site.loop.run(_end_the_task, site.daemon, sid, folder / "gate")
    assert ended["status"] == "completed"
    assert page.locator(".task.running").count() == 1  # the page missed it
    site.loop.call(setattr, proxy, "refusing", False)
    page.wait_for_selector("#conn-state.up")
    page.wait_for_selector(".task.completed")
    assert page.locator(".task").count() == 1
    page.click(".task.completed .task-check")
    page.wait_for_selector(".task.completed .task-result >> text=bg-finished")
    shot(page, "task-resynced")


async def _end_the_task(daemon: Daemon, sid: str, gate: Path) -> dict[str, Any]:
    """Open the task's gate and wait, on a connection of our own, for its final update."""
    with trio.fail_after(30):
        async with open_daemon(f"ws://127.0.0.1:{daemon.port}/", daemon.admin_token()) as d:
            await d.request(wire.subscribe(sid, None))
            await trio.to_thread.run_sync(gate.write_text, "go\n", abandon_on_cancel=True)
            async for frame in d:
                if frame["type"] == "task_update" and frame["status"] != "running":
                    return frame
    raise AssertionError("the connection ended before the task did")


BACKOFF_MAX_MS = 8000  # the page's longest wait between two tries (wire.js)


def test_a_restarted_daemon_shows_the_retrying_banner_then_resyncs(own_site: Site) -> None:
    site = own_site
    site.loop.add_replies({"text": " ".join(_words(400)), "delay_chunk": 0.03})
    page = site.page(clock=True, signed_in=True)
    send(page, "a long one")
    page.wait_for_selector(".lane.main .answer >> text=w20")
    sid = page.evaluate("location.hash.slice(1)")
    site.daemon.stop()  # SIGTERM: the partial answer is saved, marked stopped
    page.wait_for_selector("#banner >> text=Cannot reach the navi daemon")
    page.wait_for_selector("#banner >> text=/retrying in [0-9.]+s \\(try [2-9]/")
    shot(page, "daemon-unreachable")
    site.loop.add_replies({"text": "after the restart"})
    site.daemon.start()  # the same port: the page finds it again
    # At its next try, due in up to 8 s (the backoff doubles while the daemon starts):
    # the page's clock jumps there rather than the test waiting it out.
    page.clock.fast_forward(BACKOFF_MAX_MS)
    page.wait_for_selector("#conn-state.up")
    page.wait_for_selector(".line.notice >> text=history reloaded")
    assert page.locator("#banner").is_hidden()
    assert page.evaluate("location.hash.slice(1)") == sid
    assert page.locator(".user").all_inner_texts() == ["a long one"]
    shown = page.locator(".answer").all_inner_texts()
    assert len(shown) == 1 and shown[0].split()[:20] == _words(20)  # the saved partial, once
    assert page.locator(".line.stopped").count() == 1
    send(page, "and now?")
    page.wait_for_selector(".lane.main .answer >> text=after the restart")
    assert page.locator(".user").all_inner_texts() == ["a long one", "and now?"]
    shot(page, "resynced")


XSS = [
    "<img src=x onerror=\"window.__pwned='img';alert(1)\">",
    "<script>window.__pwned='script';alert(2)</script>",
    "<svg onload=\"window.__pwned='svg'\"></svg>",
    "[click me](javascript:window.__pwned='link')",
    "<a href=\"javascript:window.__pwned='a'\">a link</a>",
    "<iframe src=\"javascript:window.__pwned='iframe'\"></iframe>",
]


def test_html_in_model_and_tool_text_is_shown_as_text_and_never_runs(site: Site) -> None:
    """With the page's CSP switched off (bypass_csp), so that only the renderer stands
    between the text and the DOM: nothing runs, no element is made from it."""
    payload = "\n\n".join(XSS)
    command = "printf '%s\\n' " + " ".join(json.dumps(x) for x in XSS[:3])
    tool = {"name": "terminal", "arguments": {"action": "run", "command": command}}
    site.loop.add_replies(
        {"thinking": XSS[0], "tool_calls": [tool]},
        {"text": payload + "\n\n**bold** `" + XSS[1] + "`\n\n```html\n" + XSS[0] + "\n```"},
    )
    page = site.page(bypass_csp=True, signed_in=True, script="window.__pwned = undefined;")
    send(page, XSS[0])
    page.wait_for_selector(".lane.main .answer >> text=bold")
    page.wait_for_selector("#stop:disabled")
    page.click(".thinking summary")
    page.click(".tool-args summary")
    transcript = page.locator("#transcript")
    text = transcript.inner_text()
    for attack in XSS:
        assert attack in text, attack
    assert "<img src=x" in page.locator(".tool-out").inner_text()  # the tool's output, as text
    assert "<img src=x" in page.locator(".user").inner_text()
    # The page's own icons are SVGs of class icon, each one path of ours (icons.js).
    made = "img, script, svg:not(.icon), iframe, a[href^='javascript'], [onerror], [onload]"
    assert transcript.locator(made).count() == 0
    assert transcript.locator("svg.icon *:not(path)").count() == 0
    assert page.locator("#session-list").locator(made).count() == 0
    assert page.evaluate("window.__pwned") is None
    assert site.dialogs == []
    shot(page, "xss-inert")
    # And with the CSP on, even a script element made in the page would not run.
    strict = site.page()
    ran = strict.evaluate(
        """() => { const s = document.createElement("script");
                   s.textContent = "window.__inline = 1"; document.body.append(s);
                   return window.__inline; }"""
    )
    assert ran is None


def test_another_users_session_is_refused_by_url_and_by_frame(site: Site) -> None:
    site.loop.add_replies({"text": "SECRET-OF-ADMIN"})
    admin = site.page(signed_in=True)
    send(admin, "keep this to yourself")
    admin.wait_for_selector(".answer >> text=SECRET-OF-ADMIN")
    sid = admin.evaluate("location.hash.slice(1)")
    bob = site.daemon.add_user("bob")
    # By URL: bob opens the admin's session by its fragment.
    page = site.page(site.daemon.url + "#" + sid, signed_in=bob)
    page.wait_for_selector(".line.error >> text=forbidden")
    assert "belongs to another user" in page.locator("#transcript .line.error").inner_text()
    assert "SECRET" not in page.locator("body").inner_text()
    assert page.locator(".session").count() == 0
    assert page.evaluate("location.hash") == ""
    shot(page, "forbidden")
    # By frame: a WebSocket of bob's own from the page, every kind of request.
    replies: list[dict[str, Any]] = page.evaluate(
        """async ([token, sid]) => {
            const ws = new WebSocket(`ws://${location.host}/`);
            const got = [];
            const wanted = 8;
            return await new Promise((resolve, reject) => {
                setTimeout(() => reject(new Error("no answer: " + JSON.stringify(got))), 15000);
                ws.onopen = () => ws.send(JSON.stringify({type: "hello", token}));
                ws.onmessage = (e) => {
                    const f = JSON.parse(e.data);
                    if (f.type === "welcome") {
                        const asks = [
                            {type: "sessions", action: "history", session_id: sid},
                            {type: "subscribe", session_id: sid, last_seq: 0},
                            {type: "message", session_id: sid, content: "let me in"},
                            {type: "stop", session_id: sid},
                            {type: "compact", session_id: sid},
                            {type: "tasks", action: "list", session_id: sid},
                            {type: "approve", session_id: sid, call_id: "c1"},
                            {type: "sessions", action: "delete", session_id: sid},
                        ];
                        asks.forEach((a, i) => ws.send(JSON.stringify({...a, id: i})));
                        return;
                    }
                    got.push(f);
                    if (got.filter((x) => x.id !== undefined).length >= wanted) {
                        ws.close();
                        resolve(got);
                    }
                };
            });
        }""",
        [bob, sid],
    )
    assert [r.get("code") for r in replies] == ["forbidden"] * 8, replies
    assert "SECRET" not in json.dumps(replies)
    # The admin's session is intact.
    admin.reload()
    admin.wait_for_selector(".answer >> text=SECRET-OF-ADMIN")


def test_a_wrong_token_and_a_rotated_one_go_back_to_the_login(site: Site) -> None:
    proxy = site.loop.proxy(site.daemon.port)
    page = site.page(f"http://127.0.0.1:{proxy.port}/")
    page.fill("#login-token", "navi_not-a-token")
    page.click("#login-submit")
    page.wait_for_selector("#login-error >> text=refused the token")
    assert page.locator("#app").is_hidden()
    assert page.evaluate("sessionStorage.getItem('navi.token')") is None
    shot(page, "wrong-token")
    ann = site.daemon.add_user("ann")
    site.login(page, ann)
    assert page.evaluate("sessionStorage.getItem('navi.token')") == ann
    site.daemon.rotate("ann")  # ann's old token no longer works
    site.loop.call(proxy.cut)  # the page reconnects with it
    page.wait_for_selector("#login-error >> text=refused the token")
    assert page.locator("#login").is_visible()
    assert page.evaluate("sessionStorage.getItem('navi.token')") is None
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", page.url)
    shot(page, "rotated-token")


def _write_session(db: Path, token: str, sid: str, messages: list[dict[str, Any]]) -> None:
    """A session of the token's user, written into the running daemon's SQLite file."""

    async def write() -> None:
        async with SQLiteStore.open(db) as store:
            user = await store.get_user_by_token(token)
            assert user is not None
            await store.create_session(sid, profile_id="general", user_id=user["id"])
            await store.append(sid, messages=messages)

    trio.run(write)


# Every frame the page sends, kept for the test (before the page's own scripts run), and
# the first ask of each history page (a cursor) refused as the daemon refuses a frame over
# its rate: not sent, answered `rate_limited` with the ask's id. So the page's retry is
# tested on a refusal that surely comes, whatever the machine's speed; the daemon's rate
# limit itself is held by tests/test_api_server.py::test_frames_per_second_limit.
REFUSE_FIRST_PAGE_ASKS = """
window.__sent = [];
window.__refused = [];
const send = WebSocket.prototype.send;
WebSocket.prototype.send = function (data) {
  window.__sent.push(data);
  const frame = JSON.parse(data);
  if (frame.action === "history" && frame.cursor && !window.__refused.includes(frame.cursor)) {
    window.__refused.push(frame.cursor);
    const refusal = JSON.stringify({ type: "error", code: "rate_limited", id: frame.id,
                                     message: "too many frames: this frame was dropped" });
    setTimeout(() => this.dispatchEvent(new MessageEvent("message", { data: refusal })));
    return;
  }
  return send.call(this, data);
};
"""


def test_a_long_history_comes_in_pages_and_the_page_shows_all_of_it(own_site: Site) -> None:
    site = own_site  # the shipped frame limit (1 MiB): the worker's shared daemon's is less
    messages: list[dict[str, Any]] = []
    for i in range(3):  # 600 kB each: one to a page of about 1 MB
        messages.append({"role": "user", "content": f"asked {i} " + "q" * 600_000 + f" end{i}"})
        messages.append({"role": "assistant", "content": f"answer number {i}"})
    _write_session(site.daemon.db, site.daemon.admin_token(), "root.paged", messages)
    page = site.page(site.daemon.url + "#root.paged", signed_in=True, script=REFUSE_FIRST_PAGE_ASKS)
    page.wait_for_selector(".answer >> text=answer number 2")
    assert page.locator(".user").count() == 3
    assert page.locator(".answer").all_inner_texts() == [f"answer number {i}" for i in range(3)]
    for i in range(3):
        assert page.locator(".user").nth(i).inner_text().endswith(f" end{i}")
    sent = [json.loads(d) for d in page.evaluate("window.__sent")]
    asks = [f for f in sent if f.get("action") == "history"]
    assert asks[0] == {"type": "sessions", "action": "history", "session_id": "root.paged",
                       "id": asks[0]["id"]}  # fmt: skip
    cursors = [f["cursor"] for f in asks[1:]]
    # Two pages more, each refused once and asked for again (a new id), nothing else.
    assert len(set(cursors)) == 2 and cursors == [cursors[0], cursors[0], cursors[2], cursors[2]]
    assert len({f["id"] for f in asks}) == len(asks)
    assert page.evaluate("window.__refused") == [cursors[0], cursors[2]]
    assert page.locator("#errors .line").count() == 0  # a refused page is not the user's error
    subscribe = next(f for f in sent if f["type"] == "subscribe")
    assert subscribe["session_id"] == "root.paged" and isinstance(subscribe["last_seq"], int)
    shot(page, "history-pages")


def test_model_links_show_their_address_on_hover_and_mark_other_sites(site: Site) -> None:
    site.loop.add_replies(
        {"text": "See [the guide](https://docs.example.org/guide?x=1#top), "
                 "[your bank](https://b\u0430nk.example/login) and [mail](mailto:a@b.example)."}
    )  # fmt: skip
    page = site.page(signed_in=True)
    send(page, "links please")
    page.wait_for_selector(".answer a >> text=mail")
    links = page.locator(".answer a")
    got = [
        links.nth(i).evaluate(
            "a => [a.textContent, a.title, a.className, a.dataset.host || null, a.rel, a.target]"
        )
        for i in range(links.count())
    ]
    keep = "noopener noreferrer nofollow"
    bank = "b\u0430nk.example".encode("idna").decode()  # the look-alike as it really is
    assert got == [
        ["the guide", "https://docs.example.org/guide?x=1#top", "external", "docs.example.org",
         keep, "_blank"],
        ["your bank", f"https://{bank}/login", "external", bank, keep, "_blank"],
        ["mail", "mailto:a@b.example", "", None, keep, "_blank"],
    ]  # fmt: skip
    # The mark is shown after the text (CSS), not part of it.
    after = links.first.evaluate("a => getComputedStyle(a, '::after').content")
    assert "docs.example.org" in after and "\u2197" in after
    shot(page, "links")
