"""The import statements of a source file, read once per run.

tests/test_layers.py and tests/test_core_packages.py both check every import in
navi_trio/ (inside functions too); parsing and walking each file once serves both.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path


@cache
def import_nodes(path: Path) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """Every import statement of the file at `path`, in the order ast.walk finds them."""
    tree = ast.parse(path.read_text(), str(path))
    return tuple(n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))
