"""Importing a dependency without the optional modules it would pull in for nothing.

Start-up time is mostly imports (issue 11: `navi run` to the first LLM request). Two
dependencies import heavy optional modules at import time that navi never uses:

- sqlite-utils imports numpy and pandas when they are installed (numpy is, with the
  `local` extra) only to map their scalar types to column types: navi stores no numpy
  values. numpy alone is ~50 ms.
- httpx imports its command-line client (`httpx._main`: click, rich, pygments, ~30 ms)
  to export ``httpx.main``; navi never calls it.

`import_hiding` imports such a module while those names look absent (``None`` in
`sys.modules`, which makes their import raise ImportError, which both libraries catch),
then makes them importable again: llama-cpp-python still gets numpy when the local
backend loads. A hidden module that is already imported is left alone. Meant for import
time (store/__init__.py, llm/__init__.py): another thread importing a hidden module at
that very moment would find it "not installed".
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from types import ModuleType


def import_hiding(name: str, hidden: Iterable[str]) -> ModuleType:
    """Import `name` (once) with the modules in `hidden` absent to it; returns `name`."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    hiding = [h for h in hidden if h not in sys.modules]
    for h in hiding:
        sys.modules[h] = None  # type: ignore[assignment]  # "not installed" to `import`
    try:
        return importlib.import_module(name)
    finally:
        for h in hiding:
            if h in sys.modules and sys.modules[h] is None:
                del sys.modules[h]


SQLITE_UTILS_HIDDEN = ("numpy", "pandas")
HTTPX_HIDDEN = ("httpx._main",)
