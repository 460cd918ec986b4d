"""The runtime leaves start-up's objects out of later garbage collections (gc.freeze).

`gc.freeze` is process-wide, so the check runs in a fresh Python process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # its tests start processes

TIMEOUT = 60
CODE = """
import gc, sys, trio
from pathlib import Path
from navi_trio.testing.harness import open_harness

async def main():
    assert gc.get_freeze_count() == 0
    async with open_harness(Path(sys.argv[1]), scripted=True):
        frozen = gc.get_freeze_count()
    print(frozen)

trio.run(main)
"""


def test_the_first_runtime_freezes_what_start_up_made(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CODE, str(tmp_path)], capture_output=True, text=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # Start-up makes tens of thousands of objects (modules, classes, config).
    assert int(done.stdout.strip()) > 10_000
