"""The suite's `tmp_path` (tests/conftest.py) when the suite runs as root: the folder a
test's tool processes (hooks, MCP servers, commands, all run as the tool user) work in
stays open to that user for the whole test, whatever other pytest runs on the same
machine do meanwhile."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from navi_trio.tools.runas import may, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only a root run drops its tools")


def test_another_pytest_run_starting_leaves_the_folder_open(tmp_path: Path) -> None:
    # What a pytest run that starts as root does first (any run: another helper's, an
    # xdist controller's): it makes its base folder under the default temp root, and so
    # takes the group and other bits off that root's pytest-of-root.
    other = pytest.TempPathFactory(None, 3, "all", trace=lambda *_: None, _ispytest=True)
    other.getbasetemp()
    who = run_as("")
    assert who is not None
    for folder in (tmp_path, *tmp_path.parents):
        assert may(folder.stat(), os.X_OK, who), f"the tool user cannot pass {folder}"
    assert may(tmp_path.stat(), os.W_OK, who)
