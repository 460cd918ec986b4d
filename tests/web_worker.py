"""What the browser tests share in one worker process, for all their modules: the
Chromium (`chromium`) and the daemon of the modules with the plain test config
(`web_shared`). Registered in tests/conftest.py, so that each is one fixture: a session
fixture imported into several modules is a separate fixture in each, a second one
started beside the first. tests/web_browser.py, which makes them, is imported only when
a browser test asks for one, not by every run's conftest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from web_browser import Chromium, Shared


@pytest.fixture(scope="session")
def chromium() -> Iterator[Chromium]:
    """The worker's headless Chromium (tests/web_browser.py's `Chromium`: a Playwright
    Browser and its shared context), closed at the session's end."""
    from web_browser import launched

    yield from launched()


@pytest.fixture(scope="session")
def web_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """The daemon and fake LLM that test_web_chat, test_web_daily and test_web_resilience
    share (tests/web_browser.py's `Shared`): started when a test first asks for it, again
    after a test that left a run going. Its frame limit is small (`small_frames`)."""
    from web_browser import sharing, small_frames

    yield from sharing(tmp_path_factory, small_frames)
