"""Importing a dependency without the optional modules it would pull in for nothing.

Start-up time is mostly imports (`navi run` to the first LLM request). httpx imports
its command-line client (`httpx._main`: click, rich, pygments, ~30 ms) to export
``httpx.main``; navi never calls it.

`import_hiding` imports such a module while those names look absent (``None`` in
`sys.modules`, which makes their import raise ImportError, which httpx catches), then
makes them importable again. A hidden module that is already imported is left alone.
Meant for import time (llm/__init__.py): another thread importing a hidden module at
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


HTTPX_HIDDEN = ("httpx._main",)
