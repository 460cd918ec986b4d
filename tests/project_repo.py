"""The fixture repository of agents and commands kept as files (tests/fixtures/project-b),
in Claude Code's formats, with a bad file of each kind."""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "project-b"


def repo(tmp_path: Path) -> Path:
    """A copy of the fixture under `tmp_path`: a folder with ``.git``."""
    work = tmp_path / "repo"
    shutil.copytree(FIXTURE, work, symlinks=True)
    (work / ".git").mkdir()
    return work
