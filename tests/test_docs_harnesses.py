"""docs/pages/harnesses.md runs as written: each of its scripts prints what the page shows.

The page sets the spec's calls (asyncio) next to navi_trio's (trio); the trio side of
each is a whole script on `open_harness` (the fake LLM server inside it, on 127.0.0.1,
port 0). Each runs as a real subprocess under an absolute deadline, its data under
tmp_path; nothing sleeps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_examples import example_block, example_names, example_output, run_python

from navi_trio.settings import REPO_ROOT

pytestmark = pytest.mark.slow

PAGE = REPO_ROOT / "docs" / "pages" / "harnesses.md"
DEADLINE = 60
# One per entry point of the spec, and the sub-agent events of a parent's stream.
EXAMPLES = ["run-stream", "run", "stop", "compact-stream", "run-ephemeral", "subagent-events"]


def test_the_page_has_an_example_for_each_call() -> None:
    assert example_names(PAGE) == EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
async def test_each_example_prints_what_the_page_shows(tmp_path: Path, name: str) -> None:
    script = tmp_path / f"{name}.py"
    script.write_text(example_block(PAGE, name, "python"), encoding="utf-8")
    done = await run_python(tmp_path, str(script), deadline=DEADLINE)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == example_output(PAGE, name)
