"""The page's usage panel: a chart of tokens by day and model, and the tables, in
Chromium, through a real `navi serve` and the fake LLM (tests/web_browser.py)."""

from __future__ import annotations

import pytest
from web_browser import Site, browser, needs_browser, send, shot, site

pytestmark = [pytest.mark.slow, needs_browser]  # a browser, a daemon
__all__ = ["browser", "site"]


def test_the_usage_panel_draws_the_days_bars_and_the_models_table(site: Site) -> None:
    site.loop.add_replies(
        {"text": "first answer", "prompt_tokens": 400, "completion_tokens": 20},
        {"text": "second answer", "prompt_tokens": 600, "completion_tokens": 30},
    )
    page = site.page(signed_in=True)
    send(page, "one")
    page.wait_for_selector(".lane.main .answer >> text=first answer")
    send(page, "two")
    page.wait_for_selector(".lane.main .answer >> text=second answer")
    page.click("#toggle-usage")
    page.wait_for_selector(".usage-panel .usage-chart rect")
    # This session: today's bar, one model, the sums of what the model reported.
    total = page.locator(".usage-panel .usage-total").inner_text()
    assert "2 runs, 1000 tokens in, 50 out" in total, total
    bars = page.locator(".usage-panel .usage-chart rect")
    assert bars.count() == 1
    assert str(bars.first.locator("title").text_content()).endswith("qwen3:8b: 1050 tokens")
    rows = page.locator(".usage-panel .usage-table tr").all_inner_texts()
    assert rows[1].split("\t")[:5] == ["qwen3:8b", "turn", "2", "1000", "50"], rows
    assert page.locator(".usage-legend .usage-key").all_inner_texts() == ["qwen3:8b"]
    shot(page, "usage-panel")
    # An admin sees "Everyone", with a table by user.
    page.click(".usage-scope >> text=Everyone")
    page.wait_for_selector(".usage-panel h3 >> text=By user")
    by_user = page.locator(".usage-panel .usage-table").nth(1).locator("tr").all_inner_texts()
    assert len(by_user) == 2 and by_user[1].split("\t")[2] == "2", by_user
