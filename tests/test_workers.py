"""The default worker count (tests/workers.py), and what the workers' environment hands
to the terminal clients the tests start."""

from __future__ import annotations

import os
from pathlib import Path

from workers import WORKERS_PER_CPU, auto_workers

HERE = Path(__file__)


def test_one_file_runs_in_this_process_and_more_get_workers() -> None:
    assert auto_workers([str(HERE)], {}, 2) == 0
    assert auto_workers([f"{HERE}::test_x", f"{HERE}::test_y[1]"], {}, 2) == 0
    two_files = [str(HERE), str(HERE.with_name("conftest.py"))]
    assert auto_workers(two_files, {}, 2) == 2 * WORKERS_PER_CPU
    assert auto_workers([str(HERE.parent)], {}, 2) == 2 * WORKERS_PER_CPU  # the whole suite
    assert auto_workers([str(HERE.parent)], {}, 0) == WORKERS_PER_CPU


def test_the_environment_variable_is_left_to_xdist() -> None:
    assert auto_workers([str(HERE.parent)], {"PYTEST_XDIST_AUTO_NUM_WORKERS": "3"}, 2) is None


def test_no_terminal_size_in_the_environment() -> None:
    # A terminal client the tests start in a pseudo-terminal takes COLUMNS and LINES
    # over its terminal's size (rich); an xdist worker starts with COLUMNS=80 LINES=24.
    assert "COLUMNS" not in os.environ and "LINES" not in os.environ
