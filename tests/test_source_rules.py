"""Rules on the package's source text: ruff lays the code out (no `# fmt: skip`), and
docstrings and comments say what and why without citing issue numbers, which live
outside the repository and mean nothing to its reader."""

from __future__ import annotations

import re
from pathlib import Path

import navi_trio

PACKAGE = Path(navi_trio.__file__).parent
ISSUE = re.compile(r"\bissue \d+", re.IGNORECASE)


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in {".py", ".sql"})


def test_the_package_holds_sources_to_check() -> None:
    assert len(_sources()) > 200


def test_no_source_line_keeps_its_own_layout_or_cites_an_issue() -> None:
    found = []
    for path in _sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "fmt: skip" in line or "fmt: off" in line or ISSUE.search(line):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert found == [], "\n".join(found)
