"""What `python -m pytest -m "not slow"`, the quick run for everyday work, leaves out.

- A module whose every test is slow (``pytestmark = pytest.mark.slow``, alone or first in
  a list) is not even imported: none of its tests would run, and its imports (mcp,
  playwright, llama.cpp ...) and import-time probes cost the quick run seconds.
- A property test runs a fifth of its examples: of its own count through `examples`, of
  Hypothesis's default (100) through a settings profile that tests/conftest.py loads.
  Every other run, the whole suite that CI runs included, keeps the full counts.

tests/conftest.py decides once, from the mark expression (`is_quick_run`), before any
test module is imported; the property tests read `examples` when they are decorated.
"""

from __future__ import annotations

import re

QUICK_SHARE = 5  # the quick run's examples: one in QUICK_SHARE, at least one
quick = False  # set by tests/conftest.py's pytest_configure for the quick run

# Module level, at the start of a line: `pytestmark = pytest.mark.slow` (a comment may
# follow), or a list whose first mark is slow. A slow mark anywhere else, or a condition
# on it, does not match: such a module is imported as usual and its marks decide.
_WHOLE_SLOW = re.compile(
    rb"^pytestmark = (?:pytest\.mark\.slow[ \t]*(?:#[^\n]*)?$|\[\s*pytest\.mark\.slow\s*[,\]])",
    re.M,
)


def is_quick_run(markexpr: str) -> bool:
    """The mark expression is exactly ``not slow`` (spaces aside)."""
    return " ".join(markexpr.split()) == "not slow"


def whole_module_slow(source: bytes) -> bool:
    """Every test of the module with this source is marked slow by its pytestmark."""
    return _WHOLE_SLOW.search(source) is not None


def examples(n: int) -> int:
    """A property test's example count: `n`, or a fifth of it in the quick run."""
    return max(1, n // QUICK_SHARE) if quick else n
